"""A straggler, shown the same way everywhere: the Runs screen's Straggler cell, the Run screen (header, Δ median,
the summary's verdict line and diagnosis panel), ``traceml status --json``, the Prometheus exposition and the final
summary name the same slow rank and the same size, to the rounded percent.

An ended run with a current final summary shows the summary's own statistic (each rank's mean over its analysis
window, read back from ``step_time.groups.rows``) through the very function its ``STRAGGLER`` verdict called
(``core.straggler.rows_spread``): docs/contracts.md "One set of figures". Cases:

* the committed ``rank-raises`` real run (4 steps, ``tests/fixtures/runs``): its rolling medians say another size
  than its summary (``+42%`` against ``17% slower``), the disagreement this guards;
* fresh real runs of the ``straggler`` case (two ranks under ``traceml run``, rank 1 sleeps 30 % longer each step)
  and of ``rank_raises``, indexed by a real ``traceml daemon --once`` process and shown by the real Textual app.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from daemon.reader import Reader
from traceml_tui.core import straggler
from traceml_tui.tui import textplot
from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.diagnosis_panel import DiagnosisPanel, diagnosis_text
from traceml_tui.tui.widgets.info_panel import InfoPanel
from traceml_tui.tui.widgets.rank_table import STEP_COLUMN, RankTable
from traceml_tui.tui.widgets.runs_table import RunsTable
from traceml_tui.tui.widgets.verdict_line import PENDING, VerdictLine, verdict_text

from support import fixture_runs as fr
from support import tui_data as d


def _cells(table, key: str) -> dict[str, str]:
    """The row ``key`` of a table as {column label without its sort mark: cell text}."""
    labels = [c.label.plain.rstrip(" ▲▼") for c in table.ordered_columns]
    return dict(zip(labels, (str(getattr(v, "plain", v)) for v in table.get_row(key))))


async def _surfaces(index: Path, name: str, at: Optional[float] = None) -> dict:
    source = IndexSource(index) if at is None else IndexSource(index, clock=lambda: at)
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
            cells = {int(k.value): _cells(ranks, k.value) for k in ranks.rows}
            return {
                "runs_cell": runs_cell,
                "facts": screen.query_one("#headline", InfoPanel).data[1][1],
                "deltas": {rank: c["Δ median"] for rank, c in cells.items()},
                "step_cells": {rank: c.get("mean step ms") for rank, c in cells.items()},
                "step_header": [c.label.plain for c in ranks.ordered_columns][4],
                "verdict_shown": verdict.display and verdict.region.height == 1,
                "verdict": verdict_text(*verdict.data).plain,
                "panel_shown": panel.display,
                "panel": diagnosis_text(panel.data).plain,
                "detail": screen.detail,
            }
    finally:
        source.close()


def _status_json(index: Path, env: dict) -> dict:
    status = subprocess.run([sys.executable, "-m", "traceml_tui", "status", "--json", "--index", str(index)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert status.returncode == 0, status.stderr
    return json.loads(status.stdout)


def _exposition(index: Path, at: float) -> dict[tuple[str, frozenset], float]:
    """What a scrape of the index at ``at`` shows: {(name, labels): value}."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import CollectorRegistry

    from daemon.metrics import IndexCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(IndexCollector(str(index), retention_s=1e12, clock=lambda: at))
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples}


