"""Complete lines of a JSONL file, and the records they hold: the one rule every file-side reader uses.

A writer appends whole lines (``os.write`` on an ``O_APPEND`` descriptor), but a reader may look while a
line is half written, or read only the tail of a file. The rule (DESIGN, "Run directory"; docs/daemon.md
rule 4): **only complete lines count** — bytes after the last newline are not a line yet; a tail that
starts mid-file drops its first piece (it may be the end of a line whose start was not read); a blank line
is no line; a line that does not decode is skipped by the file-side readers (the daemon, which reads the
same bytes, stores it as an error row).

* :func:`complete_lines` — the lines of a buffer (the fast path: one ``split`` of the complete prefix);
* :func:`stream_lines` — the same lines read from an open file in bounded chunks (memory bounded by the
  chunk and the longest line, never the file); proven equal to :func:`complete_lines` of the whole file;
* :func:`read_lines` / :func:`read_tail_lines` — a file (or its last bytes) by path, unreadable → no lines;
* :func:`iter_records` — decoded records of lines, malformed ones skipped, optionally only some kinds.

The daemon's stream (``daemon/tailer.py``, ``daemon/service.py``) keeps its own cursor-based reader: it
reads from a committed offset and must account for every byte (error rows, NUL hold-back), so it stores
what this module skips.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Optional, Union

from traceml_tui.core import records

#: Bytes read per ``read`` call by :func:`stream_lines`.
CHUNK_BYTES = 1 << 20


def complete_end(data: bytes) -> int:
    """The length of ``data``'s complete prefix: up to and including its last newline (0 without one)."""
    return data.rfind(b"\n") + 1


def complete_lines(data: bytes, *, partial_head: bool = False) -> list[bytes]:
    """The complete, non-blank lines of ``data``, without their newlines, in order.

    Bytes after the last newline are left out (a line still being written). ``partial_head``: ``data``
    starts somewhere inside a file (a tail), so its first piece, up to the first newline, is left out too.
    """
    end = complete_end(data)
    if end == 0:
        return []
    start = data.find(b"\n") + 1 if partial_head else 0
    if start >= end:
        return []
    return [line for line in data[start:end - 1].split(b"\n") if line.strip()]


def stream_lines(handle: BinaryIO, *, chunk_bytes: int = CHUNK_BYTES, partial_head: bool = False) -> Iterator[bytes]:
    """The lines :func:`complete_lines` finds in everything ``handle`` has left, read ``chunk_bytes`` at a time.

    Only the unfinished end of one chunk is carried into the next, so a large file is never held whole.
    """
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be at least 1")
    carry = b""
    skip_head = partial_head
    while True:
        chunk = handle.read(chunk_bytes)
        if not chunk:
            return  # what is left in carry has no newline: not a line yet
        data = carry + chunk
        end = complete_end(data)
        if end == 0:
            carry = data
            continue
        start = 0
        if skip_head:
            start = data.find(b"\n") + 1
            skip_head = False
        for line in data[start:end - 1].split(b"\n") if start < end else ():
            if line.strip():
                yield line
        carry = data[end:]


def read_lines(path: Union[str, os.PathLike[str]]) -> list[bytes]:
    """The complete lines of the file at ``path``; none when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return list(stream_lines(handle))
    except OSError:
        return []


def read_tail(path: Union[str, os.PathLike[str]], limit: int) -> tuple[bytes, bool]:
    """The last ``limit`` bytes of the file at ``path`` and whether they are the whole file (``b"", True``
    when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - limit)
            handle.seek(start)
            return handle.read(size - start), start == 0
    except OSError:
        return b"", True


def read_tail_lines(path: Union[str, os.PathLike[str]], limit: int) -> list[bytes]:
    """The complete lines among the last ``limit`` bytes of a file (a cut first line left out)."""
    data, whole = read_tail(path, limit)
    return complete_lines(data, partial_head=not whole)


def iter_records(lines: Iterable[bytes], kinds: Optional[tuple[type, ...]] = None) -> Iterator[records.Record]:
    """The records :func:`traceml_tui.core.records.decode` reads from ``lines``, in order; a line that does not
    decode (malformed, over the line limit, nested too deeply) is skipped. ``kinds``: only records of these
    classes (e.g. ``(records.Step, records.RankEnd)``)."""
    for line in lines:
        try:
            record = records.decode(line)
        except (records.RecordError, RecursionError):  # RecursionError: a lowered interpreter recursion limit
            continue
        if kinds is None or isinstance(record, kinds):
            yield record


def file_records(path: Union[str, os.PathLike[str], Path], kinds: Optional[tuple[type, ...]] = None
                 ) -> Iterator[records.Record]:
    """The decoded records of the complete lines of the file at ``path`` (streamed; none when unreadable)."""
    try:
        handle = open(path, "rb")
    except OSError:
        return
    with handle:
        try:
            yield from iter_records(stream_lines(handle), kinds)
        except OSError:
            return


__all__ = ["CHUNK_BYTES", "complete_end", "complete_lines", "file_records", "iter_records", "read_lines",
           "read_tail", "read_tail_lines", "stream_lines"]
