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
    assert window.rates() == pytest.approx(_rule_over_marks(steps, ts, examples), rel=1e-9)
    fig = window.figures()
    assert (fig["steps_per_s"], fig["examples_per_s"]) == window.rates()


# --------------------------------------------------------------------------- a rank faster than its window
# 64 steps of a rank faster than 12.8 steps/s span less than the rate's 5 s: the window keeps marks (the first
# record of each rates.MARK_S of record time) so that its rate is still over its last 5 s of records.

_fast_gaps = st.lists(st.one_of(st.floats(min_value=0.001, max_value=0.05), st.floats(min_value=0.05, max_value=2.0)),
                      min_size=1, max_size=400)


def _rule_over_marks(steps, ts, examples) -> tuple[float, float]:
    """The rule written out plainly over every record: start at the oldest record within RATE_WINDOW_S of the
    newest that is either among the newest WINDOW or the first of its MARK_S of time (the second newest when
    none is)."""
    end, n = ts[-1], len(ts)
    buckets = [t // rates.MARK_S for t in ts]
    kept = [i for i in range(n - 1)
            if (i >= n - live.WINDOW or i == 0 or buckets[i] != buckets[i - 1]) and ts[i] >= end - rates.RATE_WINDOW_S]
    first = kept[0] if kept else n - 2
    span = end - ts[first]
    return (steps[-1] - steps[first]) / span, (examples[-1] - examples[first]) / span


def _row(step: int, ts: float, examples: int) -> tuple:
    """A step row tuple (daemon/live.py's layout) of one timed step."""
    row = [None] * (live.COL_DATA_IN_STEP + 1)
    row[live.COL_STEP], row[live.COL_TS], row[live.COL_EXAMPLES] = step, ts, examples
    row[live.COL_STEP_MS], row[live.COL_INPUT_WAIT] = 50.0, 1.0
    return tuple(row)


@given(_fast_gaps)
def test_a_fast_ranks_window_rates_over_its_last_seconds_of_records(gaps):
    steps, ts, examples = _records(gaps)
    window = live.RankWindow()
    for s, t, e in zip(steps, ts, examples):
        window.add_row(_row(s, t, e), 1)
    want = _rule_over_marks(steps, ts, examples)
    assert window.rates() == pytest.approx(want, rel=1e-9)
    # the window's start is within one mark's time of the oldest record within the seconds
    within = [i for i in range(len(ts) - 1) if ts[i] >= ts[-1] - rates.RATE_WINDOW_S]
    if within and len(ts) > live.WINDOW:
        found = rates.window_rate(steps[-live.WINDOW:], ts[-live.WINDOW:], examples[-live.WINDOW:],
                                  marks=window.marks)
        assert found.span_s >= ts[-1] - ts[within[0]] - rates.MARK_S - 1e-9


_stepped_back_gaps = st.lists(st.one_of(st.floats(min_value=0.001, max_value=0.05),
                                        st.floats(min_value=0.05, max_value=2.0),
                                        st.floats(min_value=-1.0, max_value=-0.001)), min_size=1, max_size=400)


@given(_stepped_back_gaps, st.integers(min_value=1, max_value=400), st.sets(st.integers(0, 400), max_size=20))
def test_a_batch_marks_as_its_records_one_by_one(gaps, cut, untimed):
    """The cold path (a batch: add_columns) and the live path (one row per pass) give a window the same rates,
    a wall clock stepped back and untimed records included."""
    steps, ts, examples = _records(gaps)
    ts = [None if i in untimed else t for i, t in enumerate(ts)]
    rows = [_row(s, t, e) for s, t, e in zip(steps, ts, examples)]
    one_by_one, batched = live.RankWindow(), live.RankWindow()
    for r in rows:
        one_by_one.add_row(r, 1)
    cut = min(cut, len(rows))
    batched.add_rows(rows[:cut], cut)
    if rows[cut:]:
        batched.add_rows(rows[cut:], len(rows) - cut)
    assert batched.rates() == one_by_one.rates()


def test_a_pause_inside_a_fast_ranks_last_seconds_lowers_its_rate():
    """100 steps/s for 10 s but with a 1 s pause 2 s before the end: its last 5 s of records hold about
    400 steps over 5 s (80 steps/s); its newest 64 steps alone (0.63 s, after the pause) said 100."""
    gaps = [0.01] * 800 + [1.0] + [0.01] * 200
    steps, ts, examples = _records(gaps)
    window = live.RankWindow()
    window.add_rows([_row(s, t, e) for s, t, e in zip(steps, ts, examples)], len(steps))
    steps_per_s, _ = window.rates()
    assert steps_per_s == pytest.approx(80.0, rel=0.03)
    newest_64 = (steps[-1] - steps[-live.WINDOW]) / (ts[-1] - ts[-live.WINDOW])
    assert newest_64 == pytest.approx(100.0, rel=1e-6)


def test_a_fast_real_ranks_rate_is_the_rule_live_cold_and_after_a_restart(tmp_path):
    """A real SDK session stepping a few hundred times a second, with a 2 s pause 100 steps before its end: the rate the cold ingest stores,
    the one a live ingest (the file appended in pieces, a pass after each) stores, and the one a restarted
    ingester's reloaded window gives are each the rule over the file's records (the reload marks the steps
    before its 64 from the index)."""
    import json
    import shutil
    import sqlite3
    import time

    from daemon.service import Ingester
    from traceml_tui.sdk.session import Session

    run = tmp_path / "cold" / "fast"
    session = Session(run, "fast", rank=0, world_size=1, window_s=0.0)
    for i in range(700):
        state = session.begin(time.perf_counter())
        time.sleep(2.0 if i == 600 else 0.002)
        session.end(state, time.perf_counter(), True)
    session.close("completed")
    path = run / "ranks" / "rank_0" / "steps-0.jsonl"
    steps_recs = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "step"]
    steps = [r["step"] for r in steps_recs]
    ts = [r["ts"] for r in steps_recs]
    examples = [0 for _ in steps]  # the session logged no examples: compare steps/s alone
    want = _rule_over_marks(steps, ts, examples)[0]
    # the newest 64 steps (after the pause, whatever this machine's pace) alone would be well off: a 2 s pause
    # in the last 5 s of records leaves at most 3 s of steps there
    assert ts[-1] - ts[-live.WINDOW] < rates.RATE_WINDOW_S
    assert (steps[-1] - steps[-live.WINDOW]) / (ts[-1] - ts[-live.WINDOW]) > want * 1.2

    def stored(index) -> float:
        with sqlite3.connect(index) as conn:
            return conn.execute("SELECT steps_per_s FROM rank_live").fetchone()[0]

    cold = Ingester(tmp_path / "cold.sqlite", [str(tmp_path / "cold")], use_inotify=False)
    cold.run_once()
    cold.close()
    assert stored(tmp_path / "cold.sqlite") == pytest.approx(want, rel=1e-9)

    live_run = tmp_path / "live" / "fast"
    shutil.copytree(run, live_run)
    lines = path.read_bytes().splitlines(keepends=True)
    live_path = live_run / "ranks" / "rank_0" / "steps-0.jsonl"
    live_path.write_bytes(lines[0])
    ing = Ingester(tmp_path / "live.sqlite", [str(tmp_path / "live")], use_inotify=False)
    for start in range(1, len(lines), 37):
        with open(live_path, "ab") as handle:
            handle.write(b"".join(lines[start:start + 37]))
        ing.run_once()
    ing.close()
    assert stored(tmp_path / "live.sqlite") == pytest.approx(want, rel=1e-9)

    restarted = Ingester(tmp_path / "cold.sqlite", [str(tmp_path / "cold")], use_inotify=False)
    try:
        restarted.run_once()
        run_id = restarted.conn.execute("SELECT run_id FROM rank_live").fetchone()[0]
        restarted.store.agg.windows.clear()
        # (the index stores a record's time to the millisecond: a reloaded window's times are those)
        stored_ts = [round(t, 3) for t in ts]
        want_reloaded = _rule_over_marks(steps, stored_ts, examples)[0]
        assert restarted.store.agg.window((run_id, 0, 0)).rates()[0] == pytest.approx(want_reloaded, rel=1e-9)
    finally:
        restarted.close()


def test_after_a_wall_clock_steps_back_a_batch_still_rates_as_one_row_at_a_time():
    """Steps a few ms to 0.3 s apart, the wall clock stepping back 0.5 s at 1 % of them, untimed records at 1 %:
    over 400 drawn histories split at a drawn row, the batch path (cold) and the row path (live) agree. Marks
    once went backwards in time with the clock, and the batch marked only its last seconds: 35–54 in 1,500
    such histories disagreed by up to 41 % (found by an independent review)."""
    import random

    for seed in range(400):
        rnd = random.Random(seed)
        n = rnd.randint(70, 600)
        t, rows = 1000.0, []
        for step in range(1, n + 1):
            t += rnd.choice([0.001, 0.005, 0.02, 0.3])
            if rnd.random() < 0.01:
                t -= 0.5
            rows.append(_row(step, None if rnd.random() < 0.01 else t, 4 * step))
        one_by_one, batched = live.RankWindow(), live.RankWindow()
        for r in rows:
            one_by_one.add_row(r, 1)
        cut = rnd.randint(1, n)
        batched.add_rows(rows[:cut], cut)
        if rows[cut:]:
            batched.add_rows(rows[cut:], n - cut)
        assert batched.rates() == one_by_one.rates(), seed
