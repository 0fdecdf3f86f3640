"""Pilot tests of `traceml watch` over a real index built by the real ingester."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.backlog import BacklogScreen
from traceml_tui.tui.screens.compare import CompareScreen
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.backlog_table import BacklogTable
from traceml_tui.tui.widgets.info_panel import InfoPanel
from traceml_tui.tui.widgets.rank_table import RankTable
from traceml_tui.tui.widgets.runs_table import RunsTable

from support import tui_data as d

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("lasting_toasts")]


aio = d.aio


def cells(table, row: int) -> list[str]:
    return [getattr(c, "plain", c) for c in table.get_row_at(row)]


def column(table, index: int) -> list[str]:
    return [cells(table, i)[index] for i in range(table.row_count)]


def panel_text(screen, selector: str) -> str:
    data = screen.query_one(selector, InfoPanel).data
    return "\n".join(line[0] if isinstance(line, tuple) else line for line in data[1])


@pytest.fixture(scope="session")
def fixture_built(tmp_path_factory):
    """The standard runs and their index, built once for every worker of the session (its tests read them,
    never write; session scope lets them spread over the workers: support/parallel.py)."""
    from support.parallel import built_once, changed_since_built

    folder = built_once(tmp_path_factory, "tui-fixture", d.build_fixture)
    yield folder / "logs", folder / "state" / "index.sqlite"
    changed = changed_since_built(folder)
    assert not changed, "tests changed the shared fixture runs (copy them before changing them):\n" + "\n".join(
        changed[:20])


@pytest.fixture
def fixture_index(fixture_built):
    """(root, index, a fresh source over the module's index): the App closes its source when it exits."""
    root, index = fixture_built
    source = IndexSource(index, clock=lambda: d.FIXED_NOW)
    yield root, index, source
    source.close()


@aio
async def test_empty_state_explains_why(tmp_path):
    (tmp_path / "logs").mkdir()
    index = tmp_path / "index.sqlite"
    # Before the daemon has created the index the screen says it is waiting.
    source = IndexSource(index, clock=lambda: d.FIXED_NOW)
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(80, 24)) as pilot:
        await d.settle(pilot)
        assert "waiting for the index" in str(pilot.app.screen.query_one("#runs-empty").render())
        d.ingest(index, [tmp_path / "logs"])  # the real ingester creates an empty index
        await d.settle(pilot)
        assert pilot.app.screen.query_one(RunsTable).row_count == 0
        assert "No runs yet" in str(pilot.app.screen.query_one("#runs-empty").render())
    source.close()


@aio
async def test_statuses_failed_and_stalled_rank_named(fixture_index):
    _, _, source = fixture_index
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        table = pilot.app.screen.query_one(RunsTable)
        keys = shown_columns(table)  # which columns show, and where, depends on the width
        by_name = {cells(table, i)[1]: dict(zip(keys, cells(table, i))) for i in range(table.row_count)}
        assert d.strip_glyph(by_name["bert-crash"]["Status"]) == "failed r1"  # as `traceml status` names it
        assert d.strip_glyph(by_name["vit-hang"]["Status"]) == "stalled r2"
        assert d.strip_glyph(by_name["resnet-ok"]["Status"]) == "completed"
        assert by_name["resnet-ok"]["Topo"] == "1×4"
        assert by_name["resnet-ok"]["Step"] == "60/60"
        assert by_name["resnet-ok"]["Backlog"] == "3"  # three requests without a receipt


@aio
async def test_stalled_run_screen_names_silent_rank(fixture_index):
    _, _, source = fixture_index
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 40)) as pilot:
        await d.settle(pilot)
        names = column(pilot.app.screen.query_one(RunsTable), 1)
        pilot.app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == "vit-hang"))
        await d.settle(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, RunScreen) and screen.detail is not None
        assert "STALLED r2" in panel_text(screen, "#headline")  # the ranks the Runs table names
        ranks = screen.query_one(RankTable)
        silent = [d.strip_glyph(c) for c in column(ranks, 2)]
        assert silent[2].startswith("STALLED") and not silent[0].startswith("STALLED")
        assert column(ranks, 3) == ["400", "400", "5"]
        assert "vit-hang" in names


@aio
async def test_failed_run_shows_outcome_reason_and_failed_rank(fixture_index):
    _, _, source = fixture_index
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 40)) as pilot:
        await d.settle(pilot)
        pilot.app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == "bert-crash"))
        await d.settle(pilot)
        screen = pilot.app.screen
        assert "FAILED" in panel_text(screen, "#headline")
        assert "node_training_failed" in panel_text(screen, "#outcomes")
        assert [d.status_word(c) for c in column(screen.query_one(RankTable), 2)] == ["completed", "failed"]


