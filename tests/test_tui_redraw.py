"""`traceml watch` redraws only what changed (docs/watch.md "Cheap over SSH"), on the committed real runs.

Every repaint is bytes on the terminal's wire: a screen repainted whole once a second costs tens of KB/s over
SSH. These tests record which widgets ask to be repainted (``Widget.refresh``) while the app keeps applying
snapshots of data that did not change, and what a changed cell or title repaints. The bytes themselves are
measured in a real tmux by tests/benchmarks/bench_tui_bytes.py.
"""

from __future__ import annotations

import time

import pytest
from rich.text import Text
from textual.widget import Widget

from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.runs_table import RunsTable
from traceml_tui.tui.widgets.screen_header import FittedTitle, set_screen_title

from support import fixture_runs as fr
from support import tui_data as d

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("lasting_toasts")]

aio = d.aio


@pytest.fixture
def source(committed_index):
    """The real runs, seen by a clock that moves: each snapshot is a new one, as in a real watch."""
    index = committed_index[1]
    start = time.monotonic()
    src = IndexSource(index, clock=lambda: fr.SHOWN_AT + time.monotonic() - start)
    yield src
    src.close()


@pytest.fixture
def repaints(monkeypatch):
    """Every ``Widget.refresh`` call while ``repaints.on`` is set: (widget, regions, layout)."""
    calls: list = []
    original = Widget.refresh

    def recording(self, *regions, **kwargs):
        if recording.on:
            calls.append((self, regions, kwargs.get("layout", False)))
        return original(self, *regions, **kwargs)

    recording.on = False
    recording.calls = calls
    monkeypatch.setattr(Widget, "refresh", recording)
    return recording


async def run_first(pilot) -> RunScreen:
    await d.settle(pilot)
    await pilot.press("enter")
    for _ in range(400):
        if isinstance(pilot.app.screen, RunScreen):
            break
        await pilot.pause(0.02)
    await d.settle(pilot, 4)
    return pilot.app.screen


@aio
async def test_unchanged_snapshots_repaint_nothing_on_runs(source, repaints):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(160, 48)) as pilot:
        await d.settle(pilot, 4)
        await pilot.pause()
        repaints.on = True
        await d.settle(pilot, 6)  # six more snapshots of the same data (the worker rebuilds for the ages)
        repaints.on = False
        assert [(type(w).__name__, r, lay) for w, r, lay in repaints.calls] == []


@aio
async def test_unchanged_snapshots_repaint_no_chart_on_the_run_screen(source, repaints):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 50)) as pilot:
        run = await run_first(pilot)
        repaints.on = True
        await d.settle(pilot, 6)
        repaints.on = False
        assert [type(w).__name__ for w, _, _ in repaints.calls] == []
        # A chart whose data changes is still redrawn: the gate is not "never".
        repaints.calls.clear()
        repaints.on = True
        await pilot.press("c")
        await d.settle(pilot, 4)
        repaints.on = False
        chart = run.query_one("#chart-step")
        assert any(w is chart for w, _, _ in repaints.calls)


@aio
async def test_a_changed_cell_repaints_that_cell_only(source, repaints):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(160, 48)) as pilot:
        await d.settle(pilot, 4)
        table = app.screen.query_one(RunsTable)
        rows = table.table_rows
        err = table.COLUMNS.index("Err")
        key, cells = rows[1]
        changed = (key, cells[:err] + (Text("7", style="red"),) + cells[err + 1:])
        repaints.on = True
        table.table_rows = (rows[0], changed, *rows[2:])
        await pilot.pause()
        repaints.on = False
        mine = [(regions, layout) for w, regions, layout in repaints.calls if w is table]
        assert len(mine) == 1, mine
        (region,), layout = mine[0]
        assert not layout and region.height == 1 and region.width <= table.columns["Err"].get_render_width(table)
        assert str(table.get_cell(str(key), "Err")) == "7"
        assert [w for w, _, _ in repaints.calls if w is not table] == []  # nothing else


@aio
async def test_a_new_source_line_repaints_the_title_line_not_the_screen(source, repaints):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        screen = app.screen
        repaints.on = True
        set_screen_title(screen, "traceml watch · daemon pid 42 · commit 3s ago")
        await pilot.pause()
        repaints.on = False
        kinds = {type(w).__name__ for w, _, _ in repaints.calls}
        assert kinds == {"FittedTitle"}, kinds
        assert screen.title == "traceml watch · daemon pid 42 · commit 3s ago"
        assert "commit 3s ago" in str(screen.query_one(FittedTitle).render())
