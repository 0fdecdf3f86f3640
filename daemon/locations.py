"""Where the index lives, and refusing network filesystems (docs/daemon.md rule 6).

SQLite's locking and WAL shared memory are unreliable on network
filesystems, and the index is a per-machine cache anyway: it must live on a
local disk. The mount table is read from ``/proc/mounts`` (injectable for
tests through ``mounts_path`` or ``TRACEML_MOUNTS_FILE``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

#: Filesystem types that are shared over a network (prefix ``smb`` covers smb2/smb3/smbfs).
NETWORK_FS_TYPES = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "cifs", "fuse.sshfs", "sshfs", "beegfs", "ceph",
        "fuse.ceph", "fuse.cephfs", "glusterfs", "fuse.glusterfs", "afs", "ncpfs", "9p",
        "fuse.gcsfuse", "fuse.s3fs", "fuse.rclone", "orangefs", "pvfs2", "panfs", "wekafs",
    }
)
NETWORK_FS_PREFIXES = ("smb", "nfs")

MOUNTS_ENV = "TRACEML_MOUNTS_FILE"


class NetworkFilesystemError(RuntimeError):
    """The index path is on a network filesystem."""


def default_index_path() -> Path:
    """``$XDG_STATE_HOME/traceml/index.sqlite`` (fallback ``~/.local/state``)."""
    state = os.environ.get("XDG_STATE_HOME") or ""
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "traceml" / "index.sqlite"


def _unescape_mount(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def read_mounts(mounts_path: Optional[str] = None) -> list[tuple[str, str]]:
    """Return ``(mount point, fs type)`` pairs from the mount table (empty when unreadable)."""
    path = mounts_path or os.environ.get(MOUNTS_ENV) or "/proc/mounts"
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return []
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            mounts.append((_unescape_mount(parts[1]), parts[2]))
    return mounts


def filesystem_type(path: str | os.PathLike[str], mounts: list[tuple[str, str]]) -> Optional[str]:
    """Filesystem type of ``path`` by longest-prefix match of its real path over ``mounts``."""
    target = Path(os.path.realpath(path))
    best: tuple[int, Optional[str]] = (-1, None)
    for point, fstype in mounts:
        mount = Path(point)
        if target == mount or mount in target.parents:
            depth = len(mount.parts)
            # Later entries over the same mount point shadow earlier ones.
            if depth >= best[0]:
                best = (depth, fstype)
    return best[1]


def is_network_fs(fstype: Optional[str]) -> bool:
    """True for filesystem types shared over a network."""
    if not fstype:
        return False
    fstype = fstype.lower()
    return fstype in NETWORK_FS_TYPES or fstype.startswith(NETWORK_FS_PREFIXES)


def check_local(index_path: str | os.PathLike[str], mounts_path: Optional[str] = None) -> None:
    """Raise :class:`NetworkFilesystemError` when the index would live on a network filesystem."""
    fstype = filesystem_type(Path(index_path).parent, read_mounts(mounts_path))
    if is_network_fs(fstype):
        raise NetworkFilesystemError(
            f"index path {index_path} is on a network filesystem ({fstype}); "
            "put the index on a local disk with --index PATH"
        )
