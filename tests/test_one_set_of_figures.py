"""One set of figures per run on every surface, for runs made by the real thing.

Each case of ``tests/realruns.py`` (and a copy of the hygiene run whose manifest
declares early stopping, so that a best exists) is indexed by a real
``traceml daemon --once`` process. For each run, every figure shown by
``traceml status --json``, the Prometheus exposition of ``traceml daemon
--metrics`` and the Run screen of ``traceml watch`` — the run's step time, each
rank's step time and Δ, the straggler (slowest rank and score), steps/s, eval
lag and the early-stopping best — must be the same number: the reader's views
compute them once (``daemon/views.py``, ``core/straggler.py``). A surface with
a statistic or a rule of its own fails its row here. A run whose final summary
is current shows the summary's own figures: each rank's step time is its
summary row's to the last digit, and the straggler's size is the summary
verdict's, rounded the same (docs/contracts.md "One set of figures").
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from daemon.metrics import IndexCollector
from traceml_tui.core import straggler
from traceml_tui.tui import textplot
from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.early_stopping_panel import EarlyStoppingPanel, early_stopping_lines
from traceml_tui.tui.widgets.info_panel import InfoPanel
from traceml_tui.tui.widgets.rank_table import STEP_COLUMN, RankTable

from support import realruns
from support import tui_data as d

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: The hygiene run with the manifest's early stopping turned on (metric mse, lower is better) and without its
#: final summary, with the state its policy writes as it goes: what a live run that declared the policy shows.
DECLARED_ES = "hygiene_declared_es"
CASES = (*realruns.CASES, DECLARED_ES)
#: Cases whose figures must not be missing (a table of Nones would agree vacuously).
TWO_RANKS = {"completed", "rank_raises", "rank_sigkilled", "rank_exits", "all_exit", "teardown_crash", "hung", "hang",
             "straggler"}
WITH_EVAL = {"hygiene", DECLARED_ES}

#: (metric name, scale to the reader's unit) of the exposition's figures.
RUN_GAUGES = {"step_ms": ("traceml_run_step_time_median_seconds", 1000.0),
              "straggler_score": ("traceml_run_straggler_score", 1.0),
              "slowest_rank": ("traceml_run_slowest_rank", 1.0),
              "steps_per_s": ("traceml_run_steps_per_second", 1.0),
              "eval_lag": ("traceml_run_eval_lag_steps", 1.0)}


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_tui", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def _declared_copy(run: realruns.RealRun, tmp_path: Path) -> Path:
    """A copy of the real hygiene run, as it looked before its summary, with early stopping declared."""
    logs = tmp_path / "declared"
    copy = logs / run.run_dir.name
    shutil.copytree(run.run_dir, copy)
    for name in ("final_summary.json", "final_summary.txt"):
        (copy / name).unlink(missing_ok=True)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["hygiene"]["early_stopping"] = {"enabled": True, "metric": "mse", "direction": "min", "patience": 2,
                                             "min_delta": 0.0, "warmup": 0}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    # what training's policy would have written as it went: its own state over the run's real receipts
    # (early_stopping.json; the best is the policy's, core/stopping.py)
    from traceml_tui.hygiene.early_stopping import EarlyStopping

    EarlyStopping.from_config(copy, manifest["hygiene"]).update()
    assert (copy / "early_stopping.json").is_file()
    return logs


def _exposition(index: Path, at: float) -> dict[tuple[str, frozenset], float]:
    """The metrics a scrape of the index at ``at`` shows: {(name, labels): value}."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(IndexCollector(str(index), retention_s=1e12, clock=lambda: at))
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