def _one_size(summary: dict, shown: dict, as_json: dict, scrape: dict) -> str:
    """Every surface names the summary's slowest rank with the summary's size, rounded the same; returns it."""
    step_time = summary["step_time"]
    worst, median = step_time["global"]["worst"]["step_time_ms"], step_time["global"]["median"]["step_time_ms"]
    slow, mid = int(worst["idx"]), int(median["idx"])
    assert slow != mid, "a run of two ranks or more with step times"
    skew = (worst["value"] - median["value"]) / median["value"] * 100.0
    size = f"{skew:+.0f}%"
    issue = next((i for i in step_time["issues"] if i["kind"] == "STRAGGLER"), None)
    word = "straggler" if issue is not None else "slowest"
    rows = {int(k): v["metrics"]["step_time_ms"] for k, v in step_time["groups"]["rows"].items()}

    # the Runs screen and the Run screen: cell, header, Δ median, and the statistic named in the column header
    assert shown["runs_cell"] == f"r{slow} {size}", (shown["runs_cell"], size)
    assert f"{word} r{slow} {size}" in shown["facts"], shown["facts"]
    assert shown["deltas"][slow] == size and shown["deltas"][mid] == "+0%", shown["deltas"]
    assert shown["step_header"] == "mean step ms" and f"mean {textplot.fmt_num(median['value'])} ms" in shown["facts"]
    assert shown["step_cells"] == {rank: textplot.fmt_num(ms) for rank, ms in rows.items()}
    run = shown["detail"].run
    assert (run.slowest_rank, run.straggler, run.step_statistic.kind) == (slow, issue is not None, "summary")
    # the summary's verdict: the same rank and the same rounded size, drawn near the top of the Run screen
    if issue is not None:
        assert issue["ranks"] == [slow] and f"{issue['skew_pct']:+.0f}%" == size
        assert f"Rank {slow} is {issue['skew_pct']:.0f}% slower" in issue["summary"]
    verdict = summary["primary_diagnosis"]
    assert shown["verdict_shown"]
    assert shown["verdict"] == f"Verdict: {verdict['status']} — {verdict['summary']} Next: {verdict['action']}"
    assert shown["panel_shown"]
    for each in step_time["issues"]:
        assert f"{each['status']}  {each['summary']}" in shown["panel"] and each["action"] in shown["panel"]

    # `traceml status --json`: the figures and every rank's step time are the summary's, to the last digit
    fig = as_json["figures"]
    assert fig["step_time_source"] == "summary" and "analysis window" in fig["step_time_statistic"]
    assert (fig["slowest_rank"], fig["straggler"], f"{fig['straggler_pct']:+.0f}%") == (slow, issue is not None, size)
    assert fig["step_ms"] == median["value"]
    latest = {r["rank"]: r for r in as_json["ranks"] if r["latest"]}
    assert {rank: r["step_ms"] for rank, r in latest.items()} == rows
    assert f"{latest[slow]['delta_pct']:+.0f}%" == size

    # the metrics exposition
    labels = {("run", as_json["name"]), ("run_id", str(as_json["run_id"]))}

    def gauge(name: str, **extra: str) -> Optional[float]:
        return scrape.get((name, frozenset(labels | set(extra.items()))))

    assert gauge("traceml_run_slowest_rank") == slow
    assert gauge("traceml_run_straggler") == (1.0 if issue is not None else 0.0)
    assert gauge("traceml_run_step_time_final") == 1.0
    assert gauge("traceml_run_straggler_score") == pytest.approx(worst["value"] / median["value"], rel=1e-12)
    assert f"{gauge('traceml_rank_step_time_delta_ratio', rank=str(slow)) * 100:+.0f}%" == size
    for rank, ms in rows.items():
        assert gauge("traceml_rank_step_time_median_seconds", rank=str(rank)) == pytest.approx(ms / 1000, rel=1e-12)
    return size


def test_the_committed_rank_raises_run_says_the_summarys_size_on_every_surface(tmp_path, cli_env):
    """The committed 4-step run whose rolling medians (+42 %) disagreed with its verdict (17 % slower)."""
    _, index = fr.build_real_index(tmp_path)
    name = fr.name_of("rank_raises")
    summary = json.loads((fr.FIXTURE_RUNS / name / "final_summary.json").read_text())
    (as_json,) = [r for r in _status_json(index, cli_env)["runs"] if r["name"] == name]
    shown = asyncio.run(_surfaces(index, name, fr.SHOWN_AT))
    size = _one_size(summary, shown, as_json, _exposition(index, fr.SHOWN_AT))
    assert size == "+17%" and summary["primary_diagnosis"]["status"] == "STRAGGLER"
    # not vacuous: the rolling statistic of the same run says another size (what the surfaces showed before)
    rolling = straggler.spread((r["rank"], r["median_step_ms"]) for r in as_json["ranks"] if r["latest"])
    assert f"{rolling.skew_pct:+.0f}%" != size