@aio
async def test_straggler_heatmap_marks_the_recurring_slow_rank(fixture_index):
    _, _, source = fixture_index
    run_id = next(r.run_id for r in source.runs().rows if r.name == "resnet-ok")
    detail = source.run_detail(run_id)
    # Rank 1 is 1.6x slower every 4th step: its row is the darkest one.
    dark = [sum(1 for v in row if v is not None and v > 1.2) for row in detail.heatmap]
    assert dark.index(max(dark)) == 1 and dark[0] == dark[2] == dark[3] == 0


@aio
async def test_run_appended_during_test_shows_new_steps_without_input(tmp_path):
    from daemon.service import Ingester

    root = tmp_path / "logs"
    root.mkdir()
    run = d.write_run(root, "live", ranks=1, steps=10, finished=False, evals=False)
    index = tmp_path / "index.sqlite"
    ingester = Ingester(index, [str(root)], poll_interval=0.05, use_inotify=False, mode="test")
    ingester.start()
    source = IndexSource(index, clock=lambda: d.T0 + 5, ingester=ingester)
    app = create_app(source, poll_interval=0.02)
    try:
        async with app.run_test(size=(100, 24)) as pilot:
            for _ in range(400):  # a loaded machine may not have composed the Runs screen yet (bounded wait)
                if pilot.app.screen.query(RunsTable):
                    break
                await pilot.pause(0.02)
            table = pilot.app.screen.query_one(RunsTable)
            for _ in range(300):
                await pilot.pause(0.02)
                if table.row_count and column_of(table, "Step")[0].startswith("10"):
                    break
            assert column_of(table, "Step")[0] == "10/10"
            d.append_steps(run, "live", 0, 11, 25)
            for _ in range(300):
                await pilot.pause(0.02)
                if column_of(table, "Step")[0].startswith("25"):
                    break
            assert column_of(table, "Step")[0] == "25"  # past its declared 10: no end shown
    finally:
        source.close()


@aio
async def test_filter_as_you_type_and_sort_by_column(fixture_index):
    _, _, source = fixture_index
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        await pilot.press("slash", "v", "i", "t")
        await pilot.pause()
        table = pilot.app.screen.query_one(RunsTable)
        assert column(table, 1) == ["vit-hang"]
        await pilot.press("escape")  # clears the filter
        await pilot.pause()
        await pilot.press("s", "s")  # sort by the second column: run name
        await pilot.pause()
        assert column(table, 1) == sorted(column(table, 1))
        await pilot.press("S")
        await pilot.pause()
        assert column(table, 1) == sorted(column(table, 1), reverse=True)


@aio
async def test_backlog_stuck_claim_stands_out(fixture_index):
    _, _, source = fixture_index
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        await pilot.press("b")
        await d.settle(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, BacklogScreen)
        table = screen.query_one(BacklogTable)
        keys = shown_columns(table)  # receipt metric columns come after State: read cells by column name
        rows = [dict(zip(keys, cells(table, i))) for i in range(table.row_count)]
        first = rows[0]
        # The stale claim (another host's, heartbeat older than its lease) is sorted first, with its owner.
        assert first["Checkpoint"] == "step-00000016" and d.status_word(first["State"]) == "stale-claim"
        assert first["Owner"] == "worker-b:777"
        assert first["Heartbeat"] == "7m/1m"
        states = [d.status_word(r["State"]) for r in rows]
        assert states.count("completed") == 2 and states.count("claimed") == 1 and states.count("failed") == 1
        summary = panel_text(screen, "#backlog-summary")
        assert "stale-claim: 1 claim" in summary
        assert "newest completed: step-00000008 (step 8)" in summary and "eval lag 52 steps" in summary
        failed = rows[states.index("failed")]
        assert failed["Retries"] == "2" and "out of memory" in failed["Last error"]


