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


# -- an ended run's figures: the summary's rows, read back (core.straggler.summary_window, rows_spread)

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                     max_leaves=20)
_row_key = st.one_of(st.integers(min_value=0, max_value=99).map(str), st.text(max_size=3),
                     st.text(alphabet="123456789", min_size=4400, max_size=5000))  # past int()'s digit limit


@given(st.one_of(_json, st.fixed_dictionaries({"groups": st.fixed_dictionaries(
    {"rows": st.dictionaries(_row_key, st.one_of(_json, st.fixed_dictionaries({"metrics": st.dictionaries(
        st.sampled_from(["step_time_ms", "input_wait_ms", "x"]), _json)})), max_size=6)})})))
def test_any_step_time_section_reads_as_rank_rows_with_finite_step_times_or_none(section):
    """Untrusted summary bytes: whatever the ``step_time`` section holds, reading it never raises, and what it
    keeps are rows keyed by a global rank whose step time is a finite number."""
    window = straggler.summary_window(section)
    if window is None:
        return
    assert window.rows
    for key in window.rows:
        assert key == str(int(key)) and int(key) >= 0
        value = window.value(int(key))
        assert isinstance(value, float) and value == value and abs(value) != float("inf")
    found = window.spread()
    assert found is not None and found.worst == max(window.value(int(k)) for k in window.rows)


@given(_ranks, st.integers(min_value=1, max_value=500), st.integers(min_value=0, max_value=500))
def test_the_rows_the_summary_writes_read_back_to_the_same_spread_and_verdict(values, start, length):
    """What the summary writes (``step_time.groups.rows``, through JSON) and what the index reads back give the
    same median rank, slowest rank and size as the summary's own call: one function on the same rows."""
    import json

    rows = {str(k): {"identity": {"global_rank": k}, "metrics": {"step_time_ms": v, "input_wait_ms": None}}
            for k, v in values.items()}
    section = {"groups": {"by": "global_rank", "rows": rows},
               "global": {"window": {"start_step": start, "end_step": start + length, "diagnosis_clock": "cpu"}}}
    window = straggler.summary_window(json.loads(json.dumps(section)))
    assert (window.start_step, window.end_step, window.clock) == (start, start + length, "cpu")
    written = straggler.rows_spread(rows)
    assert window.spread() == written
    _, median, worst = _points(rows, ("step_time_ms",))
    assert (median["step_time_ms"]["idx"], worst["step_time_ms"]["idx"]) == (written.median_key, written.worst_key)
    for k, v in values.items():
        assert window.value(k) == v and window.value(k, "input_wait_ms") is None
