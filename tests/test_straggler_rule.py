"""The one straggler rule (core/straggler.py): what the summary's STRAGGLER verdict and the index's Δ share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traceml_tui.core import straggler
from traceml_tui.summary.build import _points, diagnose_step_time

_ms = st.floats(min_value=0.01, max_value=1e6, allow_nan=False, allow_infinity=False)
_ranks = st.dictionaries(st.integers(min_value=0, max_value=63), _ms, min_size=1, max_size=16)


@given(_ranks)
def test_the_median_rank_is_the_lower_median_and_the_slowest_ranks_delta_is_the_skew(values):
    found = straggler.spread(values.items())
    ordered = sorted((v, k) for k, v in values.items())
    assert (found.median, found.median_key) == ordered[(len(ordered) - 1) // 2]
    assert (found.worst, found.worst_key) == ordered[-1]
    assert found.delta_pct(found.median) == 0.0
    # every rank's Δ is measured from the same rank; the slowest rank's is the skew, and no rank's is larger
    deltas = {k: found.delta_pct(v) for k, v in values.items()}
    assert max(deltas.values()) == pytest.approx(deltas[found.worst_key])
    if found.skew_pct is None:
        assert found.worst_key == found.median_key
    else:
        assert found.skew_pct == pytest.approx(deltas[found.worst_key])
        assert found.score == pytest.approx(1 + found.skew_pct / 100)
    assert found.straggler == (found.skew_pct is not None and found.skew_pct >= straggler.STRAGGLER_SKEW_PCT)


@given(_ranks)
def test_the_summary_says_straggler_exactly_when_the_rule_does(values):
    rows = {str(k): {"metrics": {"step_time_ms": v}} for k, v in values.items()}
    average, median, worst = _points(rows, ("step_time_ms",))
    issues = diagnose_step_time(average, median, worst, steps=10)
    found = straggler.spread((str(k), v) for k, v in values.items())
    flagged = [i for i in issues if i["kind"] == "STRAGGLER"]
    assert bool(flagged) == found.straggler
    if flagged:
        assert flagged[0]["ranks"] == [int(found.worst_key)]
        assert flagged[0]["skew_pct"] == pytest.approx(found.skew_pct)


def test_two_ranks_measure_the_slow_one_against_its_healthy_peer():
    """Of two ranks the median rank is the faster one: 100 ms and 118 ms is an 18 % straggler (not 1.08×)."""
    found = straggler.spread([(0, 100.0), (1, 118.0)])
    assert (found.median_key, found.worst_key) == (0, 1)
    assert found.skew_pct == pytest.approx(18.0) and found.straggler
    assert straggler.spread([(0, 100.0), (1, 105.0)]).straggler is False
    assert straggler.spread([]) is None and straggler.spread([(0, None)]) is None
    assert straggler.spread([(3, 50.0)]).skew_pct is None
