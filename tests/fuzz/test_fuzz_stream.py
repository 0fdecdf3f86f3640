"""The stream room's byte rules against any bytes (daemon/stream.py; docs/daemon.md rules 3–4, "Exactly once").

Contracts, each searched by hypothesis:

* :func:`stream.cut`, called the way the service calls it (from the cursor it returned, a window of the
  file at a time), delivers every complete line exactly once and in order — inside a block that is the
  file's own bytes at the block's offset, or as the start of one error span (a line over the limit, then
  skipped to its end) — never a byte of an unfinished line, never goes backwards, and leaves a cursor whose
  tail the file still holds (:func:`stream.tail_matches`);
* with the NUL hold-back on, no block holds a line that starts with NUL bytes followed by data, and a read
  held back stops right at such a line;
* the live fast paths equal their slow paths: :func:`stream.read_past_tail` (new bytes in the same
  ``pread`` as the committed tail) is :func:`stream.read_block` when :func:`stream.tail_matches`, else
  None; a small append's cursor (:func:`stream.small_append`, taken without a cut) is the cursor
  :func:`stream.cut` gives for the same bytes.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from daemon import stream

LIMIT = 16  # MAX_LINE while these run: over-long lines are cheap to generate

_line = st.one_of(
    st.binary(max_size=2 * LIMIT + 3),
    st.sampled_from([b"", b"\r", b"\0", b"\0\0\0", b"\0{}", b"{}\0", b"x" * (LIMIT + 1), b"\0" * (LIMIT + 2)]),
).map(lambda b: b.replace(b"\n", b""))
_file = st.tuples(st.lists(_line, max_size=20), _line)  # complete lines, and an unfinished last line


def _bytes(parts) -> tuple[bytes, list[int], int]:
    """The file's bytes, the offset of each complete line, and where the unfinished line starts."""
    lines, rest = parts
    data, starts = b"", []
    for line in lines:
        starts.append(len(data))
        data += line + b"\n"
    return data + rest, starts, len(data)


def _consume(data: bytes, window: int, nul_fresh: bool):
    """Cut ``data`` from byte 0 as the service does, until a cut says nothing more is there now."""
    offset, skipping, tail = 0, 0, None
    delivered, held = [], False
    for _ in range(10 * len(data) + 10):
        piece = stream.cut(data[offset:offset + window], offset, len(data), skipping, tail, nul_fresh)
        assert offset <= piece.offset <= len(data)  # never backwards, never past the end
        # `more` only with progress: the service reads again while it is set (a cut that says more without moving
        # would loop for ever, e.g. on a file truncated mid-line after the pass's stat)
        assert not piece.more or piece.offset > offset
        if piece.error is not None:
            # at the cursor, or past the rest of a skipped line that ended in this window
            assert not piece.block and piece.error[0] >= offset and piece.skipping == 1
            delivered.append((piece.error[0], None))
        if piece.block:
            assert piece.block.endswith(b"\n") and piece.at >= offset
            assert data[piece.at:piece.at + len(piece.block)] == piece.block  # the file's own bytes
            assert piece.offset == piece.at + len(piece.block)
            at = piece.at
            for line in piece.block[:-1].split(b"\n"):
                delivered.append((at, line))
                at += len(line) + 1
        offset, skipping, tail, held = piece.offset, piece.skipping, piece.tail, piece.held_back
        if not piece.more:
            return offset, skipping, tail, held, delivered
    raise AssertionError("the cuts did not come to an end")


def _tail_held(data: bytes, offset: int, tail) -> bool:
    fd, path = tempfile.mkstemp()
    try:
        os.write(fd, data)
        return stream.tail_matches(fd, offset, tail)
    finally:
        os.close(fd)
        os.unlink(path)