@aio
async def test_compare_slower_pair_matches_cli(tmp_path, cli_env, traceml_cmd):
    ref, cand = d.summary_pair(tmp_path)
    proc = subprocess.run(
        [*traceml_cmd, "compare", str(ref), str(cand), "--max-step-time-regression-pct", "5", "--format", "json",
         "--output", str(tmp_path / "out" / "cmp")],
        env=cli_env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 4, proc.stderr
    cli = json.loads((tmp_path / "out" / "cmp.json").read_text())["ci"]
    source = IndexSource(tmp_path / "none.sqlite", clock=lambda: d.FIXED_NOW)
    app = create_app(source, poll_interval=0.02, compare=(str(ref), str(cand)), threshold_pct=5.0)
    async with app.run_test(size=(100, 30)) as pilot:
        await d.settle(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, CompareScreen)
        snap = screen.snapshot
        assert (snap.result, snap.exit_code, snap.reason_code, snap.reason) == (
            cli["result"], cli["exit_code"], cli["reason_code"], cli["reason"])
        assert "SLOWER_IN_THIS_PAIR" in panel_text(screen, "#verdict")
        # A threshold set on the screen re-runs the same core: 40% tolerates +30%.
        await pilot.press("t")
        threshold = screen.query_one("#threshold")
        threshold.value = "40"
        await pilot.press("enter")
        await d.settle(pilot)
        assert screen.snapshot.result == "WITHIN_THRESHOLD_IN_THIS_PAIR"
        # `none` (as the flag takes it, docs/watch.md) is an exploratory comparison: no verdict
        await pilot.press("t")
        threshold.value = "none"
        await pilot.press("enter")
        await d.settle(pilot)
        assert screen.threshold_pct is None and screen.snapshot.result is None
    source.close()


def test_watch_rejects_bad_input(tmp_path, cli_env, traceml_cmd):
    missing = tmp_path / "nope"
    proc = subprocess.run([*traceml_cmd, "watch", str(missing)], env=cli_env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"traceml watch: {missing} is not a folder"
    proc = subprocess.run([*traceml_cmd, "watch", "--max-step-time-regression-pct", "-3", str(tmp_path)],
                          env=cli_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "negative" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # --compare with a name that is no file, no folder and no run anywhere: one line before any screen
    (tmp_path / "logs" / "real-run" / "ranks").mkdir(parents=True)
    (tmp_path / "logs" / "real-run" / "manifest.json").write_text("{}")
    proc = subprocess.run([*traceml_cmd, "watch", str(tmp_path / "logs"), "--compare", "real-run", "nope2"],
                          env=cli_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith("traceml watch: --compare nope2: not a summary file")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_watch_that_loses_the_lock_race_joins_the_winner(tmp_path, monkeypatch):
    """Two `traceml watch` started together both see no writer; the loser shows the winner's index."""
    from daemon import service
    from traceml_tui.tui import cli as watch_cli

    root = tmp_path / "logs"
    root.mkdir()
    index = tmp_path / "index.sqlite"
    winner = service.Ingester(index, [str(root)], mode="watch")
    winner.start()
    try:
        real_find = service.find_running_daemon
        calls = []

        def find_before_the_winner_locked(path):
            calls.append(path)
            return None if len(calls) == 1 else real_find(path)

        monkeypatch.setattr(service, "find_running_daemon", find_before_the_winner_locked)
        ingester, running = watch_cli._embed_or_join(service, index, [str(root)])
        assert ingester is None
        assert running is not None and running.mode == "watch" and running.roots == (str(root),)
        assert len(calls) == 2
    finally:
        winner.stop()


def test_headless_commands_do_not_import_textual():
    code = ("import sys, traceml_tui.cli, traceml_tui.tui.source, traceml_tui.tui.snapshots, "
            "traceml_tui.tui.textplot; print('textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


@aio
async def test_alert_when_a_run_fails_during_the_session(tmp_path):
    root = tmp_path / "logs"
    root.mkdir()
    run = d.write_run(root, "live", ranks=2, steps=10, finished=False, evals=False)
    index = tmp_path / "index.sqlite"
    d.ingest(index, [root])
    source = IndexSource(index, clock=lambda: d.T0 + 2)
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(100, 24)) as pilot:
        await d.settle(pilot)
        assert app.runs_snapshot.rows[0].status == "running"
        from traceml_tui.core import atomic, records

        path = run / "ranks" / "rank_1" / "steps-0.jsonl"
        fd = atomic.open_append(path)
        atomic.append_line(fd, records.encode(records.RankEnd(v=1, run="live", rank=1, attempt=0, step=10,
                                                              ts=d.T0 + 1.1, status="failed", exit_code=1)))
        import os

        os.close(fd)
        d.ingest(index, [root])
        for _ in range(200):
            await pilot.pause(0.02)
            if app.runs_snapshot.rows[0].status == "failed":
                break
        await pilot.pause()
        assert [n.message for n in app._notifications] == ["run live failed — rank 1 failed first"]
        await pilot.press("a")  # alerts off: the toggle itself is the only new notification
        assert [n.message for n in app._notifications][-1] == "alerts off"


@aio
async def test_mark_and_compare_two_runs_from_the_runs_screen(tmp_path):
    for name in ("ref-run", "cand-run"):
        d.write_run(tmp_path / "logs", name)
    d.summary_pair(tmp_path / "logs")
    index = tmp_path / "index.sqlite"
    d.ingest(index, [tmp_path / "logs"])
    source = IndexSource(index, clock=lambda: d.FIXED_NOW)
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        table = pilot.app.screen.query_one(RunsTable)
        names = column(table, 1)
        assert sorted(names) == ["cand-run", "ref-run"]
        table.move_cursor(row=names.index("ref-run"))
        await pilot.press("m")
        table.move_cursor(row=names.index("cand-run"))
        await pilot.press("c")
        await d.settle(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, CompareScreen)
        assert screen.snapshot.result == "SLOWER_IN_THIS_PAIR" and screen.snapshot.reference == "ref-run"
    source.close()


def test_the_tui_holds_no_sql():
    """The index is read only through daemon.reader (the arrows are also held by lint-imports)."""
    tui = Path(__file__).resolve().parents[1] / "traceml_tui" / "tui"
    for path in tui.rglob("*.py"):
        text = path.read_text()
        for word in ("sqlite3", "SELECT ", "INSERT ", "UPDATE ", " FROM "):
            assert word not in text, f"{path.name} holds {word.strip()!r}"


def test_compare_screen_shows_the_loss_ratio_of_real_summaries():
    """The loss-ratio row reads our own typed ``training`` section (it once looked for keys never written)."""
    from traceml_tui.tui.source import compare_snapshot

    from support import fixture_runs as fr

    ref = json.loads((fr.FIXTURE_RUNS / fr.name_of("completed") / "final_summary.json").read_text())
    cand = json.loads((fr.FIXTURE_RUNS / fr.name_of("rank_sigkilled") / "final_summary.json").read_text())
    rows = {row[0]: row for row in compare_snapshot(ref, cand, 5.0, ("ref", "cand")).rows}
    label = "Loss ratio (1.0 = no skill)"
    assert label in rows
    mse = ref["training"]["components"]["mse"]
    assert rows[label][1] != "–" and float(rows[label][1]) == pytest.approx(mse["ratio_recent_median"], rel=0.01)


def test_every_state_word_has_a_glyph():
    from traceml_tui.core.state import BacklogState, RankState, RunStatus
    from traceml_tui.tui import glyphs

    assert set(glyphs.RUN_GLYPHS) == {s.value for s in RunStatus}
    assert set(glyphs.RANK_GLYPHS) == {s.value for s in RankState}
    assert set(glyphs.BACKLOG_GLYPHS) == {s.value for s in BacklogState}
    assert glyphs.run_label("stalled") == "⚠ stalled" and glyphs.backlog_label("stale-claim") == "⚠ stale-claim"
    assert d.status_word("⚠ stalled r2") == "stalled" and d.strip_glyph("? LOST 2m") == "LOST 2m"


@aio
async def test_help_explains_columns_states_parts_and_keys(fixture_index):
    import io

    from rich.console import Console

    from traceml_tui.core import steptime
    from traceml_tui.core.state import BacklogState, RunStatus
    from traceml_tui.tui.screens.help import HelpScreen, help_renderable
    from traceml_tui.tui.screens.runs import RunsScreen
    from traceml_tui.tui.widgets.runs_table import COLUMNS

    _, _, source = fixture_index
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(100, 30)) as pilot:
        await d.settle(pilot)
        for close in ("escape", "question_mark", "q"):
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(pilot.app.screen, HelpScreen)
            assert pilot.app.screen.query_one("#help-text").region.height > 40  # the help is drawn, scrollable
            # the app hands help its own keys (help never imports the app): they are what "Everywhere" lists
            assert pilot.app.screen.app_bindings == tuple(type(pilot.app).BINDINGS)
            await pilot.press(close)
            await pilot.pause()
            assert isinstance(pilot.app.screen, RunsScreen), close
        assert pilot.app.is_running
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(help_renderable(type(app).BINDINGS))
    text = console.export_text()
    for label, _ in COLUMNS:
        assert label in text
    for word in (*RunStatus, *BacklogState):
        assert word.value in text
    for _, label in steptime.PARTS:
        assert label in text
    assert "Straggler" in text or "straggler" in text
    assert "1.0 = no better than predicting zero" in text
    for key in ("Filter", "Threshold", "Backlog", "Quit"):
        assert key in text


# -- Tables that stay put (issue 11): in-place updates, columns chosen by width, whole names, sort, the marked run.


def shown_columns(table) -> list[str]:
    """Column keys (the labels of the widget's COLUMNS) in display order."""
    return [c.key.value for c in table.ordered_columns]


def visible_columns(table) -> list[str]:
    """Columns wholly inside the table without scrolling."""
    x, out = 0, []
    for c in table.ordered_columns:
        x += c.get_render_width(table)
        if x <= table.scrollable_content_region.width:
            out.append(c.key.value)
    return out


def column_of(table, key: str) -> list[str]:
    """The cells of column ``key`` (as shown, plain text), top to bottom."""
    return column(table, shown_columns(table).index(key))


def headers(table) -> list[str]:
    return [c.label.plain for c in table.ordered_columns]


@aio
async def test_refresh_updates_rows_in_place_keeping_cursor_and_scroll(tmp_path):
    """A live run's refreshes change cells and the order, never the view: no clear, no snap back to column 0."""
    root = tmp_path / "logs"
    for k in range(24):
        d.write_run(root, f"done-{k:02d}", ranks=1, steps=3, evals=False, t0=d.T0 + k)
    live = d.write_run(root, "live", ranks=1, steps=3, finished=False, evals=False, t0=d.T0 - 600)
    index = tmp_path / "index.sqlite"
    d.ingest(index, [root])
    source = IndexSource(index, clock=lambda: d.T0 + 5)
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(80, 24)) as pilot:
        await d.settle(pilot)
        table = pilot.app.screen.query_one(RunsTable)
        names = column_of(table, "Run")
        assert names[-1] == "live"  # the least recent activity comes last
        table.move_cursor(row=names.index("done-03"))  # near the bottom: the table scrolls down
        await pilot.pause()
        table.scroll_to(x=table.max_scroll_x, animate=False)
        await pilot.pause()
        scroll_x, key = table.scroll_x, table.selected_key()
        on_screen = table.cursor_row - table.scroll_y  # the selected run's line in the view
        assert scroll_x > 0 and table.scroll_y > 0
        for last in (6, 9, 12):  # three refreshes with new data
            d.append_steps(live, "live", 0, last - 2, last, t0=d.T0 + 100)
            d.ingest(index, [root])
            for _ in range(300):
                await pilot.pause(0.02)
                if column_of(table, "Step")[0] == str(last):  # past the declared 3: no "/3"
                    break
            assert column_of(table, "Run")[0] == "live"  # moved to the top (latest activity first)
            assert column_of(table, "Step")[0] == str(last)
            assert table.scroll_x == scroll_x and table.cursor_row - table.scroll_y == on_screen
            assert table.selected_key() == key and column_of(table, "Run")[table.cursor_row] == "done-03"
    source.close()


@aio
async def test_columns_fit_the_width_attention_first_name_pinned(fixture_index):
    _, _, source = fixture_index
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(80, 24)) as pilot:
        await d.settle(pilot)
        table = pilot.app.screen.query_one(RunsTable)
        visible = visible_columns(table)
        for key in ("Status", "Run", "Step", "Steps/s", "Straggler", "Err"):
            assert key in visible, visible
        assert shown_columns(table)[:2] == ["Status", "Run"] and table.fixed_columns == 2
        # What does not fit follows to the right: every column is reachable by scrolling.
        assert set(shown_columns(table)) == set(RunsTable.COLUMNS) - {"Folder"}
        assert len(visible) < len(shown_columns(table)) and table.max_scroll_x > 0
        await pilot.resize_terminal(160, 30)
        await d.settle(pilot)
        assert visible_columns(table) == shown_columns(table)  # all fit at 160: the natural order
        assert shown_columns(table) == [k for k in RunsTable.COLUMNS if k != "Folder"]
        await pilot.resize_terminal(120, 30)
        await d.settle(pilot)
        assert set(visible) < set(visible_columns(table))  # wider: more columns fit
        pilot.app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == "vit-hang"))
        await d.settle(pilot)
        ranks = pilot.app.screen.query_one(RankTable)
        assert "Δ median" in visible_columns(ranks) and ranks.fixed_columns == 3


