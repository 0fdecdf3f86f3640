"""Hygiene on the watch screens (issue 11 item 7) and the Run screen's chart chooser and timing (item 6).

On the committed real runs (``tests/support/fixture_runs.py``): the ``hygiene`` run has
two receipts, a failed, a blocked, a stale-claimed and a pending request
(facts.json ``expected_backlog``) and declared early stopping off. The enabled
early-stopping state is made by the real :class:`EarlyStopping` over that run's
own receipts and put into its summary by the real ``validation_report``
(``fixture_runs.stop_hygiene_early``). The
ETA needs a live run with a declared step count: a synthetic one
(``tests/support/tui_data.py``), ingested by the real ingester.
"""

from __future__ import annotations

import json

import pytest

from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.backlog import BacklogScreen
from traceml_tui.tui.screens.backlog_request import BacklogRequestScreen
from traceml_tui.tui.screens.run_detail import RunScreen, timing
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.backlog_table import BacklogTable
from traceml_tui.tui.widgets.early_stopping_panel import EarlyStoppingPanel
from traceml_tui.tui.widgets.line_chart import LineChart

from support import fixture_runs as fr
from support import tui_data as d

pytestmark = pytest.mark.timeout(120)


aio = d.aio


@pytest.fixture
def source(committed_index):
    """A fresh source over the module's index of the committed runs (the App closes its source)."""
    src = IndexSource(committed_index[1], clock=lambda: fr.SHOWN_AT)
    yield src
    src.close()


@pytest.fixture
def stopped_source(tmp_path):
    """The committed runs with the hygiene run's summary carrying an early stop (fixture_runs.stop_hygiene_early)."""
    _, index = fr.build_real_index(tmp_path, prepare=fr.stop_hygiene_early)
    src = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    yield src
    src.close()


def run_id(app, case: str) -> int:
    return next(r.run_id for r in app.runs_snapshot.rows if r.name == fr.name_of(case))


async def open_run(pilot, case: str) -> RunScreen:
    await d.settle(pilot)
    pilot.app.open_run(run_id(pilot.app, case))
    await d.settle(pilot, rounds=3)
    screen = pilot.app.screen
    assert isinstance(screen, RunScreen)
    return screen


def chart_text(screen, selector: str) -> str:
    return screen.query_one(selector, LineChart).plain()


@aio
async def test_eval_chart_plots_receipts_failures_and_pending(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 60)) as pilot:
        screen = await open_run(pilot, "hygiene")
        detail = screen.detail
        # the backlog's receipts are points; failed and blocked requests ✗, stale-claimed and pending ▵
        by_step = {e.step: (e.status, e.value) for e in detail.evals}
        assert by_step == {0: ("completed", 0.5), 2: ("completed", 0.25), 4: ("failed", None),
                           6: ("failed", None), 8: ("pending", None), 10: ("pending", None)}
        assert detail.eval_metric_name == "mse"  # no loss among the receipts' metrics: the commonest, by name
        # the eval metric on its own axis, beside the train loss (different units)
        screen.query_one("#chart-eval").scroll_visible(animate=False)
        await d.settle(pilot, rounds=2)
        text = chart_text(screen, "#chart-eval")
        title, plot = text.splitlines()[0], "\n".join(text.splitlines()[1:])
        assert title.startswith("Eval mse") and "eval mse (2)" in title
        assert "▵ pending (2)" in title and "✗ failed (2)" in title
        assert plot.count("✗") == 2 and plot.count("▵") == 2 and plot.count("●") == 2
        assert chart_text(screen, "#chart-train").startswith("Train loss")


@aio
async def test_early_stopping_panel_declared_off(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 60)) as pilot:
        screen = await open_run(pilot, "hygiene")
        panel = screen.query_one(EarlyStoppingPanel)
        assert panel.display
        text = panel.render().plain
        assert "Early stopping" in text and "disabled — fixture run: a fixed 10 updates" in text


@aio
async def test_early_stopping_panel_is_hidden_without_hygiene(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 60)) as pilot:
        screen = await open_run(pilot, "completed")
        assert screen.detail.early_stopping is None and not screen.query_one(EarlyStoppingPanel).display


