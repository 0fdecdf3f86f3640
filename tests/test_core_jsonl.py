"""core/jsonl.py: the one "complete lines only" rule, against its contract (property tests) and on real files.

Contract: a line is the bytes before a newline; bytes after the last newline are not a line yet; a blank
line is no line; a tail that starts mid-file drops its first piece. The fast path (one split of the whole
buffer) and the chunked reader are both checked against a plain line-by-line reference.
"""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from traceml_tui.core import jsonl, records

from support.lanes import examples

#: Bytes that make line structure interesting: newlines, blanks, a carriage return, JSON punctuation.
_ALPHABET = st.sampled_from([b"\n", b" ", b"\r", b"\t", b"{", b"}", b"a", b'"', b"\x00", b"\xff"])
DATA = st.lists(_ALPHABET, max_size=200).map(b"".join) | st.binary(max_size=300)


def reference_lines(data: bytes, partial_head: bool = False) -> list[bytes]:
    """The slow path: walk the buffer line by line with ``readline`` and keep what the contract calls a line."""
    handle = io.BytesIO(data)
    out = []
    first = True
    for raw in iter(handle.readline, b""):
        if not raw.endswith(b"\n"):
            break  # bytes after the last newline: not a line yet
        if first and partial_head:
            first = False
            continue
        first = False
        line = raw[:-1]
        if line.strip():
            out.append(line)
    return out


@given(DATA, st.booleans())
def test_the_fast_path_equals_the_line_by_line_reference(data, partial_head):
    assert jsonl.complete_lines(data, partial_head=partial_head) == reference_lines(data, partial_head)


@settings(max_examples=examples(300))
@given(DATA, st.integers(min_value=1, max_value=40), st.booleans())
def test_the_chunked_reader_equals_the_fast_path_for_every_chunk_size(data, chunk, partial_head):
    streamed = list(jsonl.stream_lines(io.BytesIO(data), chunk_bytes=chunk, partial_head=partial_head))
    assert streamed == jsonl.complete_lines(data, partial_head=partial_head)


@given(DATA, DATA)
def test_it_never_yields_a_partial_line(complete, unfinished):
    """Whatever follows the last newline — a line still being written — changes nothing until its newline."""
    head = complete if complete.endswith(b"\n") or not complete else complete + b"\n"
    tail = unfinished.replace(b"\n", b"")
    assert jsonl.complete_lines(head + tail) == jsonl.complete_lines(head)
    assert jsonl.complete_end(head + tail) == len(head)
    for line in jsonl.complete_lines(head + tail):
        assert b"\n" not in line and line.strip()
        assert line + b"\n" in head


@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=20))
def test_every_written_line_comes_back_in_order(lines):
    data = b"".join(line + b"\n" for line in lines)
    assert jsonl.complete_lines(data) == [line for line in lines if line.strip()]


@given(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), st.lists(
    st.binary(min_size=1, max_size=20).map(lambda b: b.replace(b"\n", b"x")), max_size=8))
def test_a_tail_drops_only_its_cut_first_piece(cut, lines):
    data = cut + b"\n" + b"".join(line + b"\n" for line in lines)
    assert jsonl.complete_lines(data, partial_head=True) == [line for line in lines if line.strip()]


def _step(step: int) -> records.Step:
    return records.Step(v=1, run="r", rank=0, attempt=0, step=step, ts=1000.0 + step)


def test_records_of_a_real_file_skip_the_malformed_and_the_unfinished(tmp_path: Path):
    """A rank file as a crash leaves it: a header, steps, a damaged line, a half-written last record."""
    header = records.Header(v=1, run="r", rank=0, attempt=0, uuid="u", ts=1000.0)
    body = records.encode(header) + records.encode(_step(1)) + b"{not json\n" + records.encode(_step(2))
    path = tmp_path / "steps-0.jsonl"
    path.write_bytes(body + records.encode(_step(3))[:-9])
    got = list(jsonl.file_records(path))
    assert [type(r).__name__ for r in got] == ["Header", "Step", "Step"]
    assert [r.step for r in jsonl.file_records(path, (records.Step,))] == [1, 2]
    assert jsonl.read_lines(path) == jsonl.complete_lines(path.read_bytes())
    assert list(jsonl.file_records(tmp_path / "missing.jsonl")) == []


def test_a_tail_read_leaves_out_its_cut_first_line(tmp_path: Path):
    path = tmp_path / "steps-0.jsonl"
    lines = [records.encode(_step(s)) for s in range(1, 50)]
    path.write_bytes(b"".join(lines))
    limit = len(lines[-1]) * 3 + 5  # three whole records and the end of a fourth
    steps = [r.step for r in jsonl.iter_records(jsonl.read_tail_lines(path, limit))]
    assert steps == [47, 48, 49]
    whole = [r.step for r in jsonl.iter_records(jsonl.read_tail_lines(path, 1 << 20))]
    assert whole == list(range(1, 50))  # the whole file: its first line is complete