def clipped_words(table) -> list[tuple[int, str]]:
    """(line, word) for each word the table draws that is not a whole word of its own row's cells (or, on the
    header line, of the column labels): what a column cut by the edge of the view shows ("89" of "3.89")."""
    found = []
    for y in range(table.size.height):
        if y == 0:
            whole = {w for c in table.ordered_columns for w in c.label.plain.split()}
        else:
            row = y - 1 + int(table.scroll_y)
            if row >= table.row_count:
                continue
            whole = {w for c in cells(table, row) for w in str(c).split()}
        found += [(y, w) for w in table.render_line(y).text.split() if w not in whole]
    return found


@aio
async def test_scrolled_right_a_table_never_shows_part_of_a_column(committed_index):
    """At 80 columns the rank table and the Runs table, at every horizontal scroll position, draw only whole
    cells: a column cut by either edge of the view is blank (a cut "3.89" read "89"). The arrow keys scroll by
    whole columns, so the column beside the pinned ones starts at its first cell."""
    from support import fixture_runs as fr

    _, index = committed_index
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    app = create_app(source, poll_interval=0.02)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await d.settle(pilot)
            for screen, table_type in (("runs", RunsTable), ("run", RankTable)):
                if screen == "run":
                    pilot.app.open_run(next(r.run_id for r in app.runs_snapshot.rows
                                            if r.name == fr.name_of("completed")))
                    await d.settle(pilot)
                table = pilot.app.screen.query_one(table_type)
                assert table.max_scroll_x > 0  # not every column fits at 80 columns
                for x in range(int(table.max_scroll_x) + 1):
                    table.scroll_to(x=x, animate=False, immediate=True)
                    assert clipped_words(table) == [], (screen, x)
            ranks = table
            ranks.scroll_to(x=0, animate=False, immediate=True)
            await pilot.press("right")  # the rank table has the focus; its header, after the pinned columns:
            await pilot.pause()
            pinned = ranks._get_fixed_offset().left
            scrolling = ranks.ordered_columns[ranks.fixed_columns:]
            assert ranks.scroll_x == scrolling[0].get_render_width(ranks)
            label = scrolling[1].label.plain.split()
            assert ranks.render_line(0).text[pinned:].split()[:len(label)] == label
    finally:
        source.close()