@aio
async def test_early_stopping_panel_from_the_summary(stopped_source):
    app = create_app(stopped_source, poll_interval=0.02)
    async with app.run_test(size=(120, 60)) as pilot:
        screen = await open_run(pilot, "hygiene")
        info = screen.detail.early_stopping
        assert info.source == "summary" and info.state == "stopped" and info.reason == "patience_exhausted"
        text = screen.query_one(EarlyStoppingPanel).render().plain
        assert "metric r2 (↓ lower is better) · patience 1/1 used, 0 left" in text
        assert "best: step-00000000 (step 0) r2=0.5" in text
        assert "stopped: patience exhausted at step-00000002" in text
        # the early-stopping metric is the one the eval chart plots
        assert screen.detail.eval_metric_name == "r2"


@aio
async def test_chart_chooser_cycles_metrics_and_ranks(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 60)) as pilot:
        screen = await open_run(pilot, "completed")
        detail = screen.detail
        assert detail.metrics[0] == "step_ms" and "loss" in detail.metrics and "ratio/mse" in detail.metrics
        assert chart_text(screen, "#chart-step").startswith("Step time per rank (ms)")
        assert len(detail.chart) == 2  # a two-rank DDP run: both ranks
        await pilot.press("c")
        await d.settle(pilot, rounds=2)
        assert screen.detail.chart_metric == detail.metrics[1]
        # walk to the train loss, then chart it for the rank under the cursor only
        while screen.detail.chart_metric != "loss":
            await pilot.press("c")
            await d.settle(pilot, rounds=2)
        assert chart_text(screen, "#chart-step").startswith("Train loss per rank")
        assert {s.name for s in screen.detail.chart} == {"rank 0", "rank 1"}
        await pilot.press("v")
        await d.settle(pilot, rounds=2)
        assert screen.detail.chart_rank == 0 and [s.name for s in screen.detail.chart] == ["rank 0"]
        assert chart_text(screen, "#chart-step").startswith("Train loss rank 0")
        await pilot.press("down")  # the chart follows the cursor to rank 1
        await d.settle(pilot, rounds=2)
        assert screen.detail.chart_rank == 1 and [s.name for s in screen.detail.chart] == ["rank 1"]
        loss = screen.detail.chart[0]
        assert loss.x and all(y is not None and y > 0 for y in loss.y)
        await pilot.press("v", "C")
        await d.settle(pilot, rounds=2)
        assert screen.detail.chart_rank is None
        assert screen.detail.chart_metric == detail.metrics[detail.metrics.index("loss") - 1]


@aio
async def test_header_start_and_duration(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 60)) as pilot:
        screen = await open_run(pilot, "hygiene")
        detail = screen.detail
        manifest = json.loads((fr.FIXTURE_RUNS / "hygiene" / "manifest.json").read_text())
        assert detail.started_at == manifest["started_at"] and detail.ended_at == manifest["ended_at"]
        assert detail.eta_s is None  # completed: no ETA
        line = timing(detail)
        assert line.startswith("started 2026-") and line.endswith("UTC · duration 3s")


def test_eta_of_a_live_run_with_declared_steps(tmp_path):
    root = tmp_path / "logs"
    d.write_run(root, "live", ranks=1, steps=10, declared=50, finished=False, evals=False)
    index = tmp_path / "index.sqlite"
    d.ingest(index, [root])
    src = IndexSource(index, clock=lambda: d.T0 + 2)
    try:
        runs = src.runs()
        row = runs.rows[0]
        assert row.status == "running" and row.step == 10 and row.declared_steps == 50 and row.steps_per_s
        detail = src.run_detail(row.run_id, runs)
        assert detail.eta_s == pytest.approx(40 / row.steps_per_s)
        line = timing(detail)
        assert "duration 2s" in line and "ETA 4s (to step 50 at" in line
    finally:
        src.close()