def test_a_resumed_run_whose_summary_is_not_current_keeps_the_rolling_statistic(tmp_path):
    """While a launcher is at work on a run again (the manifest says ``running``), its summary is the previous
    attempt's: the figures are the rolling medians, named so (core.state.summary_is_current)."""
    def resume(root: Path) -> None:
        path = root / fr.name_of("rank_raises") / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["status"] = "running"
        path.write_text(json.dumps(manifest))

    _, index = fr.build_real_index(tmp_path, prepare=resume)
    with Reader(index) as reader:
        run = next(r for r in reader.list_runs(now=fr.SHOWN_AT) if r.name == fr.name_of("rank_raises"))
        figures = reader.figures(run, fr.SHOWN_AT)
        rows = reader.rank_rows(run.run_id, fr.SHOWN_AT)
        views = reader.rank_views(run, rows)
    assert run.step_statistic.kind == "rolling" and figures.to_json()["step_time_source"] == "rolling"
    assert figures.statistic.startswith("median step time over")
    assert {v.rank: v.step_ms for v in views} == {r.rank: r.median_step_ms for r in rows if r.latest}
    found = straggler.spread((v.rank, v.step_ms) for v in views)
    assert (run.slowest_rank, run.straggler_pct) == (found.worst_key, found.skew_pct)


@pytest.mark.parametrize("damage", [
    lambda st: st["groups"].update(rows="not rows"),
    lambda st: [row["metrics"].update(step_time_ms="7 ms") for row in st["groups"]["rows"].values()],
    lambda st: st.update(groups=None, **{"global": [1, 2]}),
])
def test_a_summary_whose_step_rows_do_not_read_leaves_the_rolling_statistic_and_the_other_runs(tmp_path, damage):
    """Untrusted bytes: a final summary whose ``step_time`` rows are not the published layout is not read as
    figures — that run keeps its rolling medians (named so), and every other run still shows its summary's."""
    def spoil(root: Path) -> None:
        path = root / fr.name_of("rank_raises") / "final_summary.json"
        summary = json.loads(path.read_text())
        damage(summary["step_time"])
        path.write_text(json.dumps(summary))

    _, index = fr.build_real_index(tmp_path, prepare=spoil)
    with Reader(index) as reader:
        runs = {r.name: r for r in reader.list_runs(now=fr.SHOWN_AT)}
        spoiled = runs[fr.name_of("rank_raises")]
        views = reader.rank_views(spoiled, reader.rank_rows(spoiled.run_id, fr.SHOWN_AT))
    assert spoiled.step_statistic.kind == "rolling" and all(v.step_ms is not None for v in views)
    assert runs[fr.name_of("rank_sigkilled")].step_statistic.kind == "summary"
    assert runs[fr.name_of("completed")].step_statistic.kind == "summary"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.realruns(c)) for c in ("straggler", "rank_raises")])
def test_a_real_run_says_its_summarys_straggler_size_on_every_surface(case, real_runs, tmp_path, cli_env):
    run = real_runs[case]
    summary = json.loads((run.run_dir / "final_summary.json").read_text())
    if case == "straggler":  # the case's slow rank, as built
        assert summary["primary_diagnosis"]["status"] == "STRAGGLER" and summary["primary_diagnosis"]["ranks"] == [1]
    index = tmp_path / "index.sqlite"
    ingest = subprocess.run([sys.executable, "-m", "traceml_tui", "daemon", str(run.logs_dir), "--once", "--index",
                             str(index), "--no-inotify"], capture_output=True, text=True, env=cli_env, timeout=120)
    assert ingest.returncode == 0, ingest.stderr
    status = _status_json(index, cli_env)
    (as_json,) = status["runs"]
    at = status["writer"]["decided_at"]
    shown = asyncio.run(_surfaces(index, run.name, at))
    _one_size(summary, shown, as_json, _exposition(index, at))
    assert STEP_COLUMN == "p50 step ms"  # the live statistic's header, which an ended run's replaces


def test_a_live_run_says_its_verdict_comes_at_the_end_and_an_ended_run_without_a_summary_says_nothing():
    assert verdict_text(None, live=True).plain == PENDING
    assert verdict_text(None, live=False) is None