@aio
async def test_the_backlog_shows_the_start_of_each_error_without_scrolling(committed_index):
    """Last error is cut at its end to the room the other columns leave (at 120 and at 80 columns): the start of
    a failed request's error is in view, not a blank column running past the edge (whole columns only)."""
    from traceml_tui.tui.widgets.backlog_table import BacklogTable

    from support import fixture_runs as fr

    _, index = committed_index
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    app = create_app(source, poll_interval=0.02)
    try:
        for width in (120, 80):
            async with app.run_test(size=(width, 24)) as pilot:
                await d.settle(pilot)
                pilot.app.open_backlog(next(r.run_id for r in app.runs_snapshot.rows
                                            if r.name == fr.name_of("hygiene")))
                await d.settle(pilot)
                table = pilot.app.screen.query_one(BacklogTable)
                if width == 80:  # the columns before it take the view: scrolled to the end, it is whole
                    table.scroll_to(x=table.max_scroll_x, animate=False, immediate=True)
                    await pilot.pause()
                shown = [table.render_line(y).text for y in range(1, table.row_count + 1)]
                # the fixture's backlog has one blocked and one failed request, each with its error
                assert sum("exit code 3: validator" in line for line in shown) == 2, (width, shown)
                assert clipped_words(table) == [], width
            app = create_app(source, poll_interval=0.02)
    finally:
        source.close()


