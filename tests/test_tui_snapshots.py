"""Snapshot tests (pytest-textual-snapshot) of every `traceml watch` screen and state.

Deterministic: the committed real runs of ``tests/fixtures/runs/`` (written by
the real SDK and ``traceml run``; see ``tests/support/fixture_runs.py``), the real
ingester building the index with a fixed clock, a fixed clock injected into the
source. The straggler heatmap alone uses synthetic step times
(``tests/support/tui_data.py``): a real run cannot be made to straggle to the
millisecond. Regenerate after an intended change with
``pytest tests/test_tui_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

import pytest

from traceml_tui.tui.app import create_app
from traceml_tui.tui.source import IndexSource

from support import fixture_runs as fr
from support import tui_data as d

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("lasting_toasts")]



@pytest.fixture
def source(committed_index):
    """A fresh source over the module's index of the committed runs (the App closes its source)."""
    src = IndexSource(committed_index[1], clock=lambda: fr.SHOWN_AT)
    yield src
    src.close()


@pytest.fixture
def synthetic_source(tmp_path):
    _, index = d.build_fixture(tmp_path)
    src = IndexSource(index, clock=lambda: d.FIXED_NOW)
    yield src
    src.close()


def _open(name: str):
    async def run_before(pilot) -> None:
        await d.settle(pilot)
        if name:
            app = pilot.app
            app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == name))
            await d.settle(pilot)
    return run_before


def test_runs_screen(snap_compare, source):
    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(120, 24), run_before=_open(""))


def test_runs_screen_80x24(snap_compare, source):
    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(80, 24), run_before=_open(""))


def test_runs_screen_empty(snap_compare, tmp_path):
    (tmp_path / "logs").mkdir()
    d.ingest(tmp_path / "index.sqlite", [tmp_path / "logs"])
    src = IndexSource(tmp_path / "index.sqlite", clock=lambda: d.FIXED_NOW)
    try:
        assert snap_compare(create_app(src, poll_interval=0.02), terminal_size=(80, 24), run_before=_open(""))
    finally:
        src.close()


def test_run_screen_stalled(snap_compare, source):
    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(120, 50),
                        run_before=_open(fr.name_of("hung")))


def test_run_screen_failed(snap_compare, source):
    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(120, 50),
                        run_before=_open(fr.name_of("rank_raises")))


def test_run_screen_lost_rank(snap_compare, source):
    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(120, 50),
                        run_before=_open(fr.name_of("rank_sigkilled")))


def test_failure_panel(snap_compare, source):
    # 80×24: the failure panel (who, where, why) sits at the top of the Run screen, above the rank table
    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(80, 24),
                        run_before=_open(fr.name_of("rank_raises")))


def test_run_screen_straggler(snap_compare, synthetic_source):
    assert snap_compare(create_app(synthetic_source, poll_interval=0.02), terminal_size=(120, 50),
                        run_before=_open("resnet-ok"))


def test_backlog_screen_stale_and_blocked(snap_compare, source):
    async def run_before(pilot) -> None:
        await d.settle(pilot)
        await pilot.press("b")
        await d.settle(pilot)

    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(120, 24), run_before=run_before)


def test_backlog_screen_with_heavy_qc(snap_compare, tmp_path):
    """The hygiene run with a heavy QC backlog made by the real code (fixture_runs.declare_worker_qc): its QC
    requests beside validation's (the Kind column) and the worker-QC word from the index (docs/qc.md)."""
    _, index = fr.build_real_index(tmp_path, prepare=lambda root: fr.declare_worker_qc(root, tmp_path))
    src = IndexSource(index, clock=lambda: fr.SHOWN_AT)

    async def run_before(pilot) -> None:
        await d.settle(pilot)
        app = pilot.app
        app.open_backlog(next(r.run_id for r in app.runs_snapshot.rows if r.name == fr.name_of("hygiene")))
        await d.settle(pilot)

    try:
        assert snap_compare(create_app(src, poll_interval=0.02), terminal_size=(120, 24), run_before=run_before)
    finally:
        src.close()


def test_backlog_request_detail(snap_compare, source):
    """Enter on the hygiene run's blocked request: every failed attempt with its whole error."""
    async def run_before(pilot) -> None:
        await d.settle(pilot)
        app = pilot.app
        app.open_backlog(next(r.run_id for r in app.runs_snapshot.rows if r.name == fr.name_of("hygiene")))
        await d.settle(pilot)
        table = app.screen.query_one("#backlog")
        order = [str(getattr(c, "plain", c)) for c in (table.get_row_at(i)[1] for i in range(table.row_count))]
        table.move_cursor(row=order.index("step-00000006"))
        await pilot.press("enter")
        await d.settle(pilot)

    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(120, 30), run_before=run_before)


