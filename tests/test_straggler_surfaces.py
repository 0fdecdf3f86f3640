"""A real straggler, shown the same way everywhere: the Runs screen's Straggler cell, the Run screen (header,
Δ median, the summary's verdict line and diagnosis panel) and the final summary name the same slow rank and
the same size.

The ``straggler`` case of ``tests/support/realruns.py`` is two ranks under ``traceml run`` whose rank 1 sleeps
30 % longer each step; it is indexed by a real ``traceml daemon --once`` process and shown by the real Textual
app. The index's figure is each rank's median over its last 64 steps, the summary's each rank's mean over its
analysis window (one statistic per place, docs/contracts.md "One set of figures"), both judged by the one
straggler rule of ``core/straggler.py``: the same rank, and sizes a few points apart at most.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.core import straggler
from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.diagnosis_panel import DiagnosisPanel, diagnosis_text
from traceml_tui.tui.widgets.info_panel import InfoPanel
from traceml_tui.tui.widgets.rank_table import RankTable
from traceml_tui.tui.widgets.runs_table import RunsTable
from traceml_tui.tui.widgets.verdict_line import PENDING, VerdictLine, verdict_text

from support import tui_data as d

#: How far apart (percentage points) the index's median-based size and the summary's mean-based one may be:
#: two statistics of the same steps on a loaded machine.
SAME_SIZE_POINTS = 5.0


def _cells(table, key: str) -> dict[str, str]:
    """The row ``key`` of a table as {column label without its sort mark: cell text}."""
    labels = [c.label.plain.rstrip(" ▲▼") for c in table.ordered_columns]
    return dict(zip(labels, (str(getattr(v, "plain", v)) for v in table.get_row(key))))


async def _surfaces(index: Path, name: str) -> dict:
    source = IndexSource(index)
    app = create_app(source, poll_interval=0.02)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await d.settle(pilot)
            row = next(r for r in pilot.app.runs_snapshot.rows if r.name == name)
            runs_cell = _cells(pilot.app.screen.query_one(RunsTable), str(row.run_id))["Straggler"]
            pilot.app.open_run(row.run_id)
            await d.settle(pilot, rounds=3)
            screen = pilot.app.screen
            assert isinstance(screen, RunScreen) and screen.detail is not None
            ranks = screen.query_one(RankTable)
            verdict = screen.query_one(VerdictLine)
            panel = screen.query_one(DiagnosisPanel)
            return {
                "runs_cell": runs_cell,
                "facts": screen.query_one("#headline", InfoPanel).data[1][1],
                "deltas": {int(k.value): _cells(ranks, k.value)["Δ median"] for k in ranks.rows},
                "verdict_shown": verdict.display and verdict.region.height == 1,
                "verdict": verdict_text(*verdict.data).plain,
                "panel_shown": panel.display,
                "panel": diagnosis_text(panel.data).plain,
                "detail": screen.detail,
            }
    finally:
        source.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.realruns("straggler")
def test_the_runs_cell_the_run_screen_and_the_summary_name_the_same_straggler(real_runs, tmp_path, cli_env):
    run = real_runs["straggler"]
    summary = json.loads((run.run_dir / "final_summary.json").read_text())
    verdict = summary["primary_diagnosis"]
    assert verdict["status"] == "STRAGGLER" and verdict["ranks"] == [1]  # the case's slow rank, as built
    index = tmp_path / "index.sqlite"
    ingest = subprocess.run([sys.executable, "-m", "traceml_tui", "daemon", str(run.logs_dir), "--once", "--index",
                             str(index), "--no-inotify"], capture_output=True, text=True, env=cli_env, timeout=120)
    assert ingest.returncode == 0, ingest.stderr

    shown = asyncio.run(_surfaces(index, run.name))
    row = shown["detail"].run
    slow, pct = row.slowest_rank, row.straggler_pct
    assert row.straggler and slow == 1 and pct is not None
    size = f"{pct:+.0f}%"
    # the same rank and the same size, in the same words, on both screens
    assert shown["runs_cell"] == f"r{slow} {size}"
    assert f"straggler r{slow} {size}" in shown["facts"], shown["facts"]
    assert shown["deltas"][slow] == size and shown["deltas"][0] == "+0%"
    # ... and the summary's verdict names that rank with a size a few points from it (its own statistic)
    assert verdict["ranks"] == [slow]
    assert abs(verdict["skew_pct"] - pct) <= SAME_SIZE_POINTS, (verdict["skew_pct"], pct)
    assert f"Rank {slow} is {verdict['skew_pct']:.0f}% slower" in verdict["summary"]
    # the verdict is drawn near the top of the Run screen in the summary's own words, and every issue in the panel
    assert shown["verdict_shown"]
    assert shown["verdict"] == f"Verdict: {verdict['status']} — {verdict['summary']} Next: {verdict['action']}"
    card = summary["text"].splitlines()
    assert f"Verdict: {verdict['status']} — {verdict['summary']}" in card
    assert shown["panel_shown"]
    for issue in summary["step_time"]["issues"]:
        assert f"{issue['status']}  {issue['summary']}" in shown["panel"] and issue["action"] in shown["panel"]
    # one rule: the index's spread over the ranks' medians says what the screens say
    found = straggler.spread((r.rank, r.step_ms) for r in shown["detail"].ranks)
    assert (found.worst_key, found.skew_pct) == (slow, pytest.approx(pct))


def test_a_live_run_says_its_verdict_comes_at_the_end_and_an_ended_run_without_a_summary_says_nothing():
    assert verdict_text(None, live=True).plain == PENDING
    assert verdict_text(None, live=False) is None

