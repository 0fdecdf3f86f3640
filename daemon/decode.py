"""Decoding: blocks of complete lines in, typed records and step rows out (pure — no I/O, no SQL).

The stream (``daemon/stream.py``) returns blocks of complete lines with the offset each starts at; the
service hands them here and routes what comes back through the store. Everything is a function of the
bytes alone, so a block can be decoded in another process (the cold path's decode worker,
``daemon/cold.py``) and the live path can decode a pass's small appends together (:func:`prepare_blocks`).
Each bad line becomes one ``(offset, length, message)`` error (docs/daemon.md, "Damaged input").
"""

from __future__ import annotations

import operator
from typing import NamedTuple, Optional

import msgspec
import numpy as np

from traceml_tui.core import records

from . import blockcheck, live

MAX_LINE = records.MAX_LINE_BYTES

# Lean decoders: accept and reject exactly the lines the full Record union does (same fields and
# types), but a step record becomes a ``records.LeanStep`` that the garbage collector never tracks.
_list_decoder = msgspec.json.Decoder(list[records.LeanRecord])
_line_decoder = msgspec.json.Decoder(records.LeanRecord)


class Parsed:
    """Records decoded from a block of complete lines; ``offsets`` are computed on first use.

    Step records are ``records.LeanStep``; every other kind is its full ``records`` type.
    """

    __slots__ = ("records", "errors", "_offsets", "_block", "_base")

    def __init__(self, recs: list, offsets: Optional[list], errors: list, block: Optional[bytes] = None,
                 base: int = 0) -> None:
        self.records = recs  # typed records in file order
        self.errors = errors  # (offset, length, message) for each rejected line
        self._offsets = offsets
        self._block = block  # fast path: one record per line of this block
        self._base = base

    @property
    def offsets(self) -> list:
        """Byte offset of each record's line (same order as ``records``)."""
        if self._offsets is None:
            self._offsets = self.offsets_of(range(len(self.records)))
            self._block = None
        return self._offsets

    def offsets_of(self, indices) -> list:
        """Byte offsets of the lines of ``records[i]`` for ascending ``indices`` (cheap for a few early ones)."""
        if self._offsets is not None:
            return [self._offsets[i] for i in indices]
        block, base = self._block, self._base
        indices = list(indices)
        if not indices:
            return []
        if indices[-1] < 256:
            out, pos, line = [], 0, 0
            for i in indices:
                while line < i:
                    pos = block.index(b"\n", pos) + 1
                    line += 1
                out.append(base + pos)
            return out
        starts = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
        starts += base + 1
        return [base if i == 0 else int(starts[i - 1]) for i in indices]


def _lines_within_limit(block: bytes) -> bool:
    """True when no line of ``block`` (complete lines) is longer than MAX_LINE bytes, without splitting it."""
    end = len(block)
    pos = 0
    while end - pos > MAX_LINE + 1:
        nl = block.rfind(b"\n", pos, pos + MAX_LINE + 1)
        if nl < 0:
            return False
        pos = nl + 1
    return True