def test_run_screen_hygiene(snap_compare, source):
    """The hygiene run: receipts plotted as eval points, failures ✗, pending ▵; early stopping declared off."""
    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(120, 60),
                        run_before=_open(fr.name_of("hygiene")))


def test_early_stopping_panel(snap_compare, tmp_path):
    """An early stop recorded in the summary: metric, best checkpoint, patience used/left, the stop reason."""
    _, index = fr.build_real_index(tmp_path, prepare=fr.stop_hygiene_early)
    src = IndexSource(index, clock=lambda: fr.SHOWN_AT)

    async def run_before(pilot) -> None:
        await _open(fr.name_of("hygiene"))(pilot)
        pilot.app.screen.query_one("#run-body").scroll_end(animate=False)
        await d.settle(pilot)

    try:
        assert snap_compare(create_app(src, poll_interval=0.02), terminal_size=(120, 40), run_before=run_before)
    finally:
        src.close()


def test_run_screen_chart_chooser(snap_compare, source):
    """`c` twice then `v`: the third metric the index holds (step time, input wait, train loss) for the rank
    under the cursor."""
    async def run_before(pilot) -> None:
        await _open(fr.name_of("completed"))(pilot)
        assert pilot.app.screen.detail.metrics[:3] == ("step_ms", "input_wait_ms", "loss")
        for key in ("c", "c", "v"):
            await pilot.press(key)
            await d.settle(pilot)

    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(120, 40), run_before=run_before)


def test_compare_screen_slower(snap_compare, tmp_path):
    ref, cand = d.summary_pair(tmp_path)
    src = IndexSource(tmp_path / "none.sqlite", clock=lambda: d.FIXED_NOW)

    async def run_before(pilot) -> None:
        await d.settle(pilot)

    try:
        app = create_app(src, poll_interval=0.02, compare=(str(ref), str(cand)), threshold_pct=5.0)
        assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)
    finally:
        src.close()


def test_help_screen(snap_compare, source):
    async def run_before(pilot) -> None:
        await d.settle(pilot)
        await pilot.press("question_mark")
        await d.settle(pilot)

    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(100, 40), run_before=run_before)


def test_runs_screen_no_color(snap_compare, source, monkeypatch):
    # Textual reads NO_COLOR when the App is created (App.__init__) and renders monochrome: the glyphs carry the state.
    monkeypatch.setenv("NO_COLOR", "1")
    app = create_app(source, poll_interval=0.02)
    assert app.no_color
    assert snap_compare(app, terminal_size=(120, 24), run_before=_open(""))


def test_runs_screen_80x24_marked_sorted_scrolled_no_color(snap_compare, source, monkeypatch):
    """At 80×24 without colour: sorted by Status (▲ in its header), a marked reference (◆), scrolled right with
    Status and Run pinned."""
    monkeypatch.setenv("NO_COLOR", "1")

    async def run_before(pilot) -> None:
        await d.settle(pilot)
        await pilot.press("s", "down", "m")
        await d.settle(pilot)
        table = pilot.app.screen.query_one("#runs")
        table.scroll_to(x=table.max_scroll_x, animate=False)
        await d.settle(pilot)

    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(80, 24), run_before=run_before)


def _wait_for(predicate):
    async def wait(pilot) -> None:
        for _ in range(400):
            if predicate(pilot.app.screen):
                break
            await pilot.pause(0.02)
        await pilot.pause()
    return wait


def test_log_view(snap_compare, source):
    """The crash run's training log opens at rank 1's first error line (▶), lines labelled by node and rank."""
    async def run_before(pilot) -> None:
        await d.settle(pilot)
        app = pilot.app
        app.open_logs(next(r.run_id for r in app.runs_snapshot.rows if r.name == fr.name_of("rank_raises")))
        await _wait_for(lambda screen: getattr(screen, "reads", 0) >= 1)(pilot)

    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(120, 30), run_before=run_before)


def test_describe_view(snap_compare, source):
    """The hygiene run described: run, topology, guard contract, hygiene block, telemetry, versions."""
    async def run_before(pilot) -> None:
        await d.settle(pilot)
        app = pilot.app
        app.open_describe(next(r.run_id for r in app.runs_snapshot.rows if r.name == fr.name_of("hygiene")))
        await _wait_for(lambda screen: getattr(screen, "loaded", False))(pilot)

    assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(100, 60), run_before=run_before)
