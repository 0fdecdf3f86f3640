"""The ``unmeasured`` record's contract against arbitrary bytes and strings (docs/run.md, "Step record v1").

* ``records.decode`` of any line claiming ``kind: unmeasured`` returns a record whose ``stream`` is 1–40
  and ``reason`` at most 300 characters, or raises ``RecordError`` — nothing else escapes.
* Whatever a caller passes, the SDK's clipping (``core/coverage.py``) yields a record that decodes back to
  the same values: a writer can never produce a line the readers refuse.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from traceml_tui.core import coverage, records

_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=400))
_values = st.recursive(_json_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


@given(
    stream=_values,
    reason=_values,
    extra=st.dictionaries(st.sampled_from(["v", "run", "rank", "attempt", "ts", "step", "other"]), _values, max_size=4),
)
def test_decode_accepts_only_bounded_unmeasured_records(stream, reason, extra):
    body = {"v": 1, "run": "r", "rank": 0, "attempt": 0, "ts": 1.0, **extra, "kind": "unmeasured",
            "stream": stream, "reason": reason}
    line = json.dumps(body).encode()
    try:
        rec = records.decode(line)
    except records.RecordError:
        return
    assert isinstance(rec, records.Unmeasured)
    assert isinstance(rec.stream, str) and 1 <= len(rec.stream) <= records.MAX_STREAM_CHARS
    assert isinstance(rec.reason, str) and len(rec.reason) <= records.MAX_REASON_CHARS


@given(stream=st.one_of(st.text(max_size=200), _values), reason=st.one_of(st.text(max_size=2000), _values))
def test_clipped_values_always_decode(stream, reason):
    name = coverage.clip_stream(stream)
    text = coverage.clip_reason(reason)
    if not name:  # the SDK writes nothing for an empty or non-string stream
        return
    rec = records.Unmeasured(v=1, run="r", rank=3, attempt=0, ts=1.0, stream=name, reason=text)
    back = records.decode(records.encode(rec))
    assert isinstance(back, records.Unmeasured)
    assert (back.stream, back.reason) == (name, text)
    assert "\n" not in back.reason and "\n" not in back.stream


@given(entries=st.lists(_values, max_size=6))
def test_summary_lines_from_any_entries_never_raise(entries):
    """The card and status read `integration.unmeasured` from files: anything there gives lines, never an error."""
    lines = coverage.unmeasured_lines(entries)
    assert all(isinstance(line, str) and "\n" not in line for line in lines)
    assert len(lines) <= len(entries)
    names = coverage.dark_streams(entries)
    assert names == sorted(set(names), key=lambda n: (n != "all", n))


@given(found=st.lists(st.tuples(st.integers(0, 3), st.text(max_size=50), st.text(max_size=400)), max_size=12))
def test_entries_are_one_per_rank_and_stream_first_reason_standing(found):
    entries = coverage.unmeasured_entries(found)
    keys = [(e["rank"], e["stream"]) for e in entries]
    assert len(keys) == len(set(keys))
    for rank, stream, _reason in found:
        if not coverage.clip_stream(stream):
            assert all(e["stream"] for e in entries)  # a blank name names no stream
            continue
        first = next(r for k, s, r in found if (k, coverage.clip_stream(s)) == (rank, coverage.clip_stream(stream)))
        (entry,) = [e for e in entries if (e["rank"], e["stream"]) == (rank, coverage.clip_stream(stream))]
        assert entry["reason"] == coverage.clip_reason(first)
