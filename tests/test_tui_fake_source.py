"""Screen and widget tests of `traceml watch` over :class:`support.fake_source.FakeSource` (no index, no ingester).

The fake serves snapshot objects taken once from the committed real runs through the real ``IndexSource``
(``support.fake_source.capture``); each test varies them with ``dataclasses.replace`` and watches what the
screens do. End-to-end flows over the real index stay in tests/test_tui.py, the SVG snapshots in
tests/test_tui_snapshots.py.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from traceml_tui.core.state import RunStatus
from traceml_tui.tui import app as app_module
from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.backlog import BacklogScreen
from traceml_tui.tui.screens.compare import CompareScreen
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.screens.runs import RunsScreen
from traceml_tui.tui.snapshots import CompareSnapshot
from traceml_tui.tui.source import IndexSource, Source
from traceml_tui.tui.widgets.info_panel import InfoPanel
from traceml_tui.tui.widgets.rank_table import RankTable
from traceml_tui.tui.widgets.runs_table import RunsTable

from support import REPO
from support import tui_data as d
from support.fake_source import FakeSource, RealSnapshots, capture

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("lasting_toasts")]

aio = d.aio

#: The Source members the App reaches only through ``getattr`` (the writer takeover, an IndexSource matter).
OPTIONAL_MEMBERS = {"can_take_over", "take_over"}


@pytest.fixture(scope="session")
def real(tmp_path_factory) -> RealSnapshots:
    """The real reader's snapshots of the committed runs, taken once per worker (session scope, so this
    module's tests spread over the workers: support/parallel.py)."""
    return capture(tmp_path_factory.mktemp("fake-source"))


@pytest.fixture
def fake(real) -> FakeSource:
    return FakeSource(real)


def protocol_members() -> list[str]:
    return sorted(name for name, value in vars(Source).items() if not name.startswith("_") and callable(value))


def runs_by_name(table: RunsTable) -> dict[str, dict[str, str]]:
    """Every shown row of the Runs table as {column key: plain cell}, by run name."""
    keys = [c.key.value for c in table.ordered_columns]
    rows = [[getattr(c, "plain", c) for c in table.get_row_at(i)] for i in range(table.row_count)]
    return {cells[keys.index("Run")]: dict(zip(keys, cells)) for cells in rows}


def rank_column(table: RankTable, key: str) -> list[str]:
    keys = [c.key.value for c in table.ordered_columns]
    return [str(getattr(cell, "plain", cell)) for cell in (table.get_row_at(i)[keys.index(key)]
                                                          for i in range(table.row_count))]


def headline_text(screen: RunScreen) -> str:
    data = screen.query_one("#headline", InfoPanel).data
    return "\n".join(line[0] if isinstance(line, tuple) else line for line in data[1])


async def wait_for(pilot, condition, limit: int = 1000) -> None:
    """Wait (bounded, never a fixed sleep) until ``condition()`` holds; fail saying so otherwise."""
    for _ in range(limit):
        if condition():
            await pilot.pause()
            return
        await pilot.pause(0.02)
    raise AssertionError("the condition never held")


async def started(pilot) -> None:
    """Wait until the Runs screen shows the first snapshot (the App polls its source as it mounts)."""
    await wait_for(pilot, lambda: any(isinstance(s, RunsScreen) and s.snapshot is not None
                                      for s in pilot.app.screen_stack))


# -- the fake stays honest
def test_fake_source_has_every_protocol_member_with_its_signature():
    members = protocol_members()
    assert {"data_version", "runs", "run_detail", "backlog", "summary", "log_sources", "describe",
            "close", "now"} <= set(members)
    for name in members:
        assert hasattr(FakeSource, name), f"FakeSource lacks Source.{name}"
        assert inspect.signature(getattr(FakeSource, name)) == inspect.signature(getattr(Source, name)), name
        # and the real source too: the protocol is what IndexSource implements
        assert inspect.signature(getattr(IndexSource, name)) == inspect.signature(getattr(Source, name)), name


