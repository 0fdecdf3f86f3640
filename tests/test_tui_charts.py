"""The Run screen's charts (issue 23 items 1 and 2): braille line charts drawn by textual-plot, and the heatmap.

On the committed real runs (``tests/fixture_runs.py``), indexed by the real
ingester and shown by the real App. The stalled-step case is the real hung
DDP run copied and carried on the way its ranks would write
(``fixture_runs.extend``): 300 more steps 50 ms apart with one step that took
47 s in the middle.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.heatmap import ONE_RANK, Heatmap, shade, step_axis, stretch
from traceml_tui.tui.widgets.line_chart import (
    CLIP_QUANTILE,
    OUTLIER_GLYPH,
    ChartPlot,
    LineChart,
    thin,
    y_range,
)

from support import fixture_runs as fr
from support import tui_data as d
from support.lanes import examples

pytestmark = pytest.mark.timeout(120)
aio = d.aio
BRAILLE = {chr(c) for c in range(0x2801, 0x2900)}


@pytest.fixture
def source(committed_index):
    """A fresh source over the module's index of the committed runs (the App closes its source)."""
    src = IndexSource(committed_index[1], clock=lambda: fr.SHOWN_AT)
    yield src
    src.close()


def _stall_hung(root: Path) -> None:
    """The hung run's ranks carry on as the SDK writes them: 300 steps 50 ms apart (the gap since the previous
    step's end is the record's ``input_wait``, as ``fixture_runs.extend`` copies the rest), step 150 of them
    after a 47 s stop."""
    from traceml_tui.core import atomic

    for path in sorted((root / fr.name_of("hung")).glob("ranks/rank_*/steps-*.jsonl")):
        last = json.loads(path.read_bytes().splitlines()[-1])
        fd = atomic.open_append(path)
        try:
            for i in range(300):
                gap = 47.0 if i == 150 else 0.05
                last = dict(last, step=last["step"] + 1, ts=last["ts"] + gap,
                            cpu_ms=dict(last["cpu_ms"], input_wait=gap * 1000.0))
                atomic.append_line(fd, json.dumps(last).encode() + b"\n")
        finally:
            os.close(fd)


@pytest.fixture
def stalled_source(tmp_path):
    _, index = fr.build_real_index(tmp_path, prepare=_stall_hung)
    src = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    yield src
    src.close()


async def open_run(pilot, case: str) -> RunScreen:
    await d.settle(pilot)
    pilot.app.open_run(next(r.run_id for r in pilot.app.runs_snapshot.rows if r.name == fr.name_of(case)))
    await d.settle(pilot, rounds=3)
    assert isinstance(pilot.app.screen, RunScreen)
    return pilot.app.screen


def plot_rows(chart: LineChart) -> list[str]:
    """The chart's plot rows (inside the frame), without the title line and the axis margins."""
    return [line[8:] for line in chart.plain().splitlines()[2:] if "┃" in line or "┫" in line]


def braille_styles(chart: LineChart) -> set[str]:
    """The styles of the braille cells the plot drew (one per series drawn)."""
    canvas = chart.query_one(ChartPlot).query_one("#plot")
    styles = set()
    for y in range(canvas.size.height):
        for x in range(canvas.size.width):
            char, style = canvas.get_pixel(x, y)
            if char in BRAILLE:
                styles.add(str(style))
    return styles


# --------------------------------------------------------------------------- the y range (drawing rule)


finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(finite, min_size=1, max_size=300), st.lists(finite, max_size=2))
def test_y_range_contract(values, keep):
    lo, hi, cut = y_range(values, keep)
    assert lo < hi and math.isfinite(lo) and math.isfinite(hi)
    assert lo <= min(values) and all(lo <= k <= hi for k in keep)
    if cut is not None:  # only the top few are cut: the quantile and everything below it stay inside
        inside = sum(1 for v in values if v <= cut)
        assert lo < cut < hi and inside >= math.floor(CLIP_QUANTILE * len(values)) and max(values) > cut
        assert all(k <= cut for k in keep)
    else:
        assert hi >= max(values)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(finite, min_size=1, max_size=2000), st.integers(min_value=0, max_value=400))
def test_thin_keeps_every_extreme_and_at_most_two_points_a_column(ys, columns):
    import numpy as np

    x = np.arange(len(ys), dtype=float)
    y = np.asarray(ys, dtype=float)
    tx, ty = thin(x, y, columns)
    assert ty.max() == y.max() and ty.min() == y.min()  # no spike lost
    assert list(tx) == sorted(set(tx)) and set(tx) <= set(x)  # points of the series, in step order
    assert all(y[int(i)] == v for i, v in zip(tx, ty))
    if columns and len(ys) > 2 * columns:
        assert len(tx) <= 2 * columns
    else:
        assert len(tx) == len(ys)


def test_y_range_clips_one_stall_and_keeps_a_flat_series_readable():
    steps = [50.0 + (i % 7) for i in range(500)] + [47_000.0]
    lo, hi, cut = y_range(steps)
    assert cut is not None and hi < 100 and lo <= 50  # 500 steps keep the height; the stall is a marker above
    assert y_range([50.0 + (i % 7) for i in range(500)])[2] is None  # no outlier: nothing clipped
    lo, hi, cut = y_range([0.05] * 40)  # a constant lr: a band around it, not -0.45..0.55
    assert cut is None and 0.04 < lo < 0.05 < hi < 0.06


