"""`traceml watch` computes no figure and calls no App internals (docs/watch.md, "Architecture").

The source is a thin presenter over the reader's views; screens ask the App for what they need with typed
messages; snapshot messages coalesce. Each test fails when that layering is undone.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from traceml_tui.tui import messages
from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.snapshots import RunsSnapshot
from traceml_tui.tui.source import IndexSource

from support import fixture_runs as fr
from support import tui_data as d

TUI = Path(__file__).resolve().parents[1] / "traceml_tui" / "tui"

pytestmark = pytest.mark.timeout(120)


def test_the_source_is_a_thin_presenter():
    """≤ 350 lines, and no arithmetic of figures of its own: no statistics, no medians, no division."""
    text = (TUI / "source.py").read_text()
    assert len(text.splitlines()) <= 350
    tree = ast.parse(text)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"statistics", "math", "numpy"}, imported
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv))]


def test_screens_and_widgets_never_call_app_internals():
    """A screen posts a typed message (messages.py) instead of calling ``self.app._something``."""
    offenders = []
    for path in [*(TUI / "screens").glob("*.py"), *(TUI / "widgets").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "app"):
                offenders.append(f"{path.name}:{node.lineno} app.{node.attr}")
    assert not offenders


def test_snapshot_messages_coalesce_per_view():
    runs = RunsSnapshot((), 0.0, 1)
    assert messages.RunsUpdated(runs).can_replace(messages.RunsUpdated(runs))
    assert messages.RunUpdated(1, None).can_replace(messages.RunUpdated(1, None))
    assert not messages.RunUpdated(1, None).can_replace(messages.RunUpdated(2, None))
    assert messages.BacklogUpdated(("backlog", None), None).can_replace(messages.BacklogUpdated(("backlog", None), None))
    assert not messages.BacklogUpdated(("backlog", 1), None).can_replace(messages.BacklogUpdated(("backlog", 2), None))
    assert not messages.RunsUpdated(runs).can_replace(messages.RunUpdated(1, None))


def test_the_chart_chooser_reaches_the_refresh_worker_through_a_message(committed_index):
    """`c` on the Run screen posts ViewChanged; the App re-reads what is wanted and the chart follows."""
    _, index = committed_index
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)

    async def run() -> tuple[str, str]:
        app = create_app(source, poll_interval=0.02)
        async with app.run_test(size=(120, 40)) as pilot:
            await d.settle(pilot)
            pilot.app.open_run(next(r.run_id for r in pilot.app.runs_snapshot.rows if r.name == fr.name_of("completed")))
            await d.settle(pilot)
            assert isinstance(pilot.app.screen, RunScreen)
            before = pilot.app.screen.detail.chart_metric
            await pilot.press("c")
            for _ in range(200):
                detail = pilot.app.screen.detail
                if detail is not None and detail.chart_metric != before:
                    break
                await pilot.pause(0.02)
            return before, pilot.app.screen.detail.chart_metric

    try:
        before, after = asyncio.run(run())
    finally:
        source.close()
    assert before == "step_ms" and after != before