@given(_file, st.integers(LIMIT + 2, 4 * LIMIT))
# A skip that ends in a window with the next line crossing the window's end: the read stopped there and the
# lines after it were lost (found by a longer search, docs/security.md "Fuzzing")
@example(([b"\0" * 19, b"\0" * 16], b""), 18)
# a skip ends and another over-long line starts in one window: its error is at its own start
@example(([b"\0" * 18], b"\0" * 17), 18)
def test_every_complete_line_is_delivered_once_in_order(parts, window):
    data, starts, unfinished = _bytes(parts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stream, "MAX_LINE", LIMIT)
        offset, skipping, tail, held, delivered = _consume(data, window, nul_fresh=False)
    assert not held
    over_long_rest = len(data) - unfinished > LIMIT  # an unfinished line already over the limit: skipped once
    assert [at for at, _ in delivered] == starts + ([unfinished] if over_long_rest else [])
    for at, line in delivered:
        if line is not None:
            assert data[at:at + len(line) + 1] == line + b"\n"
    if skipping:
        assert over_long_rest and offset > unfinished
    else:
        assert offset == unfinished  # the committed offset ends just after the last complete line
    assert _tail_held(data, offset, tail)


@given(_file, st.integers(LIMIT + 2, 4 * LIMIT))
def test_a_line_starting_with_nul_bytes_is_never_committed_past_while_fresh(parts, window):
    data, _, _ = _bytes(parts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stream, "MAX_LINE", LIMIT)
        offset, _, _, held, delivered = _consume(data, window, nul_fresh=True)
    for _, line in delivered:
        assert line is None or not line.startswith(b"\0") or not line.strip(b"\0")
    if held:
        assert data[offset:offset + 1] == b"\0"


@given(st.binary(max_size=300), st.data())
def test_the_tail_check_with_the_new_bytes_equals_the_check_then_the_read(data, draw):
    offset = draw.draw(st.integers(0, len(data)))
    before = data[:offset]
    true_tail = (stream.tail_of(before[before.rfind(b"\n", 0, len(before) - 1) + 1:-1])
                 if before.endswith(b"\n") else None)
    tail = draw.draw(st.one_of(st.just(true_tail), st.none(), st.binary(max_size=30).map(stream.tail_of),
                               st.text(max_size=12), st.integers(0, 400).map(lambda n: f"{n}:{'0' * 40}")))
    fd, path = tempfile.mkstemp()
    try:
        os.write(fd, data)
        slow = stream.read_block(fd, offset, len(data)) if stream.tail_matches(fd, offset, tail) else None
        assert stream.read_past_tail(fd, offset, tail, len(data)) == slow
    finally:
        os.close(fd)
        os.unlink(path)


@given(st.lists(_line, min_size=1, max_size=20), st.integers(0, 1000), st.booleans())
def test_a_small_appends_cursor_is_the_cursor_a_cut_gives(lines, offset, nul_fresh):
    data = b"".join(line + b"\n" for line in lines)
    size = offset + len(data)
    if not stream.small_append(data, offset, size, 0):
        return
    piece = stream.cut(data, offset, size, 0, None, nul_fresh)
    last = data[data.rfind(b"\n", 0, len(data) - 1) + 1:-1]
    assert (piece.block, piece.at, piece.offset, piece.skipping, piece.more, piece.held_back, piece.error) == (
        data, offset, size, 0, False, False, None)
    assert piece.tail == stream.tail_of(last)


# --------------------------------------------------------------------------- the live case in one step

_ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.lists(_line, min_size=1, max_size=4)),  # complete lines
    st.tuples(st.just("partial"), _line),  # a line not finished yet
    st.tuples(st.just("rewrite"), st.integers(1, 40), st.binary(min_size=1, max_size=1)),  # the tail in place
    st.tuples(st.just("truncate"), st.integers(0, 60)),
    st.tuples(st.just("header"), st.binary(min_size=1, max_size=1)),  # same length, other bytes
    st.tuples(st.just("replace"), st.lists(_line, max_size=4)),  # another file at the path
    st.tuples(st.just("nul"), st.integers(1, 3)),  # a NUL region, then data
), min_size=1, max_size=12)