# --------------------------------------------------------------------------- the line charts on real runs


@aio
async def test_step_time_chart_is_braille_one_colour_per_rank(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_run(pilot, "completed")
        chart = screen.query_one("#chart-step", LineChart)
        text = chart.plain()
        assert text.startswith("Step time per rank (ms)") and "rank 0" in text and "rank 1" in text
        rows = plot_rows(chart)
        assert sum(1 for row in rows for ch in row if ch in BRAILLE) > 20  # joined braille lines, not glyphs
        assert "ms" in text.splitlines()[1] and "step" in text  # unit over the y axis, steps under the x axis
        assert len(braille_styles(chart)) == 2  # one colour per rank
        # ticks: at least three numbers on each axis
        ticks = [line[:8].strip() for line in text.splitlines()[2:] if line[:8].strip()]
        assert len([t for t in ticks if t.replace(".", "").isdigit()]) >= 3
        # the chart grows with the pane
        small = chart.query_one(ChartPlot).size.height
        await pilot.resize_terminal(160, 48)
        await d.settle(pilot, rounds=2)
        assert chart.query_one(ChartPlot).size.height > small


@aio
async def test_a_47s_stall_is_clipped_and_marked_not_flattening_the_rest(stalled_source):
    app = create_app(stalled_source, poll_interval=0.02)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_run(pilot, "hung")
        assert max(y for s in screen.detail.chart for y in s.y if y is not None) > 20_000  # the stall is there
        chart = screen.query_one("#chart-step", LineChart)
        title = chart.plain().splitlines()[0]
        assert f"{OUTLIER_GLYPH} " in title and " above " in title
        rows = plot_rows(chart)
        assert OUTLIER_GLYPH in rows[0]  # marked on the top edge
        # the 300 steps of 50 ms are drawn mid-height, not squashed into the bottom rows under a 47 s axis
        busiest = max(range(len(rows)), key=lambda i: sum(ch in BRAILLE for ch in rows[i]))
        assert 0 < busiest < len(rows) // 2
        # log scale on `y`: every point drawn, none clipped
        await pilot.press("y")
        await pilot.pause()
        title = chart.plain().splitlines()[0]
        assert "log scale" in title and " above " not in title
        await pilot.press("y")
        await pilot.pause()
        assert "log scale" not in chart.plain().splitlines()[0]


@aio
async def test_charts_redraw_only_when_their_data_changes_and_zoom_survives(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_run(pilot, "completed")
        chart = screen.query_one("#chart-step", LineChart)
        draws = chart.draws
        assert draws >= 1
        screen.detail = dataclasses.replace(screen.detail)  # a new snapshot holding the same data
        await d.settle(pilot, rounds=3)
        assert chart.draws == draws
        plot = chart.query_one(ChartPlot)
        plot.focus()
        await pilot.press("+")  # textual-plot's zoom
        await pilot.pause()
        assert plot.moved
        zoomed = (plot._x_min, plot._x_max)
        await pilot.press("c")  # another metric: redrawn, the zoomed view kept
        await d.settle(pilot, rounds=2)
        assert chart.draws > draws and (plot._x_min, plot._x_max) == zoomed
        await pilot.press("r")  # reset: back to the drawn range
        await pilot.pause()
        assert not plot.moved


# --------------------------------------------------------------------------- the heatmap


def test_stretch_and_axis_put_the_last_bucket_under_the_last_label():
    assert stretch([1, 2, 3], 7) == [1, 1, 1, 2, 2, 3, 3]
    assert stretch(list(range(10)), 4) == [0, 3, 6, 9]  # narrower: first and last bucket kept
    axis = step_axis(1, 60, 40)
    assert len(axis) == 40 and axis.startswith("step 1 ") and axis.endswith("step 60")
    assert shade(None) == "·" and shade(1.0) == " " and shade(1.1) == "░" and shade(1.6) == "█"


@aio
async def test_heatmap_fills_the_width_and_explains_its_scale(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await open_run(pilot, "completed")
        heat = screen.query_one(Heatmap)
        lines = heat.render().plain.splitlines()
        assert lines[1].startswith("step time ÷ the median rank's:  ░ ≥1.1×")
        rows = [line for line in lines if line.startswith(("r0 │", "r1 │"))]
        axis = lines[-1]
        assert len(rows) == 2 and all(len(row) == len(axis) for row in rows)  # cells reach the last label's end
        assert axis.rstrip().endswith(f"step {screen.detail.heat_steps[1]}") and len(axis) >= heat.size.width - 1
        assert "·" not in "".join(row[4:] for row in rows)  # both ranks have a value in every bucket


@aio
async def test_one_rank_run_says_so_instead_of_an_empty_heatmap(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await open_run(pilot, "completed_finish")
        assert len(screen.detail.ranks) == 1
        assert ONE_RANK in screen.query_one(Heatmap).render().plain

