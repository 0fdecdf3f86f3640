"""Read a run's training logs for the Log screen: bounded, incremental, merged, labelled (no Textual).

:class:`LogTail` remembers how far it read each node's ``training.stdout.log``
and ``training.stderr.log``; every :meth:`LogTail.read` returns the complete
lines written since, merged across files by the time stamp a line starts with
(ISO ``2026-11-30 13:35:43`` or torch's ``W1130 13:35:43.763``; a line without
one keeps the time of the line before it in its file, and files without any
keep their order: node by node, stdout before stderr). Each line carries its
node, its stream and the rank ``traceml run`` tagged it with (``[rank1]:`` on
every line a rank wrote, ``traceml_tui/run/rank_logs.py``; read by
:func:`traceml_tui.core.forensics.rank_of_line`; torchrun's own lines name
none), and whether it is an error line (:func:`traceml_tui.core.forensics.error_lines`).

Bounded: the first read of a file takes at most its last ``max_bytes``; a file
that grew by more than that between two reads skips to its newest ``max_bytes``
(the skipped bytes are counted, not read). Files are opened read-only under
the run directory without following links (:func:`traceml_tui.core.rundir.open_under`).
This is the only place ``traceml watch`` reads a run's files itself (docs/watch.md).
"""

from __future__ import annotations

import calendar
import heapq
import math
import os
import re
import stat
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from traceml_tui.core import forensics
from traceml_tui.core.rundir import open_under

#: The most bytes read from one file at once: its tail on the first read, its newest part after a burst.
MAX_TAIL_BYTES = 4 * 2**20
#: A line longer than this is cut (a runaway progress bar must not make one giant line).
MAX_LINE_CHARS = 4000

_ISO = re.compile(r"^\[?(\d{4})-(\d{2})-(\d{2})[ T_](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?")
_GLOG = re.compile(r"^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?")
# Terminal control sequences (colours, cursor moves) and other control characters except tab.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class LogLine:
    """One line of a node's training log, without its ``[rankN]:`` prefix."""

    node: int
    stream: str  # "stdout" | "stderr"
    rank: Optional[int]  # None: not a rank's line (the launcher's own, or unprefixed output)
    text: str
    ts: Optional[float] = None  # the line's time stamp, or the one before it in its file
    error: bool = False  # a traceback's first line or its exception line


def line_time(text: str, year: int) -> Optional[float]:
    """Seconds (UTC calendar, for ordering only) of the time stamp ``text`` starts with, else None.

    A glog stamp (``W1130 13:35:43.763``) has no year: ``year`` is assumed.
    """
    match = _ISO.match(text)
    if match:
        y, mo, d, h, mi, s, frac = match.groups()
    else:
        match = _GLOG.match(text)
        if not match:
            return None
        mo, d, h, mi, s, frac = match.groups()
        y = str(year)
    try:
        whole = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    return whole + (float("0." + frac) if frac else 0.0)


def clean(text: str) -> str:
    """A log line as a terminal would leave it: after its last carriage return, without control sequences."""
    if "\r" in text:
        text = text.rstrip("\r").rsplit("\r", 1)[-1]
    text = _CONTROL.sub("", text).expandtabs(4)
    return text if len(text) <= MAX_LINE_CHARS else text[: MAX_LINE_CHARS - 1] + "…"


@dataclass
class _File:
    node: int
    stream: str
    rel: str
    offset: Optional[int] = None  # bytes consumed so far (None: not read yet)
    pending: bytes = b""  # an incomplete last line, kept until its newline arrives
    last_ts: Optional[float] = None
    inside: dict = field(default_factory=dict)  # per-rank traceback state (forensics.error_lines)


class LogTail:
    """The new lines of a run's training logs on each :meth:`read` (runs on a worker thread, never the UI)."""

    def __init__(self, run_dir: str | os.PathLike[str], files: Sequence[tuple[int, str, str]], *,
                 single_rank: Optional[int] = None, max_bytes: int = MAX_TAIL_BYTES) -> None:
        self.run_dir = os.fspath(run_dir)
        self.files = [_File(node, stream, rel) for node, stream, rel in files]
        self.single_rank = single_rank
        self.max_bytes = max_bytes
        self.skipped_bytes = 0  # bytes never read: before the first tail, or jumped over after a burst
        self.year = time.gmtime().tm_year

    def read(self) -> list[LogLine]:
        """Complete lines written since the last call, merged by time (each file's own order kept)."""
        batches = [self._lines(f) for f in self.files]
        batches = [b for b in batches if b]
        if len(batches) == 1:
            return batches[0]
        return list(heapq.merge(*batches, key=lambda line: -math.inf if line.ts is None else line.ts))

    def _lines(self, f: _File) -> list[LogLine]:
        data, cut = self._new_bytes(f)
        if not data:
            return []
        if cut:  # started mid-file: the first line is a part of one
            data = data.partition(b"\n")[2]
            f.pending = b""
        raw = (f.pending + data).split(b"\n")
        f.pending = raw.pop()
        if len(f.pending) > self.max_bytes:  # a "line" with no end in sight: show what there is
            raw.append(f.pending)
            f.pending = b""
        parsed = []
        for chunk in raw:
            rank, text = forensics.rank_of_line(clean(chunk.decode("utf-8", errors="replace")))
            if rank is None and self.single_rank is not None:
                rank = self.single_rank
            ts = line_time(text, self.year)
            if ts is not None:
                f.last_ts = ts
            parsed.append((rank, text, f.last_ts))
        errors = set(forensics.error_lines([(r, t) for r, t, _ in parsed], f.inside))
        return [LogLine(f.node, f.stream, r, t, ts, i in errors) for i, (r, t, ts) in enumerate(parsed)]

    def _new_bytes(self, f: _File) -> tuple[bytes, bool]:
        """The bytes appended to ``f`` since the last read (bounded) and whether they start mid-line."""
        try:
            fd = open_under(self.run_dir, os.path.join(self.run_dir, f.rel))
        except OSError:
            return b"", False  # not there (yet), or a link: nothing to show
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return b"", False
            size = st.st_size
            cut = False
            if f.offset is None or size < f.offset:  # first read, or truncated and rewritten
                start = max(0, size - self.max_bytes)
                self.skipped_bytes += start
                f.pending, cut = b"", start > 0
            else:
                start = f.offset
                if size - start > self.max_bytes:
                    self.skipped_bytes += size - self.max_bytes - start
                    start, cut = size - self.max_bytes, True
            if size <= start:
                f.offset = start
                return b"", False
            os.lseek(fd, start, os.SEEK_SET)
            parts, want = [], size - start
            while want > 0:
                chunk = os.read(fd, min(want, 1 << 20))
                if not chunk:
                    break
                parts.append(chunk)
                want -= len(chunk)
            data = b"".join(parts)
            f.offset = start + len(data)
            return data, cut
        finally:
            os.close(fd)