async def _run_screen(index: Path, name: str, at: float) -> tuple[Any, str, dict[int, tuple[str, str]], list[str]]:
    """(the Run screen's snapshot, its headline facts line, {rank: (step cell, Δ cell)}, early-stopping lines), the
    app's clock at ``at``."""
    source = IndexSource(index, clock=lambda: at)
    app = create_app(source, poll_interval=0.02)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await d.settle(pilot)
            pilot.app.open_run(next(r.run_id for r in pilot.app.runs_snapshot.rows if r.name == name))
            await d.settle(pilot, rounds=3)
            screen = pilot.app.screen
            assert isinstance(screen, RunScreen) and screen.detail is not None
            facts = screen.query_one("#headline", InfoPanel).data[1][1]
            table = screen.query_one(RankTable)
            at = {c.key.value: i for i, c in enumerate(table.ordered_columns)}  # keys: the header names the statistic
            cells = {}
            for i in range(table.row_count):
                row = table.get_row_at(i)
                cells[int(str(row[at["Rank"]]))] = (str(row[at[STEP_COLUMN]]), str(row[at["Δ median"]]))
            panel = screen.query_one(EarlyStoppingPanel)
            lines = [ln[0] if isinstance(ln, tuple) else ln for ln in early_stopping_lines(panel.data)] \
                if panel.data is not None else []
            return screen.detail, facts, cells, lines
    finally:
        source.close()


def _same(*values: Optional[float]) -> bool:
    if all(v is None for v in values):
        return True
    return all(v is not None for v in values) and all(v == pytest.approx(values[0], rel=1e-9) for v in values)


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.realruns("hygiene" if c == DECLARED_ES else c))
                                  for c in CASES])