def _apply(path: str, op) -> None:
    with open(path, "rb") as fh:
        data = fh.read()
    kind = op[0]
    if kind == "append":
        data += b"".join(line + b"\n" for line in op[1])
    elif kind == "partial":
        data += op[1]
    elif kind == "rewrite" and data:
        at = max(0, len(data) - op[1])
        data = data[:at] + op[2] * (len(data) - at - 1) + data[-1:]
    elif kind == "truncate":
        data = data[:op[1]]
    elif kind == "header" and b"\n" in data:
        data = op[1] * data.index(b"\n") + data[data.index(b"\n"):]
    elif kind == "replace":
        tmp = path + ".new"
        with open(tmp, "wb") as fh:
            fh.write(b'{"head": 2}\n' + b"".join(line + b"\n" for line in op[1]))
        os.replace(tmp, path)
        return
    elif kind == "nul":
        data += b"\0" * op[1] + b"x\n"
    with open(path, "r+b") as fh:  # in place: the same inode (a rewrite, a truncation)
        fh.seek(0)
        fh.write(data)
        fh.truncate(len(data))


def _read(streams: stream.Streams, root: str, path: str, cur: dict, quick: bool):
    """One read of ``path`` from the committed cursor ``cur``, as the service makes it: the live case in one step
    (``quick``) when it takes it, else the usual open, identity and advance."""
    st_ = os.stat(path)
    if quick:
        got = streams.quick_append(path, st_, cur["identity"], cur["generation"], cur["offset"], cur["skipping"],
                                   cur["tail"], cur["ino"])
        if got is not None:
            return "append", got[0], got[1]
    opened = streams.open(root, path, st_)
    if opened is None:
        return None
    fd, fst = opened
    identity = streams.identity(path, fd)
    if identity is None:
        return None
    c = {k: cur[k] for k in stream.CURSOR}
    read = streams.advance(fd, fst, c, identity, False, True, path)
    if read.append is not None:
        return "append", read.cursor, read.append
    return "cut", read.cursor, read.cut


@given(_ops)
def test_the_live_case_in_one_step_equals_the_usual_read(ops):
    """:meth:`stream.Streams.quick_append` (bytes of the last read instead of hashes, one call) reads what the
    usual open, identity and advance read, pass after pass, whatever happens to the file: the same cursor and
    the same bytes, or it declines and the usual read runs."""
    root = tempfile.mkdtemp()
    path = os.path.join(root, "steps-0.jsonl")
    with open(path, "wb") as fh:
        fh.write(b'{"head": 1}\n')
    quick, usual = stream.Streams(), stream.Streams()
    cur = dict.fromkeys((*stream.CURSOR, "size", "mtime_ns", "ino"))
    cur["generation"] = 0
    try:
        for op in [("append", [b"{}"])] + ops + [("append", [b"{}"])]:
            _apply(path, op)
            a = _read(quick, root, path, cur, True)
            b = _read(usual, root, path, cur, False)
            assert a == b
            if a is not None:
                cur = dict(a[1])
    finally:
        quick.reset()
        usual.reset()
        for name in os.listdir(root):
            os.unlink(os.path.join(root, name))
        os.rmdir(root)


@given(_line, st.integers(0, 100), st.integers(0, 100), st.integers(0, 1), st.booleans())
def test_a_cut_says_more_only_when_its_cursor_moved(data, offset, extra, skipping, nul_fresh):
    """Whatever a read returned (a short read of a file truncated after the pass's stat: fewer bytes than the
    size says), `more` means the cursor moved: the service reads again while it is set, and a cut of a partial
    line that said more without moving made a pass loop for ever (found by an independent review)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stream, "MAX_LINE", LIMIT)
        piece = stream.cut(data, offset, offset + len(data) + extra, skipping, None, nul_fresh)
    assert not piece.more or piece.offset > offset
