"""A pass's rolling figures on arrays (``daemon/figures.py``) are the window's own (``RankWindow.figures``).

The live daemon computes the figures of every rank due in a pass together, with numpy; the window's own
method (the core's ``steptime.split_step`` / ``average_parts`` and ``statistics.median``, step by step) stays
the definition. Held here bit for bit (the ``rank_live`` JSON text included) over hypothesis-drawn windows —
nulls, negative, ±0, NaN and ±inf timings, first steps, phases longer than their envelope, GPU and CPU
clocks, windows past 64 steps, untimed and odd record times — and on the rows a live ingester writes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import figures, live
from daemon.service import Ingester

from support.daemon_files import append_raw, header_line, index_rows, step_line, steps_path
from support.lanes import examples

_TIMING = st.one_of(
    st.none(),
    st.floats(min_value=0.0, max_value=1e4),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, -1.0, math.inf]),
    st.integers(-5, 10_000),
)
_TS = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=True), st.integers(0, 10**10))


@st.composite
def _window(draw) -> live.RankWindow:
    """A window fed the way the ingester feeds one: rows one by one, in batches, or read back from the index."""
    w = live.RankWindow()
    n = draw(st.integers(0, 75))
    gpu = draw(st.sampled_from([0.0, 0.5, 1.0]))  # share of steps with a GPU record (1.0: the GPU clock)
    odd_ts = draw(st.booleans())
    t0 = draw(st.floats(0, 2e9))
    rows = []
    for step in range(1, n + 1):
        row = [None] * 24
        row[live.COL_STEP] = step
        row[live.COL_TS] = draw(_TS) if odd_ts and draw(st.booleans()) else t0 + step * draw(st.floats(0, 5))
        for c in (live.COL_STEP_MS, live.COL_INPUT_WAIT, live.COL_H2D, live.COL_FORWARD, live.COL_BACKWARD,
                  live.COL_OPTIMIZER, live.COL_DATA_WAIT, live.COL_DATA_IN_STEP):
            row[c] = draw(_TIMING)
        if gpu and draw(st.floats(0, 1)) < gpu:
            row[live.COL_GPU_STEP] = draw(st.floats(0.0, 1e3))
            for c in (live.COL_GPU_INPUT_WAIT, live.COL_GPU_H2D, live.COL_GPU_FORWARD, live.COL_GPU_BACKWARD,
                      live.COL_GPU_OPTIMIZER):
                row[c] = draw(_TIMING)
        row[live.COL_EXAMPLES] = 8 * step
        rows.append(tuple(row))
    how = draw(st.sampled_from(["rows", "batches"]))
    if how == "rows":
        for r in rows:
            w.add_row(r, 1)
    else:
        i = 0
        while i < len(rows):
            k = draw(st.integers(1, 40))
            w.add_rows(rows[i:i + k], len(rows[i:i + k]))
            i += k
    if draw(st.booleans()):
        w.figures()  # the window split some steps already: the arrays read every step's timings regardless
        for r in rows[-3:]:
            w.add_row((*r[:live.COL_STEP], r[live.COL_STEP] + n, *r[live.COL_STEP + 1:]), 1)
    return w


def _text(fig: dict) -> str:
    return json.dumps(fig)  # bit for bit: -0.0 and 0.0, and every float's repr, differ in the text


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(windows=st.lists(_window(), min_size=1, max_size=6))
def test_figures_on_arrays_are_the_windows_own_bit_for_bit(windows) -> None:
    fast = figures.figures_many(windows)
    assert [_text(f) for f in fast] == [_text(w.figures()) for w in windows]


def test_a_full_gpu_window_and_a_cpu_window_in_one_call() -> None:
    gpu, cpu = live.RankWindow(), live.RankWindow()
    for step in range(1, 80):
        row = [None] * 24
        row[live.COL_STEP], row[live.COL_TS], row[live.COL_EXAMPLES] = step, 100.0 + step * 0.5, step * 4
        row[live.COL_STEP_MS], row[live.COL_INPUT_WAIT], row[live.COL_FORWARD] = 10.0 + step % 7, 1.5, 4.0
        cpu.add_row(tuple(row), 1)
        row[live.COL_GPU_STEP], row[live.COL_GPU_INPUT_WAIT], row[live.COL_GPU_BACKWARD] = 9.0 + step % 5, 2.0, 3.0
        gpu.add_row(tuple(row), 1)
    got = figures.figures_many([gpu, cpu])
    assert [g["step_parts"]["clock"] for g in got] == ["gpu", "cpu"]
    assert got == [gpu.figures(), cpu.figures()]
    assert got[0]["step_parts"]["steps"] == live.WINDOW


def test_the_live_ingester_stores_the_windows_figures(tmp_path: Path) -> None:
    """A live ingester's ``rank_live`` rows carry, for every rank, what its window's own method computes."""
    root = tmp_path / "root"
    paths = {}
    for r in range(3):
        for k in range(4):
            paths[(r, k)] = p = steps_path(root / f"run{r}", k)
            append_raw(p, header_line(f"run{r}", k))
    ing = Ingester(tmp_path / "index.sqlite", [str(root)], use_inotify=False)
    try:
        ing.open()
        ing.live_settings()
        ing.store.agg.figures_every = 0.0  # figures on every write
        for step in range(1, 30):
            for (r, k), p in paths.items():
                append_raw(p, step_line(f"run{r}", k, step, step_ms=50.0 + (step * (k + 3)) % 17, ts=1000.0 + step))
            ing.scan()
            ing.poll(ing.plan.everything())
            ing.commit_pass()
        stored = {(name, rank): (med, wait, interval, json.loads(parts)) for name, rank, med, wait, interval, parts
                  in index_rows(tmp_path / "index.sqlite",
                                "SELECT r.name, l.rank, l.median_step_ms, l.median_input_wait_ms,"
                                " l.median_interval_s, l.step_parts FROM rank_live l JOIN runs r USING (run_id)")}
        windows = ing.store.agg.windows
        assert len(stored) == 12
        for (run_id, rank, _), w in windows.items():
            name = index_rows(tmp_path / "index.sqlite", "SELECT name FROM runs WHERE run_id = ?", (run_id,))[0][0]
            fig = w.figures()
            assert stored[(name, rank)] == (fig["median_step_ms"], fig["median_input_wait_ms"],
                                            fig["median_interval_s"], fig["step_parts"])
    finally:
        ing.close()
