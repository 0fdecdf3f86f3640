"""Atomic file writes and whole-line appends (docs/run.md, "Run directory").

Side files (manifest, outcomes, summaries, receipts, PNGs) are replaced
atomically: a reader sees the old file or the new one, never a partial one.
JSONL streams are appended with one ``os.write`` per line on an ``O_APPEND``
descriptor so that a crash leaves only whole lines behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once at import, while the process is still single-threaded


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename inside it survives a crash (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, exclusive: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (temp file, fsync, replace, fsync dir).

    With ``exclusive=True`` the final step is a hard link that fails with
    ``FileExistsError`` when ``path`` already exists, so an existing file is
    never overwritten (used for manifests of guarded runs).
    """
    atomic_write_with(path, lambda handle: handle.write(data), exclusive=exclusive)


def atomic_write_with(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object], *,
                      exclusive: bool = False) -> None:
    """:func:`atomic_write_bytes` for a writer that streams into a binary handle (``torch.save(obj, handle)``)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp creates 0600; side files are read by other nodes' launchers and the daemon
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        if exclusive:
            os.link(tmp, target)
            os.unlink(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(target.parent)


def dumps_json(obj: Any) -> bytes:
    """Canonical, human-readable JSON for side files (finite numbers only)."""
    return (json.dumps(obj, indent=2, sort_keys=False, allow_nan=False, ensure_ascii=False) + "\n").encode("utf-8")


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, exclusive: bool = False) -> None:
    """Serialize ``obj`` as JSON and write it atomically."""
    atomic_write_bytes(path, dumps_json(obj), exclusive=exclusive)


def append_line(fd: int, line: bytes) -> None:
    """Append one whole line with ``os.write``, looping on short writes."""
    view = memoryview(line)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def open_append(path: str | os.PathLike[str]) -> int:
    """Open ``path`` for appending whole lines (created 0o644 when missing)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
