"""Reading a small file a run folder holds, refusing anything but a regular file (docs/security.md).

A FIFO planted where a side file belongs blocks a plain ``open`` until a writer appears, and a link to
``/dev/zero`` never ends a plain read: the file is opened without blocking, its type checked on the open
descriptor, and at most ``max_bytes`` read.
"""

from __future__ import annotations

import errno
import os
import stat


def read_regular(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``; ``OSError`` when it cannot be read, is not a regular file
    (``EINVAL``) or holds more than ``max_bytes`` (``EFBIG``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        chunks, size = [], 0
        while size <= max_bytes:  # a file that grew after the open is still caught
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", os.fspath(path))
        return b"".join(chunks)
    finally:
        os.close(fd)