@aio
async def test_compare_at_80_columns_shows_change_and_every_number_whole(committed_index):
    """Two real runs compared at 80×24: the Change column (the verdict's) is in view without scrolling, every
    number is whole, and what gave up room is text cut in the middle (a run name, a declaration, a label)."""
    from traceml_tui.tui.widgets.compare_table import CompareTable

    from support import fixture_runs as fr

    def is_number(text: str) -> bool:  # 4.34, +42.9%, 305.11 MiB
        try:
            float(text.split()[0].rstrip("%kMG"))
        except (IndexError, ValueError):
            return False
        return True

    root, index = committed_index
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    pair = (str(root / fr.name_of("completed")), str(root / fr.name_of("rank_sigkilled")))
    app = create_app(source, poll_interval=0.02, compare=pair, threshold_pct=5.0)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await d.settle(pilot)
            table = pilot.app.screen.query_one(CompareTable)
            assert visible_columns(table) == ["Field", "Reference", "Candidate", "Change"]
            assert table.max_scroll_x == 0 and "Change" in table.render_line(0).text.split()
            rows = pilot.app.screen.snapshot.rows
            assert any(r[3] for r in rows)  # some rows carry a change
            for i, row in enumerate(rows):
                shown = cells(table, i)
                assert shown[3] == row[3]
                for full, cut in zip(row, shown):
                    assert cut == full or (not is_number(full) and "…" in cut), (full, cut)
            assert any(cut != full for i, row in enumerate(rows) for full, cut in zip(row, cells(table, i)))
            assert clipped_words(table) == []
    finally:
        source.close()