def test_status_json_metrics_and_run_screen_show_the_same_figures(case, real_runs, tmp_path, cli_env):
    run = real_runs["hygiene" if case == DECLARED_ES else case]
    logs = _declared_copy(run, tmp_path) if case == DECLARED_ES else run.logs_dir
    index = tmp_path / "index.sqlite"
    ingest = _cli(["daemon", str(logs), "--once", "--index", str(index), "--no-inotify"], cli_env)
    assert ingest.returncode == 0, ingest.stderr

    status = _cli(["status", "--json", "--index", str(index)], cli_env)
    assert status.returncode == 0, status.stderr
    (as_json,) = json.loads(status.stdout)["runs"]
    fig = as_json["figures"]
    ranks = {r["rank"]: r for r in as_json["ranks"] if r["latest"]}
    labels = {("run", as_json["name"]), ("run_id", str(as_json["run_id"]))}
    # One moment for every surface: a live run's rates fall with its silence (daemon/rates.py), so the surfaces
    # are asked at the time `traceml status` decided at (with no writer left: the index's last commit).
    at = json.loads(status.stdout)["writer"]["decided_at"]
    scrape = _exposition(index, at)

    def gauge(name: str, **extra: str) -> Optional[float]:
        return scrape.get((name, frozenset(labels | set(extra.items()))))

    detail, facts, cells, es_lines = asyncio.run(_run_screen(index, as_json["name"], at))
    row = detail.run

    # not vacuous: the figures each kind of run has are there
    if case in TWO_RANKS:
        assert fig["step_ms"] is not None and fig["slowest_rank"] is not None and fig["straggler_pct"] is not None
        assert len(ranks) == 2 and all(r["delta_pct"] is not None for r in ranks.values())
    if case in WITH_EVAL:
        assert fig["eval_lag"] is not None
    if case == DECLARED_ES:
        assert fig["early_stopping_best"] is not None

    # the run's figures: status --json, the metrics, the Run screen's snapshot and what its header shows
    for key, (metric, scale) in RUN_GAUGES.items():
        scraped = gauge(metric)
        assert _same(fig[key], None if scraped is None else scraped * scale), (key, fig[key], scraped)
    assert _same(fig["step_ms"], row.median_step_ms, as_json["step_ms"])
    word = "mean" if fig["step_time_source"] == "summary" else "median"  # the header names the statistic
    assert f"{word} {textplot.fmt_num(fig['step_ms'])} ms" in facts, facts
    assert (fig["slowest_rank"], fig["straggler"]) == (row.slowest_rank, row.straggler)
    assert _same(fig["straggler_score"], row.straggler_score) and _same(fig["straggler_pct"], row.straggler_pct)
    if fig["straggler_pct"] is not None:
        word = "straggler" if fig["straggler"] else "slowest"
        assert f"{word} r{fig['slowest_rank']} {fig['straggler_pct']:+.0f}%" in facts, facts
        assert gauge("traceml_run_straggler") == (1.0 if fig["straggler"] else 0.0)
    assert _same(fig["steps_per_s"], row.steps_per_s)
    assert f"{textplot.fmt_num(fig['steps_per_s'])} steps/s" in facts, facts
    assert fig["eval_lag"] == row.eval_lag and fig["eval_step"] == row.eval_step
    if fig["eval_lag"] is not None:
        assert f"eval @{fig['eval_step']} (lag {fig['eval_lag']})" in facts, facts

    # each rank's step time and Δ
    shown = {r.rank: r for r in detail.ranks}
    assert set(shown) == set(ranks) == set(cells)
    for rank, r in ranks.items():
        scraped_ms = gauge("traceml_rank_step_time_median_seconds", rank=str(rank))
        scraped_delta = gauge("traceml_rank_step_time_delta_ratio", rank=str(rank))
        assert _same(r["step_ms"], shown[rank].step_ms,
                     None if scraped_ms is None else scraped_ms * 1000.0), (rank, r, shown[rank], scraped_ms)
        assert _same(r["delta_pct"], shown[rank].delta_pct,
                     None if scraped_delta is None else scraped_delta * 100.0), (rank, r, shown[rank])
        step_cell, delta_cell = cells[rank]
        assert step_cell == textplot.fmt_num(r["step_ms"])
        assert delta_cell == ("–" if r["delta_pct"] is None else f"{r['delta_pct']:+.0f}%")
    # Δ and the straggler come from one rule over one statistic: the slowest rank's Δ is the straggler's skew
    found = straggler.spread((rank, r["step_ms"]) for rank, r in ranks.items())
    if found is not None and found.skew_pct is not None:
        assert _same(ranks[fig["slowest_rank"]]["delta_pct"], fig["straggler_pct"], found.skew_pct)
        assert _same(fig["step_ms"], found.median)

    # an ended run with a current final summary: every figure above is the summary's own, to the last digit, and
    # the straggler's size the summary's verdict's, rounded the same (docs/contracts.md "One set of figures")
    summary_path = Path(as_json["dir"]) / "final_summary.json"
    manifest = json.loads((Path(as_json["dir"]) / "manifest.json").read_text())
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    rows = {int(k): v["metrics"]["step_time_ms"] for k, v in summary["step_time"]["groups"]["rows"].items()
            if v["metrics"].get("step_time_ms") is not None} if summary is not None else {}
    if rows and manifest.get("status") != "running":
        assert fig["step_time_source"] == "summary" and row.step_statistic.kind == "summary"
        assert {rank: r["step_ms"] for rank, r in ranks.items() if rank in rows} == rows
        glob = summary["step_time"]["global"]
        assert fig["step_ms"] == glob["median"]["step_time_ms"]["value"]
        if fig["straggler_pct"] is not None:
            assert fig["slowest_rank"] == int(glob["worst"]["step_time_ms"]["idx"])
            size = f"{fig['straggler_pct']:+.0f}%"
            assert f"{ranks[fig['slowest_rank']]['delta_pct']:+.0f}%" == size
            issue = next((i for i in summary["step_time"]["issues"] if i["kind"] == "STRAGGLER"), None)
            assert fig["straggler"] == (issue is not None)
            if issue is not None:
                assert issue["ranks"] == [fig["slowest_rank"]] and f"{issue['skew_pct']:+.0f}%" == size
                assert f"straggler r{fig['slowest_rank']} {size}" in facts
    elif case in TWO_RANKS:
        assert fig["step_time_source"] == "rolling"

    # the early-stopping best
    best = fig["early_stopping_best"]
    es = detail.early_stopping
    if best is None:
        assert es is None or es.best_value is None
        assert not any(name == "traceml_run_early_stopping_best" for name, _ in scrape)
    else:
        assert (es.best_checkpoint, es.best_step, es.metric) == (best["checkpoint"], best["step"], best["metric"])
        assert _same(best["value"], es.best_value, gauge("traceml_run_early_stopping_best", metric=best["metric"]))
        assert gauge("traceml_run_early_stopping_best_step", metric=best["metric"]) == best["step"]
        assert any(f"{best['metric']}={textplot.fmt_num(best['value'], 4)}" in line for line in es_lines), es_lines
