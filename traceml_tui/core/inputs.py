"""Input identities of a run: a relative name and a content digest (docs/run.md, "Provenance bundle").

The launcher identifies the training script and the files its config names
(``provenance/inputs.json``); ``traceml.declare_input(path)`` appends one line
per declared input to ``provenance/declared_inputs.jsonl``. Both name an input
relative to the repository holding the launch directory (else relative to the
launch directory) and never by an absolute path: an input outside that base is
named by its file name alone, with ``"outside": true`` (its digest still
identifies it).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Optional

from traceml_tui.core import atomic, jsonl

_CHUNK = 1 << 20
#: The fields of one declared-input line (besides those of :func:`identity`).
DECLARED_FIELDS = ("rank", "attempt", "ts")


def find_repo_root(start: os.PathLike[str] | str) -> Optional[Path]:
    """The nearest folder at or above ``start`` holding a ``.git`` entry (a folder, or a file: worktrees), else None."""
    probe = Path(os.path.abspath(start))
    for folder in (probe, *probe.parents):
        if os.path.lexists(folder / ".git"):
            return folder
    return None


def identity_base(cwd: os.PathLike[str] | str) -> Path:
    """What input names are relative to: the repository holding ``cwd``, else ``cwd`` itself."""
    return find_repo_root(cwd) or Path(os.path.abspath(cwd))


def relative_name(path: os.PathLike[str] | str, base: os.PathLike[str] | str) -> tuple[str, bool]:
    """``(name, inside)``: ``path`` relative to ``base`` (POSIX form), or its bare name and False when outside."""
    full = os.path.abspath(path)
    rel = os.path.relpath(full, os.path.abspath(base))
    if rel == os.curdir or rel.startswith(os.pardir + os.sep) or rel == os.pardir or os.path.isabs(rel):
        return os.path.basename(full) or full.strip(os.sep), rel == os.curdir
    return Path(rel).as_posix(), True


def file_digest(path: os.PathLike[str] | str) -> tuple[str, int]:
    """``(sha256 hex, size)`` of one regular file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def dir_digest(path: os.PathLike[str] | str) -> tuple[str, int, int]:
    """``(sha256 hex, total size, file count)`` of a folder's regular files (links are not followed).

    The digest is the SHA-256 of ``sha256sum``-style lines (``<sha256>  <relative path>``),
    one per file in path order, so a renamed, added or changed file changes it.
    """
    root = os.path.abspath(path)
    files: list[str] = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in names:
            full = os.path.join(folder, name)
            if stat.S_ISREG(os.lstat(full).st_mode):
                files.append(full)
    listing = hashlib.sha256()
    total = 0
    for full in sorted(files, key=lambda f: Path(os.path.relpath(f, root)).as_posix()):
        sha, size = file_digest(full)
        total += size
        listing.update(f"{sha}  {Path(os.path.relpath(full, root)).as_posix()}\n".encode("utf-8", "surrogateescape"))
    return listing.hexdigest(), total, len(files)


def identity(path: os.PathLike[str] | str, base: os.PathLike[str] | str) -> dict:
    """The identity of one input: ``{path, kind, sha256, size[, files][, outside]}``.

    ``path`` relative names are taken from the current folder. A regular file
    or a folder (its regular files, see :func:`dir_digest`); anything else
    raises ``ValueError``, a missing or unreadable input ``OSError``.
    """
    st = os.stat(path)
    name, inside = relative_name(path, base)
    if stat.S_ISREG(st.st_mode):
        sha, size = file_digest(path)
        out: dict = {"path": name, "kind": "file", "sha256": sha, "size": size}
    elif stat.S_ISDIR(st.st_mode):
        sha, size, count = dir_digest(path)
        out = {"path": name, "kind": "directory", "sha256": sha, "size": size, "files": count}
    else:
        raise ValueError(f"input {name!r} is neither a regular file nor a folder")
    if not inside:
        out["outside"] = True
    return out


def declare(log_path: os.PathLike[str] | str, entry: dict) -> bool:
    """Append ``entry`` (an :func:`identity` plus ``rank``, ``attempt``, ``ts``) as one JSONL line.

    Nothing is appended when the same rank already declared the same input with
    the same digest (a resumed attempt declaring its unchanged inputs leaves the
    file as it was); returns whether a line was appended. Unreadable lines of
    the existing file are ignored.
    """
    key = (entry.get("rank"), entry.get("path"), entry.get("sha256"))
    for line in jsonl.read_lines(log_path):  # complete lines only: a half-written one is no declaration
        try:
            old = json.loads(line)
        except ValueError:
            continue
        if isinstance(old, dict) and (old.get("rank"), old.get("path"), old.get("sha256")) == key:
            return False
    line = (json.dumps(entry, allow_nan=False, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
    fd = atomic.open_append(log_path)
    try:
        atomic.append_line(fd, line)
    finally:
        os.close(fd)
    return True