def test_middle_cut_keeps_both_ends():
    from traceml_tui.core.rundir import middle_cut

    a, b = middle_cut("guard-candidate-20261130-133543", 18), middle_cut("guard-candidate-20261130-140102", 18)
    assert a == "guard-can…-133543" or (len(a) == 18 and a.endswith("-133543") and "…" in a)
    assert len(a) == 18 and a != b and b.endswith("140102")
    assert middle_cut("short", 18) == "short" and middle_cut("abc", 1) == "…"


@aio
async def test_long_and_repeated_names_stay_distinguishable_and_compare_picks_by_run(tmp_path):
    root = tmp_path / "logs"
    long_a = "guard-candidate-resnet50-imagenet-lr-sweep-20261130-133543"
    long_b = "guard-candidate-resnet50-imagenet-lr-sweep-20261130-140102"
    d.write_run(root, long_a, ranks=1, steps=5, evals=False)
    d.write_run(root, long_b, ranks=1, steps=5, evals=False, t0=d.T0 + 1)
    d.write_run(root / "exp1", "same", ranks=1, steps=5, evals=False, t0=d.T0 + 2)
    d.write_run(root / "exp2", "same", ranks=1, steps=9, evals=False, t0=d.T0 + 3)
    index = tmp_path / "index.sqlite"
    d.ingest(index, [root])
    source = IndexSource(index, clock=lambda: d.FIXED_NOW)
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(80, 24)) as pilot:
        await d.settle(pilot)
        table = pilot.app.screen.query_one(RunsTable)
        names, folders = column_of(table, "Run"), column_of(table, "Folder")
        cut = [n for n in names if "…" in n]
        assert len(cut) == 2 and cut[0] != cut[1]  # cut in the middle: the distinguishing ends stay
        assert {n[-6:] for n in cut} == {"133543", "140102"} and all(n.startswith("guard-") for n in cut)
        # Two runs named "same": the Folder column tells them apart.
        same = {folders[i]: i for i, n in enumerate(names) if n == "same"}
        assert set(same) == {"logs/exp1", "logs/exp2"}
        assert "Folder" in visible_columns(table)
        # `m` marks the run under the cursor (a glyph, also without colour); `c` compares by run, not by name.
        table.move_cursor(row=same["logs/exp1"])
        await pilot.press("m")
        await pilot.pause()
        marked = [n for n in column_of(table, "Run") if n.startswith("◆ ")]
        assert marked == ["◆ same"]
        assert "reverse" in str(table.get_row_at(same["logs/exp1"])[1].style)
        table.move_cursor(row=same["logs/exp2"])
        await pilot.press("c")
        await d.settle(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, CompareScreen)
        assert Path(screen.reference) == (root / "exp1" / "same").resolve()
        assert Path(screen.candidate) == (root / "exp2" / "same").resolve()
        await pilot.press("escape")
        await d.settle(pilot)
        # Filter by folder.
        await pilot.press("slash", *"exp2")
        await pilot.pause()
        assert column_of(table, "Run") == ["same"] and column_of(table, "Folder") == ["logs/exp2"]
    source.close()


