"""The rate rule (daemon/rates.py): steps/s over the last seconds of records, falling while a rank is silent.

What every surface shows as steps/s and examples/s (`traceml status`, the metrics, `traceml watch`) is this
rule's; the real-run test of a paused rank is tests/test_rates_after_pause.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon import live, rates
from traceml_tui.core import state

_pace = st.floats(min_value=0.01, max_value=200.0, allow_nan=False)
_gaps = st.lists(st.floats(min_value=0.001, max_value=30.0, allow_nan=False), min_size=1, max_size=80)


def _records(gaps: list[float], start: float = 1000.0) -> tuple[list[int], list[float], list[int]]:
    ts = [start]
    for g in gaps:
        ts.append(ts[-1] + g)
    steps = list(range(1, len(ts) + 1))
    return steps, ts, [16 * s for s in steps]


@given(_gaps)
def test_the_window_is_the_records_within_its_seconds_of_the_newest_and_at_least_two(gaps):
    """Held against the rule written out plainly: the oldest record within RATE_WINDOW_S of the newest (the
    second newest when none other is), steps and examples over the time between them."""
    steps, ts, examples = _records(gaps)
    found = rates.window_rate(steps, ts, examples)
    within = [i for i in range(len(ts) - 1) if ts[i] >= ts[-1] - rates.RATE_WINDOW_S]
    first = within[0] if within else len(ts) - 2
    span = ts[-1] - ts[first]
    assert found.span_s == pytest.approx(span)
    assert found.steps_per_s == pytest.approx((steps[-1] - steps[first]) / span)
    assert found.examples_per_s == pytest.approx(16 * found.steps_per_s)


@given(_pace, st.floats(min_value=6.0, max_value=600.0), st.integers(min_value=0, max_value=20))
def test_a_stall_leaves_the_rate_once_its_window_of_records_came_after_it(pace, stall, extra):
    """Whatever the pace and the stall, once RATE_WINDOW_S seconds of records (and two records) came after a
    stall the rate is the pace again: it never keeps the stall for a count of steps."""
    interval = 1.0 / pace
    stall = max(stall, 10 * interval)  # a stall: ten steps' time at least
    after = max(2, int(rates.RATE_WINDOW_S / interval) + 2) + extra
    gaps = [interval] * 70 + [stall] + [interval] * after
    steps, ts, examples = _records(gaps)
    assert rates.window_rate(steps, ts, examples).steps_per_s == pytest.approx(pace, rel=1e-6)
    # ... while a count of 64 steps would still hold it (64 records span 63 gaps: the stall is among them while
    # fewer than 63 gaps came after it)
    if after < live.WINDOW - 1:
        assert (steps[-1] - steps[-live.WINDOW]) / (ts[-1] - ts[-live.WINDOW]) < pace * 0.99


@given(st.lists(st.floats(min_value=-5.0, max_value=30.0, allow_nan=False), min_size=1, max_size=80))
def test_a_clock_that_goes_back_still_gives_a_rate_over_a_positive_span_of_the_newest_records(gaps):
    """Out of time order (a wall clock stepped back), the window still ends at the newest record and spans
    at least one step over a positive time, or there is no rate."""
    steps, ts, examples = _records(gaps)
    found = rates.window_rate(steps, ts, examples)
    if found is not None:
        assert found.span_s > 0 and found.steps_per_s > 0
        assert any(ts[-1] - ts[i] == pytest.approx(found.span_s) for i in range(len(ts) - 1))
    else:
        assert len(ts) < 2 or any(ts[i] >= ts[-1] for i in range(len(ts) - 1))


def test_too_few_records_give_no_rate():
    assert rates.window_rate([1], [1000.0], [16]) is None
    assert rates.window_rate([1, 2], [1000.0, 1000.0], [16, 32]) is None
    assert rates.window_rate([1, 2], [1000.0, None], [16, 32]) is None
    assert rates.window_rate([1, 2, 3], [None, 1000.0, 1001.0], [16, 32, 48]).steps_per_s == 1.0
    assert rates.window_rate([1, 2], [1000.0, 1001.0], [None, 32]).examples_per_s is None


@given(_pace, st.floats(min_value=0.0, max_value=1e5))
def test_a_silent_rank_keeps_its_rate_within_its_grace_then_falls_towards_zero(pace, silent):
    grace = max(state.QUIET_FLOOR_S, state.QUIET_INTERVALS / pace)
    steps, examples = rates.rank_rates(pace, 8 * pace, silent)
    if silent <= grace:
        assert (steps, examples) == (pace, 8 * pace)
    else:
        assert steps < pace and examples == pytest.approx(8 * steps)
        # the window's steps over the window stretched by the silence past the grace
        span = max(rates.RATE_WINDOW_S, 1.0 / pace)
        assert steps == pytest.approx(pace * span / (span + silent - grace))
    later, _ = rates.rank_rates(pace, None, silent + 1.0)
    assert later <= steps
    assert rates.rank_rates(pace, None, None) == (pace, None)  # ended, or not a live run: its last rate


@given(_pace, st.floats(min_value=0.001, max_value=60.0), st.floats(min_value=0.0, max_value=600.0))
def test_a_rank_s_rate_falls_exactly_when_the_core_greys_it_as_silent(pace, interval, silent):
    """One silence threshold (docs/contracts.md "One set of figures"): the rate rule's grace is the core's quiet
    limit for the rank's own median step interval — the rate starts to fall when every surface greys the rank."""
    limit = state.quiet_limit_s(interval, float("inf"))
    steps, _ = rates.rank_rates(pace, None, silent, interval)
    assert rates.grace_s(interval, pace) == limit
    assert (steps < pace) == (silent > limit)
    # and the quiet rule itself greys a running rank past that same limit (its stall limit far away)
    facts = state.RunFacts(ranks=(state.RankFacts(rank=0, last_ts=1000.0, median_interval_s=interval),),
                           now=1000.0 + silent, median_interval_s=interval, stall_floor_s=1e9)
    quiet = state.quiet_ranks(facts, (state.RankState.RUNNING,))
    assert bool(quiet) == (facts.now - 1000.0 > limit)


