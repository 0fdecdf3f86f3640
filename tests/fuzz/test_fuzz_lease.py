"""Property tests of the launcher-lease reader (core/lease.py ``decode``), whose bytes come from any node.

Contract: no exception escapes; a Beat comes back only for a version-1 lease object whose lease length is a
finite number within [MIN_LEASE_S, MAX_LEASE_S], whose node and beat are integers in 0..2^63-1 and whose state
is live or done; whatever ``encode`` writes decodes to the same beat.
"""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from traceml_tui.core import lease as core_lease

_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _valid(obj: dict) -> bool:
    def is_int(v) -> bool:
        return type(v) is int

    lease_s = obj.get("lease_s")
    return (
        obj.get("v") == 1 and type(obj.get("v")) is int and obj.get("kind") == "lease"
        and is_int(obj.get("node")) and 0 <= obj["node"] < 1 << 63
        and is_int(obj.get("beat")) and 0 <= obj["beat"] < 1 << 63
        and isinstance(obj.get("launch"), str)
        and type(lease_s) in (int, float) and math.isfinite(lease_s)
        and core_lease.MIN_LEASE_S <= lease_s <= core_lease.MAX_LEASE_S
        and obj.get("state") in (core_lease.LIVE, core_lease.DONE)
    )


@given(st.binary(max_size=256))
def test_any_bytes_decode_to_a_beat_or_none(data: bytes) -> None:
    beat = core_lease.decode(data)
    assert beat is None or isinstance(beat, core_lease.Beat)


@given(st.integers(0, (1 << 63) - 1), st.text(max_size=12), st.integers(0, (1 << 63) - 1),
       st.floats(core_lease.MIN_LEASE_S, core_lease.MAX_LEASE_S), st.booleans())
def test_what_encode_writes_decodes_to_the_same_beat(node, launch, beat, lease_s, done) -> None:
    data = core_lease.encode(node=node, launch=launch, beat=beat, lease_s=lease_s, done=done)
    got = core_lease.decode(data)
    assert got is not None
    assert (got.node, got.launch, got.beat, got.lease_s, got.done) == (node, launch, beat, lease_s, done)
    assert data.endswith(b"\n") and data.count(b"\n") == 1


_FIELD_VALUES = {
    "v": st.sampled_from([1, 2, 0, "1", 1.0, True, None]),
    "kind": st.sampled_from(["lease", "step", "", None]),
    "node": st.one_of(st.integers(-3, 3), st.sampled_from([(1 << 63) - 1, 1 << 63, 10 ** 30, 1.5, "0", True])),
    "launch": st.one_of(st.text(max_size=8), st.integers(0, 3)),
    "beat": st.one_of(st.integers(-3, 10 ** 6), st.sampled_from([1 << 63, 10 ** 40, 2.0, None])),
    "lease_s": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10 ** 6),
                         st.sampled_from(["30", None, True])),
    "state": st.sampled_from(["live", "done", "dead", "", None, 1]),
}


@given(st.fixed_dictionaries({}, optional=_FIELD_VALUES), st.dictionaries(st.text(max_size=5), _ANY_JSON, max_size=2))
def test_a_mutated_lease_decodes_exactly_when_it_keeps_the_contract(fields: dict, extra: dict) -> None:
    obj = {**extra, **fields}
    try:
        data = json.dumps(obj, allow_nan=False).encode()
    except ValueError:  # NaN/Infinity: not JSON at all (``NaN`` written as such is refused, test_lease_ingest)
        assert core_lease.decode(json.dumps(obj, allow_nan=True).encode()) is None
        return
    beat = core_lease.decode(data)
    assert (beat is not None) == _valid(obj)