@aio
async def test_sort_marker_reverse_default_and_attention_order(fixture_index):
    from traceml_tui.core.state import RUN_ATTENTION

    _, _, source = fixture_index
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        screen = pilot.app.screen
        table = screen.query_one(RunsTable)
        default = column_of(table, "Run")
        assert not any(m in h for h in headers(table) for m in "▲▼")
        await pilot.press("S")  # the default order turned round
        await pilot.pause()
        assert column_of(table, "Run") == default[::-1]
        assert "oldest activity first" in str(screen.query_one("#runs-empty").render())
        await pilot.press("o")
        await pilot.pause()
        assert column_of(table, "Run") == default
        await pilot.press("s")  # Status: the core's attention order, not the alphabet
        await pilot.pause()
        assert headers(table)[0] == "Status ▲"
        order = [RUN_ATTENTION.index(d.status_word(c)) for c in column_of(table, "Status")]
        assert order == sorted(order) and [d.status_word(c) for c in column_of(table, "Status")] == [
            "failed", "stalled", "completed"]
        await pilot.press("S")
        await pilot.pause()
        assert headers(table)[0] == "Status ▼" and column_of(table, "Run")[0] == "resnet-ok"
        for _ in range(len(RunsTable.COLUMNS) + 1):  # `s` goes through every column, then back to the default
            await pilot.press("s")
            await pilot.pause()
            if not any(m in h for h in headers(table) for m in "▲▼"):
                break
        assert column_of(table, "Run") == default
        # A click on a header sorts by that column, wherever the width put it.
        x = sum(c.get_render_width(table) for c in table.ordered_columns[:shown_columns(table).index("Step")])
        await pilot.click(RunsTable, offset=(x + 1, 0))
        await pilot.pause()
        assert headers(table)[shown_columns(table).index("Step")] == "Step ▲"
        steps = [int(s.split("/")[0]) for s in column_of(table, "Step")]
        assert steps == sorted(steps)


@aio
async def test_a_longer_cell_widens_its_column_in_place():
    """Auto-width columns grow when a cell updated in place gets longer (the text is never cut meanwhile)."""
    from textual.app import App

    from traceml_tui.tui.widgets.compare_table import CompareTable

    class One(App):
        def compose(self):
            yield CompareTable()

    async with One().run_test(size=(100, 10)) as pilot:
        table = pilot.app.query_one(CompareTable)
        table.table_rows = (("a", ("Step", "1", "2", "+0.0%")),)
        await pilot.pause()
        table.table_rows = (("a", ("Step", "1", "a much longer reference text", "+0.0%")),)
        await pilot.pause()
        assert table.columns[shown_columns(table)[2]].get_render_width(table) >= len("a much longer reference text")


@aio
async def test_a_cell_whose_style_alone_changes_is_redrawn():
    """rich Text equality ignores the style: an in-place update must still apply a new style to the same text."""
    from rich.text import Text
    from textual.app import App

    from traceml_tui.tui.widgets.compare_table import CompareTable

    class One(App):
        def compose(self):
            yield CompareTable()

    async with One().run_test(size=(100, 10)) as pilot:
        table = pilot.app.query_one(CompareTable)
        table.table_rows = (("a", ("Step", "1", "2", Text("+9%"))),)
        await pilot.pause()
        table.table_rows = (("a", ("Step", "1", "2", Text("+9%", style="red"))),)
        await pilot.pause()
        assert str(table.get_row_at(0)[3].style) == "red"


def test_delta_median_compares_each_ranks_median_with_the_median_ranks(committed_index):
    """Δ median is like against like: on a real 2-rank run without a summary (the hung one, still live to the
    index) each rank's median against the median rank's — by the summary's straggler rule (core/straggler.py: the
    lower median, so a 2-rank run's faster rank is the median rank at +0 % and the other is its skew) — whatever
    outlier step inflates the window's mean; on an ended run with its summary, each rank's mean over the summary's
    window against the median rank's (the summary's own statistic, docs/contracts.md "One set of figures")."""
    import json

    from daemon.reader import Reader
    from traceml_tui.core import straggler

    from support import fixture_runs as fr


    _, index = committed_index
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    try:
        with Reader(index) as reader:
            run = reader.find_run(fr.name_of("hung"))
            medians = {r.rank: r.median_step_ms for r in reader.rank_rows(run.run_id) if r.latest}
            ended = reader.find_run(fr.name_of("completed"))
        detail = source.run_detail(run.run_id)
        deltas = {r.rank: r.delta_pct for r in detail.ranks}
        ended_deltas = {r.rank: r.delta_pct for r in source.run_detail(ended.run_id).ranks}
    finally:
        source.close()
    rows = json.loads((fr.FIXTURE_RUNS / fr.name_of("completed") / "final_summary.json").read_text())
    means = {int(k): v["metrics"]["step_time_ms"] for k, v in rows["step_time"]["groups"]["rows"].items()}
    assert ended_deltas == pytest.approx({rank: (ms / min(means.values()) - 1) * 100 for rank, ms in means.items()})
    middle = straggler.spread(medians.items()).median
    assert middle == min(medians.values())
    assert deltas == pytest.approx({rank: (ms / middle - 1) * 100 for rank, ms in medians.items()})
    assert len(deltas) == 2 and min(deltas.values()) <= 0 <= max(deltas.values())