def test_every_source_call_of_the_app_is_a_protocol_member():
    """The App and its screens call nothing on their source that the protocol (and so the fake) lacks."""
    called: set[str] = set()
    for path in (REPO / "traceml_tui" / "tui").rglob("*.py"):
        called |= set(re.findall(r"\bsource\.([a-z_]+)\(", path.read_text()))
    assert {"data_version", "runs", "run_detail"} <= called  # the scan finds the refresh worker's calls
    assert called - OPTIONAL_MEMBERS <= set(protocol_members()), called - set(protocol_members())
    for name in OPTIONAL_MEMBERS:
        assert not hasattr(FakeSource, name) and hasattr(IndexSource, name)


def test_snapshots_are_the_real_runs(real):
    """Every committed real run is there, with the states the real reader decided (not hand-written)."""
    from support import fixture_runs

    assert sorted(r.name for r in real.runs.rows) == sorted(f["name"] for f in fixture_runs.FACTS.values())
    assert real.row("hung").status is RunStatus.STALLED and real.row("completed").status is RunStatus.COMPLETED
    hung = real.details[real.row("hung").run_id]
    assert len(hung.ranks) == 2 and all(r.step is not None for r in hung.ranks)


# -- the Runs screen
@aio
async def test_a_new_snapshot_with_a_changed_status_redraws_the_runs_row(fake, real):
    app = create_app(fake, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await started(pilot)
        table = pilot.app.screen.query_one(RunsTable)
        before = runs_by_name(table)
        assert d.status_word(before["hung"]["Status"]) == "stalled"
        # the hung run is now failed as the real rank-raises run is (its row's state fields)
        raises = real.row("rank-raises")
        fake.replace_row("hung", status=raises.status, silent_ranks=raises.silent_ranks,
                         explaining_ranks=raises.explaining_ranks, first_failed=raises.first_failed)
        await wait_for(pilot, lambda: d.status_word(runs_by_name(table)["hung"]["Status"]) == "failed")
        after = runs_by_name(table)
        assert d.strip_glyph(after["hung"]["Status"]) == d.strip_glyph(after["rank-raises"]["Status"])
        assert {k: v for k, v in after.items() if k != "hung"} == {k: v for k, v in before.items() if k != "hung"}


@aio
async def test_a_run_that_disappears_leaves_the_runs_table(fake, real):
    app = create_app(fake, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await started(pilot)
        table = pilot.app.screen.query_one(RunsTable)
        assert table.row_count == len(real.runs.rows)
        fake.drop_run(real.row("interrupted").run_id)
        await wait_for(pilot, lambda: table.row_count == len(real.runs.rows) - 1)
        assert set(runs_by_name(table)) == {r.name for r in real.runs.rows} - {"interrupted"}


@aio
async def test_an_unchanged_data_version_rebuilds_nothing(fake, real, monkeypatch):
    # No age rebuild during the test: only a data_version change may make the worker ask for snapshots.
    monkeypatch.setattr(app_module, "AGE_REFRESH_S", 1e9)
    app = create_app(fake, poll_interval=0.01)
    async with app.run_test(size=(120, 30)) as pilot:
        await started(pilot)
        table = pilot.app.screen.query_one(RunsTable)
        asked = fake.calls["runs"]
        fake.replace_row("hung", bump=False, status=RunStatus.COMPLETED, silent_ranks=(), explaining_ranks=())
        polls = fake.calls["data_version"]
        await wait_for(pilot, lambda: fake.calls["data_version"] >= polls + 20)  # twenty polls saw no change
        assert fake.calls["runs"] == asked
        assert d.status_word(runs_by_name(table)["hung"]["Status"]) == "stalled"
        fake.bump()
        await wait_for(pilot, lambda: d.status_word(runs_by_name(table)["hung"]["Status"]) == "completed")
        assert fake.calls["runs"] == asked + 1


@aio
async def test_a_new_version_with_nothing_new_is_not_handed_to_the_runs_screen(fake, real):
    app = create_app(fake, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await started(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, RunsScreen)
        shown = screen.snapshot
        fake.set_runs(dataclasses.replace(real.runs, now=real.runs.now + 5.0))  # only the clock moved
        refreshes = pilot.app.refreshes
        await wait_for(pilot, lambda: pilot.app.refreshes > refreshes and pilot.app.runs_snapshot.now > shown.now)
        assert screen.snapshot is shown  # the refresh gate: the same rows are not redrawn



@aio
async def test_a_snapshot_that_arrives_after_a_screens_widgets_are_gone_is_dropped(fake, real):
    """At exit the App removes the screens' widgets before it handles the last snapshot the refresh worker
    posted (seen on a loaded machine: the Runs screen raised NoMatches and the watch ended in a traceback).
    Each screen that draws snapshots drops one that finds its widgets gone."""
    app = create_app(fake, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await started(pilot)
        run_id = real.row("hung").run_id
        app.open_backlog(run_id)
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, BacklogScreen) and pilot.app.screen.snapshot)
        backlog = pilot.app.screen
        app.open_compare("1", "2")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, CompareScreen))
        compare = pilot.app.screen
        runs = next(s for s in app.screen_stack if isinstance(s, RunsScreen))
        for screen in (runs, backlog, compare):
            await screen.query("*").remove()
        runs.snapshot = dataclasses.replace(real.runs, now=real.runs.now + 1.0)
        backlog.snapshot = dataclasses.replace(backlog.snapshot)
        compare.snapshot = CompareSnapshot("1", "2", None, None, 1, None, None, (), error="gone")
        await pilot.pause()
        assert app.return_value is None and app.is_running  # nothing raised: the App runs on

