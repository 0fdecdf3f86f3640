"""`traceml watch` keys as terminal users expect them (docs/watch.md "Keys"), on the committed real runs.

One pilot test per rule: the footer names each screen's main actions (Open, Log, Describe, Compare, Back)
within 80 columns; j/k/g/G and Home/End move in every list; q goes back everywhere but on Runs, where it
quits, and Ctrl+C always quits; PageDown scrolls the Run screen while the rank table has the focus; the
sort picker reaches any column in one step; `m` then `c` on the same run says so; Help opens on the keys of
the screen it was opened from.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from traceml_tui.tui.app import WatchApp, create_app
from traceml_tui.tui.screens.compare import CompareScreen
from traceml_tui.tui.screens.describe import DescribeScreen
from traceml_tui.tui.screens.help import HelpScreen, help_renderable
from traceml_tui.tui.screens.logs import LogScreen
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.screens.runs import RunsScreen
from traceml_tui.tui.screens.sort_picker import SortList, SortPicker
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.describe_tree import DescribeTree
from traceml_tui.tui.widgets.log_view import LogView
from traceml_tui.tui.widgets.rank_table import RankTable
from traceml_tui.tui.widgets.runs_table import COLUMNS, RunsTable

from support import fixture_runs as fr
from support import tui_data as d

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("lasting_toasts")]

aio = d.aio


@pytest.fixture
def source(committed_index):
    """A fresh source over the module's index of the committed runs (the App closes its source)."""
    src = IndexSource(committed_index[1], clock=lambda: fr.SHOWN_AT)
    yield src
    src.close()


def footer_words(app) -> list[str]:
    """The footer's descriptions drawn whole, left to right: those that end before the palette key (docked at
    the right, it covers whatever runs under it)."""
    keys = sorted(app.screen.query("FooterKey"), key=lambda k: k.region.x)
    palette = next(k for k in keys if str(k.description) == "palette")
    return [str(k.description) for k in keys
            if k is not palette and k.region.width and k.region.right <= palette.region.x]


async def wait_for(pilot, condition, limit: int = 400) -> None:
    """Wait until ``condition()`` holds (bounded; never a fixed sleep)."""
    for _ in range(limit):
        if condition():
            return
        await pilot.pause(0.02)
    assert condition()


async def open_first_run(pilot) -> RunScreen:
    await d.settle(pilot)
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunScreen))
    await d.settle(pilot)
    return pilot.app.screen


@aio
async def test_footers_name_the_main_actions_at_80_columns(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(80, 24)) as pilot:
        await d.settle(pilot)
        await pilot.pause()
        words = footer_words(app)
        # Enter was shadowed by the DataTable's own hidden binding: the footer never said Open.
        assert words == ["Open", "Log", "Describe", "Mark ref", "Compare", "Sort", "Help"], words
        await open_first_run(pilot)
        await pilot.pause()
        words = footer_words(app)
        assert words[:3] == ["Back", "Log", "Describe"], words
        assert "Rank log" in words and "Metric" in words, words


@aio
async def test_j_k_g_G_home_end_move_the_runs_cursor(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        table = app.screen.query_one(RunsTable)
        last = table.row_count - 1
        assert last >= 3 and table.cursor_row == 0
        for keys, row in ((("j", "j"), 2), (("k",), 1), (("G",), last), (("g",), 0), (("end",), last),
                          (("home",), 0)):
            await pilot.press(*keys)
            assert table.cursor_row == row, (keys, table.cursor_row)
        await pilot.press("j", "enter")  # j then Enter opens the second run
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen))
        assert app.screen.run_id == int(table.coordinate_to_cell_key((1, 0)).row_key.value)


@aio
async def test_list_keys_in_the_rank_table_describe_tree_log_view_help_and_picker(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 40)) as pilot:
        await d.settle(pilot)
        # a two-rank run with training logs: its rank table has two rows
        table = app.screen.query_one(RunsTable)
        two = next(r for r in app.runs_snapshot.rows if r.name == fr.name_of("rank_raises"))
        table.move_cursor(row=[k.value for k in table.rows].index(str(two.run_id)))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen))
        await d.settle(pilot)
        ranks = app.screen.query_one(RankTable)
        await wait_for(pilot, lambda: ranks.row_count == 2)
        await pilot.press("j")
        assert ranks.cursor_row == 1
        await pilot.press("k")
        assert ranks.cursor_row == 0
        await pilot.press("G")
        assert ranks.cursor_row == 1

        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, DescribeScreen) and app.screen.loaded)
        tree = app.screen.query_one(DescribeTree)
        await pilot.pause()
        start = tree.cursor_line
        await pilot.press("j", "j")
        assert tree.cursor_line == start + 2
        await pilot.press("k")
        assert tree.cursor_line == start + 1
        await pilot.press("G")
        assert tree.cursor_line == tree.last_line > start + 1
        await pilot.press("g")
        assert tree.cursor_line == 0
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen))

        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LogScreen) and app.screen.reads > 0)
        view = app.screen.query_one(LogView)
        assert len(view.lines) > 3
        await pilot.press("g")
        assert view.cursor == 0
        await pilot.press("j", "j")
        assert view.cursor == 2 and "at line 3" in str(app.screen.query_one("#log-status").render())
        await pilot.press("k")
        assert view.cursor == 1
        await pilot.press("end")
        assert view.cursor == len(view.lines) - 1
        await pilot.press("home")
        assert view.cursor == 0
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen))

        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        body = app.screen.query_one("#help-body")
        await pilot.pause()
        await pilot.press("j", "j", "j")
        await wait_for(pilot, lambda: body.scroll_y == 3)
        await pilot.press("G")
        await wait_for(pilot, lambda: body.scroll_y == body.max_scroll_y > 3)
        await pilot.press("k")
        await wait_for(pilot, lambda: body.scroll_y == body.max_scroll_y - 1)
        await pilot.press("g")
        await wait_for(pilot, lambda: body.scroll_y == 0)


