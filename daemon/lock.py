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
import tempfile
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
    """The lock file beside the index (its real path: a symlink to an index shares the index's lock)."""
    return Path(os.path.realpath(index_path) + ".lock")


def alias_lock_path(index_path: str | os.PathLike[str]) -> Optional[Path]:
    """A lock named by the index file's device and inode, so that hard links to one index share it too."""
    try:
        st = os.stat(index_path)
    except OSError:
        return None  # no index yet: the first writer creates it under the path lock
    return Path(tempfile.gettempdir()) / f"traceml-{os.getuid()}" / f"index-{st.st_dev}-{st.st_ino}.lock"


#: Alias-lock descriptors held with each writer lock (closed by :func:`release_lock`).
_alias_fds: dict[int, int] = {}
#: Lock files this process holds now (descriptor -> path): see :func:`_take`.
_held: dict[int, str] = {}
#: How long a lock this process released may still be held by a child forked meanwhile (see :func:`_take`).
FORK_GRACE_S = 2.0


def _take(path: Path, index_path: str, data: bytes) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            info = _read_lock_info(path, index_path)
            # Held "by this process" but by none of its descriptors: a child another thread forked while the
            # lock was ours shares it until its exec closes the inherited descriptor (a moment). Wait for that
            # rather than refuse the index to ourselves.
            if info.pid == os.getpid() and str(path) not in _held.values():
                deadline = deadline or time.monotonic() + FORK_GRACE_S
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
            os.close(fd)
            who = f"pid {info.pid}" if info.pid else "another process"
            raise IndexLockedError(
                f"another traceml {info.mode} ({who}) already writes the index {index_path}"
            ) from None
    _held[fd] = str(path)
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    return fd


def release_lock(fd: int) -> None:
    """Release a writer lock taken by :func:`acquire_lock` (and its alias lock)."""
    alias = _alias_fds.pop(fd, None)
    if alias is not None:
        _held.pop(alias, None)
        os.close(alias)
    _held.pop(fd, None)
    os.close(fd)


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

    Two locks: one beside the index's real path (symlinked aliases share it, and
    ``find_running_daemon`` reads who holds it), one named by the index file's
    device and inode (hard-linked aliases share that). Returns the first lock's
    descriptor; :func:`release_lock` releases both.
    """
    data = json.dumps({"pid": os.getpid(), "roots": roots, "index": str(index_path), "mode": mode,
                       "started": time.time()}).encode()
    fd = _take(lock_path(index_path), str(index_path), data)
    alias = alias_lock_path(index_path)
    if alias is not None:
        try:
            _alias_fds[fd] = _take(alias, str(index_path), data)
        except BaseException:
            _held.pop(fd, None)
            os.close(fd)
            raise
    return fd
