"""The index's single writer: an exclusive ``flock`` on ``<index>.lock`` (docs/daemon.md rule 6).

The lock file's content (pid, roots, index, mode, start time) lets
:func:`find_running_daemon` tell others who holds it: ``traceml watch`` shows
a running daemon's index rather than embedding a second writer.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


class IndexLockedError(RuntimeError):
    """Another writer holds the index."""


@dataclass(frozen=True)
class DaemonInfo:
    """Who holds an index's writer lock."""

    pid: Optional[int]
    roots: tuple[str, ...]
    index: str
    mode: str
    started: Optional[float]


def lock_path(index_path: str | os.PathLike[str]) -> Path:
    """The lock file beside the index."""
    return Path(str(index_path) + ".lock")


def _read_lock_info(path: Path, index_path: str) -> DaemonInfo:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    roots = data.get("roots") if isinstance(data.get("roots"), list) else []
    pid = data.get("pid")
    return DaemonInfo(pid if isinstance(pid, int) else None, tuple(str(r) for r in roots), str(index_path),
                      str(data.get("mode") or "daemon"), data.get("started"))


def find_running_daemon(index_path: str | os.PathLike[str]) -> Optional[DaemonInfo]:
    """Return who holds the index's writer lock, or None when no writer runs."""
    path = lock_path(index_path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return _read_lock_info(path, str(index_path))
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def acquire_lock(index_path: str | os.PathLike[str], roots: list[str], mode: str = "daemon") -> int:
    """Take the exclusive writer lock; raise :class:`IndexLockedError` naming the holder.

    Returns the lock's file descriptor: closing it releases the lock.
    """
    path = lock_path(index_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            info = _read_lock_info(path, str(index_path))
            who = f"pid {info.pid}" if info.pid else "another process"
            raise IndexLockedError(
                f"another traceml {info.mode} ({who}) already writes the index {index_path}"
            ) from None
        raise
    data = json.dumps({"pid": os.getpid(), "roots": roots, "index": str(index_path), "mode": mode,
                       "started": time.time()}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    return fd