@aio
async def test_q_goes_back_everywhere_but_runs(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        run = await open_first_run(pilot)
        # `l q q` quit the whole app: q on Log went back to Run, and q on Run quit.
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LogScreen))
        await pilot.press("q")
        await wait_for(pilot, lambda: app.screen is run)
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        assert app.is_running
        await pilot.press("b")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "BacklogScreen")
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        await pilot.press("q")  # on Runs: quit
        await wait_for(pilot, lambda: not app.is_running)


@aio
async def test_q_goes_back_from_compare_and_ctrl_c_always_quits(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        await pilot.press("m", "j", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        await pilot.press("slash")  # Ctrl+C quits even from the filter box (Textual would copy there)
        assert app.focused is app.screen.query_one("#filter")
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not app.is_running)


@aio
async def test_ctrl_c_quits_from_the_run_screen(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await open_first_run(pilot)
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not app.is_running)


@aio
async def test_pagedown_scrolls_the_run_screen_without_tab(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(80, 24)) as pilot:
        run = await open_first_run(pilot)
        body = run.query_one("#run-body")
        assert app.focused is run.query_one(RankTable) and body.max_scroll_y > 0
        await pilot.press("pagedown")
        await wait_for(pilot, lambda: body.scroll_y > 0)
        down = body.scroll_y
        await pilot.press("pageup")
        await wait_for(pilot, lambda: body.scroll_y < down)
        assert app.focused is run.query_one(RankTable)


@aio
async def test_sort_picker_reaches_any_column_in_one_step(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        screen = app.screen
        await pilot.press("O")
        await wait_for(pilot, lambda: isinstance(app.screen, SortPicker))
        options = app.screen.query_one(SortList)
        labels = [options.get_option_at_index(i).id for i in range(options.option_count)]
        assert "Straggler" in labels and "Folder" not in labels  # Folder only when two runs share a name
        await pilot.press(*["j"] * labels.index("Straggler"), "enter")
        await wait_for(pilot, lambda: app.screen is screen)
        straggler = [label for label, _ in COLUMNS].index("Straggler")
        assert (screen.sort_column, screen.sort_reverse) == (straggler, False)
        await pilot.press("O")  # opens on the sorted column: Enter again reverses it
        await wait_for(pilot, lambda: isinstance(app.screen, SortPicker))
        assert app.screen.query_one(SortList).highlighted == labels.index("Straggler")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is screen)
        assert (screen.sort_column, screen.sort_reverse) == (straggler, True)
        await pilot.press("O")
        await wait_for(pilot, lambda: isinstance(app.screen, SortPicker))
        await pilot.press("G", "escape")  # Esc leaves the order as it is
        await wait_for(pilot, lambda: app.screen is screen)
        assert (screen.sort_column, screen.sort_reverse) == (straggler, True)
        assert "Straggler ▼" in str(screen.query_one("#runs-empty").render())


@aio
async def test_mark_then_compare_on_the_same_run_says_so(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        await pilot.press("m", "c")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)
        assert any("is the reference itself" in n.message for n in app._notifications), \
            [n.message for n in app._notifications]


def help_text(origin) -> list[str]:
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(help_renderable(WatchApp.BINDINGS, origin))
    return [line.rstrip() for line in console.export_text().splitlines()]


@aio
async def test_help_opens_on_the_keys_of_the_screen_it_came_from(source):
    app = create_app(source, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await open_first_run(pilot)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert app.screen.origin == "Run"
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert app.screen.origin == "Runs"
    run = help_text("Run")
    assert run[0] == "Keys of this screen (Run)"
    head = "\n".join(run[:20])
    assert "PgDn" in head and "Log of the rank under the cursor" in head and "j k" in head, head
    assert "Keys: Run" not in run and "Keys: Runs" in run  # listed once, first
    runs = "\n".join(help_text("Runs")[:20])
    assert runs.startswith("Keys of this screen (Runs)") and "Sort by…" in runs and "O" in runs, runs
