"""Publishing a checkpoint *folder* (Hugging Face's ``checkpoint-N/``): a write-once copy, files read-only.

The rules (docs/hygiene.md, "Folder checkpoints"; docs/security.md):

* Only regular files and folders are copied. A symbolic link anywhere inside
  the folder, or a FIFO, socket or device, is refused with one clear error
  naming it, before anything is written: following a link could pull a file
  from outside the checkpoint (a key, a credentials file) into the run
  directory and its provenance, and copying the link itself would publish a
  checkpoint whose content can still change. The folder the script names may
  itself be a link (the script chose it), as a published file may.
* A folder with no file at any depth is refused: there is nothing to validate.
* The copy is built in a hidden temp folder beside the target (each file
  fsynced, then made read-only), then renamed into place. The rename fails
  when a published folder already holds the id (published folders are never
  empty), so a published checkpoint is never replaced: the caller picks the
  next id. Folders stay writable by their owner, so a run directory can still
  be deleted with ``rm -r``.
* The copy walks the source one folder at a time relative to its parent's
  descriptor and opens every file with ``O_NOFOLLOW``, checking it with
  ``fstat``: an entry swapped for a link between the check and the copy is
  refused too, and the partial copy removed.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from traceml_tui.core.atomic import fsync_dir

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class Tree:
    """A checkpoint folder that passed the checks: its path, the name the script gave it, its file count."""

    root: Path
    shown: str
    files: int


def _refuse_link(shown: str, where: str) -> ValueError:
    return ValueError(f"publish_checkpoint: {shown}/{where} is a symbolic link: a checkpoint folder is published "
                      "with its own regular files only (copy what it points to into the folder)")


def _refuse_special(shown: str, where: str) -> ValueError:
    return ValueError(f"publish_checkpoint: {shown}/{where} is not a regular file or a folder")


def _entries(dir_fd: int, rel: str, shown: str) -> list[tuple[str, bool]]:
    """(name, is_folder) of one folder's entries, by name; a link or special file is refused."""
    with os.scandir(dir_fd) as it:
        found = sorted(it, key=lambda e: e.name)
    out = []
    for entry in found:
        where = f"{rel}/{entry.name}" if rel else entry.name
        if entry.is_symlink():
            raise _refuse_link(shown, where)
        if entry.is_dir(follow_symlinks=False):
            out.append((entry.name, True))
        elif entry.is_file(follow_symlinks=False):
            out.append((entry.name, False))
        else:
            raise _refuse_special(shown, where)
    return out


def _open_at(name: str, dir_fd: int, flags: int, shown: str, where: str) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):  # swapped for a link since it was listed
            raise _refuse_link(shown, where) from None
        raise


def _walk(dir_fd: int, rel: str, shown: str, on_dir: Callable[[str], None],
          on_file: Callable[[int, str], None]) -> int:
    """Visit every folder and regular file below ``dir_fd`` (depth first, by name); returns the file count."""
    count = 0
    for name, is_dir in _entries(dir_fd, rel, shown):
        where = f"{rel}/{name}" if rel else name
        if is_dir:
            sub = _open_at(name, dir_fd, _DIR_FLAGS, shown, where)
            try:
                on_dir(where)
                count += _walk(sub, where, shown, on_dir, on_file)
            finally:
                os.close(sub)
        else:
            fd = _open_at(name, dir_fd, _FILE_FLAGS, shown, where)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise _refuse_special(shown, where)
                on_file(fd, where)
            finally:
                os.close(fd)
            count += 1
    return count


def _walk_root(root: Path, shown: str, on_dir: Callable[[str], None], on_file: Callable[[int, str], None]) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        return _walk(fd, "", shown, on_dir, on_file)
    finally:
        os.close(fd)


def scan(root: Path, shown: str) -> Tree:
    """Check a checkpoint folder before anything is written; ``ValueError`` (one sentence) when it cannot be published."""
    files = _walk_root(root, shown, lambda _where: None, lambda _fd, _where: None)
    if not files:
        raise ValueError(f"publish_checkpoint: the checkpoint folder has no files: {shown}")
    return Tree(root=root, shown=shown, files=files)


def copy_once(tree: Tree, target: Path) -> None:
    """Copy ``tree`` to ``target`` once: files read-only, the folder renamed into place.

    Raises ``FileExistsError`` when ``target`` is already published (the caller takes the next id) and
    ``ValueError`` when the source changed into something :func:`scan` refuses; nothing is left behind then.
    """
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp: Optional[Path] = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp's 0o700 would hide the checkpoint from a worker run by another user
        made = [tmp]

        def on_dir(where: str) -> None:
            path = tmp / where
            path.mkdir()
            made.append(path)

        def on_file(src_fd: int, where: str) -> None:
            dst = tmp / where
            with os.fdopen(os.dup(src_fd), "rb") as src, open(dst, "xb") as out:
                shutil.copyfileobj(src, out, _COPY_CHUNK)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(dst, 0o444)

        copied = _walk_root(tree.root, tree.shown, on_dir, on_file)
        if not copied:
            raise ValueError(f"publish_checkpoint: the checkpoint folder has no files: {tree.shown}")
        for path in reversed(made):
            fsync_dir(path)
        if os.path.lexists(target):
            raise FileExistsError(str(target))
        try:
            os.rename(tmp, target)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(str(target)) from None
            raise
        tmp = None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(parent)