def test_a_paused_rank_at_five_steps_per_second_falls_well_below_its_pace():
    """The issue's case: 5 steps/s, rank paused. It keeps its pace until it is greyed as silent (5 s), and after
    12 s it shows well under half its old pace."""
    assert rates.rank_rates(5.0, None, 1.0)[0] == rates.rank_rates(5.0, None, 5.0)[0] == 5.0
    assert rates.rank_rates(5.0, None, 12.0)[0] < 2.5
    assert rates.rank_rates(5.0, None, 47.0)[0] < 0.6


def test_a_stopped_rank_is_at_zero():
    from traceml_tui.core.state import RankState

    assert rates.stopped(5.0, 80.0) == (0.0, 0.0) and rates.stopped(None, None) == (None, None)
    assert rates.STOPPED == {RankState.STALLED, RankState.WAITING, RankState.LOST}


def test_a_runs_rate_is_its_slowest_ranks_and_its_examples_every_ranks():
    assert rates.run_rates([(5.0, 80.0), (4.0, 64.0), (None, None)]) == (4.0, 144.0)
    assert rates.run_rates([]) == (None, None)


@given(_gaps)
def test_the_live_window_writes_the_rule(gaps):
    """daemon/live.py's rolling window (what rank_live holds) gives the rule's rates over its steps."""
    steps, ts, examples = _records(gaps)
    window = live.RankWindow()
    window.add_stored([(s, t, e, 50.0, 1.0, *([None] * 12)) for s, t, e in zip(steps, ts, examples)])
    found = rates.window_rate(steps[-live.WINDOW:], ts[-live.WINDOW:], examples[-live.WINDOW:])
    assert window.rates() == (found.steps_per_s, found.examples_per_s)
    fig = window.figures()
    assert (fig["steps_per_s"], fig["examples_per_s"]) == window.rates()