def test_a_guarded_run_past_its_window_shows_no_declared_end_and_trace_max_steps_is_the_end(tmp_path, cli_env,
                                                                                           traceml_cmd):
    """Real guarded runs (window steps 1-3, 6 steps recorded): the window's end is the least the run must reach,
    not its length — once past it, the Step column shows no ``/3`` (it read ``6/3``) and there is no ETA;
    ``--trace-max-steps 9`` is the run's declared end, shown as ``/9``."""
    import subprocess

    import yaml

    work = tmp_path / "work"
    work.mkdir()
    (work / "traceml.yaml").write_text(yaml.safe_dump({"guard": {
        "schema_version": 1, "workload": {"name": "w", "parameters": {"model": "m"}},
        "measurement": {"start_step": 1, "completed_steps": 3}}}))
    (work / "train.py").write_text("import traceml_tui as traceml\nfor _ in range(6):\n"
                                   "    with traceml.trace_step():\n        traceml.log(loss=1.0)\n")
    for name, extra in (("past", []), ("capped", ["--trace-max-steps", "9"])):
        proc = subprocess.run([*traceml_cmd, "run", "train.py", "--run-name", name, *extra], cwd=work, env=cli_env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    index = tmp_path / "index.sqlite"
    d.ingest(index, [work / "logs"])
    src = IndexSource(index)
    try:
        rows = {r.name: r for r in src.runs().rows}
        assert (rows["past"].step, rows["past"].declared_steps) == (6, None)
        assert (rows["capped"].step, rows["capped"].declared_steps) == (6, 9)
    finally:
        src.close()


@aio
async def test_backlog_metrics_blocked_and_request_detail(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(160, 30)) as pilot:
        await d.settle(pilot)
        pilot.app.open_backlog(run_id(pilot.app, "hygiene"))
        await d.settle(pilot, rounds=3)
        screen = pilot.app.screen
        assert isinstance(screen, BacklogScreen)
        assert screen.sub_title == f"validation backlog — {fr.name_of('hygiene')}"  # no QC request here
        table = screen.query_one(BacklogTable)
        keys = [c.key.value for c in table.ordered_columns]
        assert keys[keys.index("State") + 1:keys.index("State") + 3] == ["metric:mse", "metric:r2"]
        rows = {}
        for i in range(table.row_count):
            cells = [getattr(c, "plain", c) for c in table.get_row_at(i)]
            rows[cells[1]] = dict(zip(keys, cells))
        expected = fr.FACTS["hygiene"]["expected_backlog"]
        assert {k: d.strip_glyph(r["State"]) for k, r in rows.items()} == expected  # blocked is its own word
        assert rows["step-00000006"]["State"] == "✗ blocked"
        assert (rows["step-00000002"]["metric:mse"], rows["step-00000002"]["metric:r2"]) == ("0.25", "0.75")
        assert rows["step-00000010"]["metric:mse"] == "–"
        # Enter on the blocked request: its three attempts with their whole errors
        order = [getattr(table.get_row_at(i)[1], "plain", table.get_row_at(i)[1]) for i in range(table.row_count)]
        table.move_cursor(row=order.index("step-00000006"))
        await pilot.press("enter")
        await pilot.pause()
        modal = pilot.app.screen
        assert isinstance(modal, BacklogRequestScreen)
        text = str(modal.query_one("#request-text").render())
        assert "✗ blocked" in text and "Failed attempts (3)" in text
        for n in (1, 2, 3):
            assert f"attempt {n}" in text
        assert text.count("exit code 3: validator: simulated failure on step-00000006") == 3
        await pilot.press("escape")
        await pilot.pause()
        assert pilot.app.screen is screen


@aio
async def test_the_backlog_screen_says_it_lists_qc_requests_when_it_does(tmp_path):
    """The hygiene run with a heavy QC backlog made by the real code (fixture_runs.declare_worker_qc): the subtitle
    and the summary panel name both backlogs, not only validation's."""
    from traceml_tui.tui.widgets.info_panel import InfoPanel

    _, index = fr.build_real_index(tmp_path, prepare=lambda root: fr.declare_worker_qc(root, tmp_path))
    src = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    try:
        app = create_app(src, poll_interval=0.02)
        async with app.run_test(size=(160, 30)) as pilot:
            await d.settle(pilot)
            pilot.app.open_backlog(run_id(pilot.app, "hygiene"))
            await d.settle(pilot, rounds=3)
            screen = pilot.app.screen
            assert isinstance(screen, BacklogScreen) and screen.snapshot.qc_items
            assert screen.sub_title == f"validation and QC backlog — {fr.name_of('hygiene')}"
            assert screen.query_one("#backlog-summary", InfoPanel).data[0] == "Validation and QC backlog"
    finally:
        src.close()