# -- the Run screen
@aio
async def test_the_run_screen_shows_the_header_and_rank_table_the_snapshot_carries(fake, real):
    row = real.row("hung")
    detail = real.details[row.run_id]
    app = create_app(fake, poll_interval=0.02)
    async with app.run_test(size=(140, 45)) as pilot:
        await started(pilot)
        pilot.app.open_run(row.run_id)
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunScreen) and pilot.app.screen.detail is not None)
        screen = pilot.app.screen
        ranks = screen.query_one(RankTable)
        assert rank_column(ranks, "Rank") == [str(r.rank) for r in detail.ranks]
        assert rank_column(ranks, "Step") == [str(r.step) for r in detail.ranks]
        assert "STALLED" in headline_text(screen) and f"step {row.step}" in headline_text(screen)
        assert fake.charts[-1] == screen.chart  # the worker asked for the chart the screen shows

        # the ranks go on: a detail whose rank rows moved on by three steps, and the row with them
        moved = tuple(dataclasses.replace(r, step=r.step + 3) for r in detail.ranks)
        fake.set_detail(row.run_id, dataclasses.replace(detail, ranks=moved), bump=False)
        fake.replace_row("hung", step=row.step + 3)
        await wait_for(pilot, lambda: rank_column(ranks, "Step") == [str(r.step) for r in moved])
        assert f"step {row.step + 3}" in headline_text(screen)


@aio
async def test_the_run_screen_keeps_what_it_showed_when_its_run_disappears(fake, real):
    row = real.row("completed")
    app = create_app(fake, poll_interval=0.02)
    async with app.run_test(size=(140, 45)) as pilot:
        await started(pilot)
        pilot.app.open_run(row.run_id)
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunScreen) and pilot.app.screen.detail is not None)
        screen = pilot.app.screen
        shown = headline_text(screen)
        fake.drop_run(row.run_id)
        asked = fake.calls["run_detail"]
        await wait_for(pilot, lambda: fake.calls["run_detail"] > asked)  # the worker got None for it
        await d.settle(pilot)
        assert pilot.app.screen is screen and headline_text(screen) == shown


@aio
async def test_a_run_whose_folder_goes_missing_is_said_once(fake, real):
    row = real.row("completed")
    app = create_app(fake, poll_interval=0.02)
    async with app.run_test(size=(140, 45)) as pilot:
        await started(pilot)
        pilot.app.open_run(row.run_id)
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunScreen) and pilot.app.screen.detail is not None)
        fake.replace_row("completed", status=RunStatus.MISSING)
        await wait_for(pilot, lambda: "MISSING" in headline_text(pilot.app.screen))
        fake.bump()
        await d.settle(pilot, rounds=2)
        said = [n for n in pilot.app._notifications if "its folder is gone from disk" in n.message]
        assert len(said) == 1 and "completed" in said[0].message