def parse_block(block: bytes, base: int) -> Parsed:
    """Decode a block of complete lines (``block`` ends with ``\\n``) that starts at byte ``base``.

    Fast path: the whole block is decoded as one JSON array with msgspec (the
    newlines become commas; no per-line Python work), trusted only when
    :mod:`daemon.blockcheck` proves it equal to line-by-line decoding. Any
    problem (bad JSON, bad UTF-8, a non-object, an over-long line, a blank
    line, two records on a line, a torn one) falls back to line-by-line
    decoding, where each bad line becomes one error.
    """
    # Vectorised newline count (bytes.count walks byte by byte; this is several times faster on 4 MiB).
    count = int(np.count_nonzero(np.frombuffer(block, np.uint8) == 10)) if len(block) > 65536 else block.count(b"\n")
    if not count:
        return Parsed([], [], [])
    if block.isascii():
        utf8_ok = True
    else:
        try:
            block.decode("utf-8")
            utf8_ok = True
        except UnicodeDecodeError:
            utf8_ok = False
    if utf8_ok and _lines_within_limit(block):
        try:
            recs = _list_decoder.decode(b"[" + block[:-1].replace(b"\n", b",") + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            recs = None  # RecursionError: a line nested thousands deep; line by line it is one error row
        # One record per line, each within its own line (a torn line and a merged one can give the count
        # back), and the slow path's 64-bit rule: else line by line, where each bad line is one error row.
        if (recs is not None and len(recs) == count and blockcheck.one_record_per_line(block)
                and blockcheck.ints_fit(recs)):
            return Parsed(recs, None, [], block, base)
    return _parse_slow(block[:-1].split(b"\n"), base)


def decode_line(line: bytes):
    """One line as a lean record; :class:`records.RecordError` exactly as ``records.decode`` raises it."""
    if len(line) > MAX_LINE:
        raise records.RecordError(f"line of {len(line)} bytes exceeds the {MAX_LINE}-byte limit")
    try:
        rec = _line_decoder.decode(line)
    except msgspec.ValidationError as exc:
        raise records.RecordError(f"invalid record: {exc}") from None
    except msgspec.DecodeError as exc:
        raise records.RecordError(f"malformed JSON: {exc}") from None
    except RecursionError:  # as records.decode says it
        raise records.RecordError("JSON nested too deeply") from None
    field = blockcheck.int_out_of_range(rec)
    if field is not None:
        raise records.RecordError(f"invalid record: `{field}` is outside the 64-bit integer range the index stores")
    return rec


def _parse_slow(lines: list[bytes], base: int) -> Parsed:
    recs, offsets, errors = [], [], []
    offset = base
    for line in lines:
        length = len(line)
        stripped = line.rstrip(b"\r")
        if not stripped.strip():
            pass  # a blank line carries nothing; not worth an error row
        elif length > MAX_LINE:
            errors.append((offset, length, f"line of {length} bytes exceeds the {MAX_LINE}-byte limit; skipped"))
        else:
            try:
                stripped.decode("utf-8")
            except UnicodeDecodeError as exc:
                errors.append((offset, length, f"invalid UTF-8 at byte {exc.start} of the line"))
            else:
                try:
                    recs.append(decode_line(stripped))
                    offsets.append(offset)
                except records.RecordError as exc:
                    errors.append((offset, length, str(exc)))
        offset += length + 1
    return Parsed(recs, offsets, errors)


#: Records scanned at the end of a rank's group for its newest component ratios.
WINDOW_TAIL = 8
_rank_of = operator.attrgetter("rank")
_attempt_of = operator.attrgetter("attempt")


class Prepared(NamedTuple):
    """A block decoded and turned into rows: what the writer needs, nothing it must compute.

    ``others`` are the records that are not steps with their line's offset; ``groups`` maps each
    (rank, attempt) to its step rows, component ratios (:func:`live.step_rows`) and newest ratios with their
    step (:func:`live.latest_ratios`).
    Plain tuples and msgspec structs: it crosses a process boundary by pickle.
    """

    errors: list
    others: list
    groups: dict


def prepare_block(block: bytes, base: int) -> Prepared:
    """:func:`parse_block`, then the step rows of each (rank, attempt) (pure: runs in a decode worker too)."""
    parsed = parse_block(block, base)
    recs = parsed.records
    LeanStep = records.LeanStep
    if recs and set(map(type, recs)) == {LeanStep}:  # the usual block: nothing but step records
        steps, others = recs, []
    else:
        idxs = [i for i, r in enumerate(recs) if type(r) is not LeanStep]
        others = list(zip([recs[i] for i in idxs], parsed.offsets_of(idxs)))
        steps = [r for r in recs if type(r) is LeanStep]
    return _prepared(parsed.errors, others, steps)


def prepare_blocks(blocks: list[tuple[bytes, int]]) -> list[Prepared]:
    """:func:`prepare_block` of each ``(block, base)``, the blocks decoded together (a live pass: one line
    from each of many files costs one decode, not one per file).

    The joined decode is used only when it is the fast path's one record per line, all of them steps
    (what each block alone would have given, since every block ends with a newline); anything else
    (an error, a blank line, a header or an event) decodes each block on its own.
    """
    if len(blocks) < 2:
        return [prepare_block(b, base) for b, base in blocks]
    joined = steps_of_blocks([b for b, _ in blocks])
    if joined is None:
        return [prepare_block(b, base) for b, base in blocks]
    recs, counts = joined
    out = []
    i = 0
    for n in counts:
        out.append(_prepared([], [], recs[i:i + n]))
        i += n
    return out


def steps_of_blocks(blocks: list[bytes]) -> Optional[tuple[list, list[int]]]:
    """The records of ``blocks`` (each of complete lines) decoded together, and each block's line count, when
    every line is one step record on the fast path (what each block alone would give, since each ends with
    a newline); None otherwise (an error, a blank line, a header or an event: decode each block alone)."""
    counts = [b.count(b"\n") for b in blocks]
    parsed = parse_block(b"".join(blocks), 0)
    recs = parsed.records
    if parsed.errors or len(recs) != sum(counts) or set(map(type, recs)) != {records.LeanStep}:
        return None
    return recs, counts


def prepared_steps(steps: list) -> Prepared:
    """What :func:`prepare_block` gives for a block of nothing but the step records ``steps``."""
    return _prepared([], [], steps)


def _prepared(errors: list, others: list, steps: list) -> Prepared:
    """The step records of a block grouped by (rank, attempt) into rows (see :class:`Prepared`)."""
    groups: dict[tuple[int, int], list] = {}
    if steps:
        first = steps[0]
        n = len(steps)
        if (list(map(_rank_of, steps)).count(first.rank) == n
                and list(map(_attempt_of, steps)).count(first.attempt) == n):
            groups = {(first.rank, first.attempt): steps}
        else:
            for st in steps:
                groups.setdefault((st.rank, st.attempt), []).append(st)
    return Prepared(errors, others,
                    {key: (*live.step_rows(g), live.latest_ratios(g, WINDOW_TAIL)) for key, g in groups.items()})
