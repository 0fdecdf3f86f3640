"""Issue 23 item 5, "Nothing hides": the rules in traceml_tui/core/state.py case by case, then on real runs.

* a run with blocked validation requests (or a summary saying ``Validation: MISSING``) needs attention, with
  its own mark after its word, on the Runs screen and in ``traceml status`` (table and ``--json``): the committed
  real ``hygiene`` run (one request blocked after three failed attempts by real drainers);
* a rank silent for several of its own step intervals is greyed with its silence age before a stall is
  declared, and a stall names the rank that stopped first: a live 2-rank gloo DDP run through ``traceml run``
  with rank 1 SIGSTOPped, read by a real ``traceml daemon`` process (slow);
* Age and Duration columns, sortable through the sort picker;
* the severity order legible without colour (``NO_COLOR``) and on 16 colours: the real app's rendered segments;
* an interrupted run says by what and when: the committed real ``interrupted`` run (SIGINT to its launcher).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.color import ColorSystem
from textual.color import Color

from daemon.reader import Reader
from traceml_tui.core.state import (
    ALERT_STATES,
    QUIET_FLOOR_S,
    HangFact,
    RankFacts,
    RankState,
    RunFacts,
    RunStatus,
    decide_run,
    describe,
    interruption,
    marks_text,
    needs_attention,
    quiet_limit_s,
    quiet_ranks,
    signal_name,
    stall_limit_s,
    stopped_first,
    validation_mark,
)
from traceml_tui.tui import present, textplot
from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.run_detail import RunScreen, headline
from traceml_tui.tui.screens.sort_picker import SortList, SortPicker
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.rank_table import QUIET_STYLE, rank_cells
from traceml_tui.tui.widgets.runs_table import COLUMNS, RunsTable, status_text

from support import fixture_runs as fr
from support import tui_data as d

pytestmark = pytest.mark.timeout(180)

NOW = 1_000_000.0


def _rank(rank: int, ts: float, step: int = 10, interval: float = 0.2, **kw) -> RankFacts:
    return RankFacts(rank=rank, last_ts=ts, last_step=step, median_interval_s=interval, last_seen=ts, **kw)


# --------------------------------------------------------------------------- the rules (pure)

def test_a_rank_is_quiet_after_three_of_its_own_intervals_long_before_the_stall():
    # 5 steps/s: the stall limit is the 30 s floor; rank 1 has been silent 12 s, rank 0 wrote 0.1 s ago
    facts = RunFacts(ranks=(_rank(0, NOW - 0.1), _rank(1, NOW - 12.0)), now=NOW, median_interval_s=0.2,
                     last_ingest=NOW - 0.1)
    verdict = decide_run(facts)
    assert verdict.status is RunStatus.RUNNING and verdict.ranks == (RankState.RUNNING, RankState.RUNNING)
    quiet = quiet_ranks(facts, verdict.ranks)
    assert [(i, round(s)) for i, s in quiet] == [(1, 12)]  # its word stays running: quiet is a mark
    # the limit is the rank's own: 3 × a slow rank's 4 s interval is 12 s, so the same silence is not quiet there
    slow = RunFacts(ranks=(_rank(0, NOW - 0.1), _rank(1, NOW - 11.0, interval=4.0)), now=NOW, median_interval_s=0.2)
    assert quiet_ranks(slow, decide_run(slow).ranks) == ()
    assert quiet_limit_s(4.0, 30.0) == 12.0 and quiet_limit_s(0.2, 30.0) == QUIET_FLOOR_S
    assert quiet_limit_s(100.0, stall_limit_s(None)) == stall_limit_s(None)  # never past the stall limit
    # under the floor nothing is quiet (an ingest poll or two is no silence)
    short = RunFacts(ranks=(_rank(0, NOW), _rank(1, NOW - QUIET_FLOOR_S + 0.5)), now=NOW, median_interval_s=0.2)
    assert quiet_ranks(short, decide_run(short).ranks) == ()


def test_ended_stalled_and_final_runs_have_no_quiet_rank():
    ended = RunFacts(ranks=(_rank(0, NOW - 20, end_status="exited", end_ts=NOW - 20), _rank(1, NOW - 0.1)),
                     now=NOW, median_interval_s=0.2)
    assert quiet_ranks(ended, decide_run(ended).ranks) == ()
    stalled = RunFacts(ranks=(_rank(0, NOW - 0.1), _rank(1, NOW - 60)), now=NOW, median_interval_s=0.2)
    verdict = decide_run(stalled)
    assert verdict.ranks[1] is RankState.STALLED and quiet_ranks(stalled, verdict.ranks) == ()
    final = RunFacts(ranks=(_rank(0, NOW - 20),), now=NOW, manifest_status="completed")
    assert quiet_ranks(final, decide_run(final).ranks) == ()


def test_a_stall_names_the_rank_that_stopped_first():
    stalled = [RankState.STALLED] * 3
    # behind by a step: it stopped first, whatever the record times say
    assert stopped_first((_rank(0, 100.0, step=41), _rank(1, 101.0, step=40), _rank(2, 100.5, step=41)),
                         stalled, 0.2) == (1,)
    # the same step: the one whose newest record is older by more than a step interval
    assert stopped_first((_rank(0, 100.0), _rank(1, 97.0), _rank(2, 100.1)), stalled, 0.2) == (1,)
    # lock-step ranks writing the same step within an interval cannot be told apart: both are named
    assert stopped_first((_rank(0, 100.00), _rank(1, 100.05)), stalled[:2], 0.2) == (0, 1)
    # a watchdog's hang record is a record: the rank that still runs wrote one, the SIGSTOPped one could not
    alive = _rank(0, 100.00, hang=HangFact(None, 57, ts=103.0))
    assert stopped_first((alive, _rank(1, 100.05)), stalled[:2], 0.2) == (1,)
    # only the silent ranks count; one silent rank is itself
    assert stopped_first((_rank(0, 100.0), _rank(1, 50.0)), [RankState.STALLED, RankState.RUNNING], 0.2) == (0,)
    assert stopped_first((_rank(0, 100.0), _rank(1, 50.0)), [RankState.RUNNING, RankState.RUNNING], 0.2) == ()


def test_blocked_or_missing_validation_is_a_mark_that_needs_attention():
    assert validation_mark(blocked=2, summary_missing=True) == "2 blocked"
    assert validation_mark(blocked=0, summary_missing=True) == "validation missing"
    assert validation_mark(blocked=0, summary_missing=False) is None
    assert needs_attention(RunStatus.COMPLETED, "2 blocked")
    assert not needs_attention(RunStatus.COMPLETED, None) and not needs_attention(RunStatus.INTERRUPTED)
    assert all(needs_attention(s) for s in ALERT_STATES)
    assert describe("completed", marks=marks_text("2 blocked")) == "completed ⚠ 2 blocked"


@pytest.mark.parametrize("code, ends, want", [
    (130, (), "SIGINT"),  # a shell's 128 + 2
    (-15, (), "SIGTERM"),  # torchrun's -N
    (143, ("interrupted",), "SIGTERM"),  # the launcher's code first
    (1, ("interrupted",), "SIGINT"),  # KeyboardInterrupt in the rank
    (None, ("terminated", "interrupted"), "SIGTERM"),
    (None, ("exited",), None),
    (0, (), None),
])
def test_what_interrupted_a_run(code, ends, want):
    assert interruption(code, ends) == want


def test_marks_read_in_one_order():
    at = 1_796_051_689.0  # 15:14:49 UTC
    assert signal_name(130) == "SIGINT" and signal_name(3) is None
    assert marks_text("1 blocked", ((1, 12.4), (3, 7.0)), "SIGINT", at) == "SIGINT 15:14 r1,r3 silent 12s ⚠ 1 blocked"
    # a failure after every rank's script returned (core.state.crashed_in_teardown)
    assert describe("failed", (1,), marks=marks_text("1 blocked", teardown=True)) == \
        "failed r1 after training ⚠ 1 blocked"


# --------------------------------------------------------------------------- the committed real runs

@pytest.fixture
def committed(tmp_path):
    root, index = fr.build_real_index(tmp_path)
    yield root, index


def _status(index: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_tui", "status", "--index", str(index), *args],
                          capture_output=True, text=True, timeout=120, env=env)


def _expected_blocked(run_dir: Path) -> int:
    """Blocked requests read from the files as the case made them: three failure files and no receipt or claim."""
    from support.realruns import backlog_files

    return sum(1 for kinds in backlog_files(run_dir).values()
               if len(kinds["failures"]) >= 3 and not kinds["receipts"] and not kinds["claims"])


def test_blocked_validation_is_counted_as_needing_attention_in_the_reader_and_status(committed, cli_env):
    root, index = committed
    blocked = _expected_blocked(root / fr.name_of("hygiene"))
    assert blocked == 1  # the case's facts: step-00000006 spent its three attempts
    with Reader(index) as reader:
        runs = {r.name: r for r in reader.list_runs(now=fr.SHOWN_AT)}
    hygiene = runs[fr.name_of("hygiene")]
    assert hygiene.status is RunStatus.COMPLETED  # the launcher's word stays; the mark is beside it
    assert hygiene.validation_mark == f"{blocked} blocked" and hygiene.attention
    assert hygiene.status_text == f"completed ⚠ {blocked} blocked"
    assert not runs[fr.name_of("completed")].attention

    # `traceml status`: the same text in the table, and --json says it needs attention (the clock is now, long
    # after the runs: their words are final, the hung run's stall only grows)
    table = _status(index, cli_env)
    assert table.returncode == 0, table.stderr
    (line,) = [ln for ln in table.stdout.splitlines() if ln.startswith(fr.name_of("hygiene") + " ")]
    assert f"completed ⚠ {blocked} blocked" in line, table.stdout
    js = _status(index, cli_env, "--json")
    by_name = {r["name"]: r for r in json.loads(js.stdout)["runs"]}
    assert by_name[fr.name_of("hygiene")]["attention"] is True
    assert by_name[fr.name_of("hygiene")]["validation_mark"] == f"{blocked} blocked"
    assert by_name[fr.name_of("hygiene")]["status_text"] == f"completed ⚠ {blocked} blocked"
    assert by_name[fr.name_of("completed")]["attention"] is False


@d.aio
async def test_blocked_validation_is_counted_on_the_runs_screen_with_its_mark(committed):
    _, index = committed
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    with Reader(index) as reader:
        runs = reader.list_runs(now=fr.SHOWN_AT)
    alerting = sum(1 for r in runs if r.status in ALERT_STATES)
    app = create_app(source, poll_interval=0.02)
    try:
        async with app.run_test(size=(160, 30)) as pilot:
            await d.settle(pilot)
            table = app.screen.query_one(RunsTable)
            cells = {table.get_row_at(i)[1]: table.get_row_at(i)[0].plain for i in range(table.row_count)}
            assert cells[fr.name_of("hygiene")] == "✓ completed ⚠ 1 blocked"
            line = str(app.screen.query_one("#runs-empty").render())
            # the alert words, and the completed run whose validation is blocked
            assert f"{alerting + 1} need attention" in line, line
    finally:
        source.close()


def test_a_summary_saying_validation_missing_is_a_mark(tmp_path):
    """The runs whose typed summary ``validation`` section says ``missing`` are the runs the reader marks (the hygiene
    run's section, written by the real ``validation_report``: requests left without a receipt)."""
    _, index = fr.build_real_index(tmp_path, prepare=fr.stop_hygiene_early)  # the real section, `missing`
    with Reader(index) as reader:
        fast = {run_id for run_id, f in reader._runs._with_summary().items() if f.missing}
        slow = set()
        for run in reader.list_runs(now=fr.SHOWN_AT):
            section = reader.files.validation(run.run_id)
            if section is not None and section.status == "missing":
                slow.add(run.run_id)
    assert slow and fast == slow
    with Reader(index) as reader:
        (hygiene,) = [r for r in reader.list_runs(now=fr.SHOWN_AT) if r.run_id in slow]
    assert hygiene.name == fr.name_of("hygiene") and hygiene.attention


def test_an_interrupted_run_says_by_what_and_when(committed):
    root, index = committed
    manifest = json.loads((root / fr.name_of("interrupted") / "manifest.json").read_text())
    assert manifest["exit_code"] == 130  # the launcher got SIGINT (tests/support/realruns.py "interrupted")
    with Reader(index) as reader:
        run = next(r for r in reader.list_runs(now=fr.SHOWN_AT) if r.name == fr.name_of("interrupted"))
    assert (run.interrupted_by, run.interrupted_at) == ("SIGINT", manifest["ended_at"])
    assert run.status_text == "interrupted SIGINT " + time.strftime("%H:%M", time.gmtime(manifest["ended_at"]))


@d.aio
async def test_the_interrupted_run_on_the_runs_row_short_and_the_run_screen_in_full(committed):
    root, index = committed
    ended = json.loads((root / fr.name_of("interrupted") / "manifest.json").read_text())["ended_at"]
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    app = create_app(source, poll_interval=0.02)
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            await d.settle(pilot)
            table = app.screen.query_one(RunsTable)
            cells = {table.get_row_at(i)[1]: table.get_row_at(i)[0].plain for i in range(table.row_count)}
            assert cells[fr.name_of("interrupted")] == "■ interrupted SIGINT " + time.strftime(
                "%H:%M", time.gmtime(ended))
            app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == fr.name_of("interrupted")))
            await d.settle(pilot, rounds=3)
            assert isinstance(app.screen, RunScreen)
            lines = [str(x[0] if isinstance(x, tuple) else x) for x in headline(app.screen.detail)]
            assert f"interrupted by SIGINT (Ctrl-C) at {textplot.clock_time(ended)}" in lines, lines
    finally:
        source.close()


@d.aio
async def test_age_and_duration_columns_from_the_reader_sortable_by_the_picker(committed):
    _, index = committed
    with Reader(index) as reader:
        runs = {r.name: r for r in reader.list_runs(now=fr.SHOWN_AT)}
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    app = create_app(source, poll_interval=0.02)
    labels = [label for label, _ in COLUMNS]
    try:
        async with app.run_test(size=(200, 30)) as pilot:
            await d.settle(pilot)
            screen = app.screen
            table = screen.query_one(RunsTable)
            shown = [c.label.plain.split()[0] for c in table.ordered_columns]

            def column(label: str) -> dict[str, str]:
                at = shown.index(label)
                return {str(table.get_row_at(i)[1]): str(getattr(table.get_row_at(i)[at], "plain",
                                                               table.get_row_at(i)[at])).strip()
                        for i in range(table.row_count)}

            ages, durations = column("Age"), column("Duration")
            for name, run in runs.items():
                assert ages[name] == textplot.duration(fr.SHOWN_AT - run.last_ts)  # since its newest record
                assert durations[name] == textplot.duration(run.duration_s)
            def launch(case: str) -> dict:
                return json.loads((fr.FIXTURE_RUNS / fr.name_of(case) / "manifest.json").read_text())

            hung = runs[fr.name_of("hung")]  # live (stalled): from the launcher's start (before any record) to now
            assert hung.duration_s == pytest.approx(fr.SHOWN_AT - launch("hung")["started_at"], abs=1e-3)
            assert hung.duration_s > fr.SHOWN_AT - hung.first_ts
            done = runs[fr.name_of("completed")]  # over: the launcher's start to its end (after the last record)
            took = launch("completed")["ended_at"] - launch("completed")["started_at"]
            assert done.duration_s == pytest.approx(took, abs=1e-3) and took > done.last_ts - done.first_ts > 0
            for label, key in (("Age", lambda r: r.age_s), ("Duration", lambda r: r.duration_s)):
                await pilot.press("O")
                for _ in range(200):
                    if isinstance(app.screen, SortPicker):
                        break
                    await pilot.pause(0.02)
                options = app.screen.query_one(SortList)
                ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
                await pilot.press("g", *["j"] * ids.index(label), "enter")
                for _ in range(200):
                    if app.screen is screen and screen.sort_column == labels.index(label):
                        break
                    await pilot.pause(0.02)
                await pilot.pause(0.1)
                order = [str(table.get_row_at(i)[1]) for i in range(table.row_count)]
                assert order == sorted(order, key=lambda n: key(runs[n])), (label, order)
    finally:
        source.close()


# --------------------------------------------------------------------------- severity without colour

def _status_segments(app, table) -> dict[str, object]:
    """The Status cell's first segment of each run row, after the app's own output filters (NO_COLOR's too)."""
    out = {}
    for y in range(1, table.row_count + 1):
        segments = list(table.render_line(y))
        for line_filter in app._filters:
            if line_filter.enabled:  # as the app's compositor applies them
                segments = line_filter.apply(segments, app.screen.styles.background)
        cell = next(s for s in segments if s.text.strip())
        out[cell.text.split()[1]] = cell.style
    return out


def _prominence(style) -> tuple:
    """How loud a cell is without hue: (a block of its own behind it, bold, its text's brightness over its back)."""
    fg = Color.from_rich_color(style.color) if style.color else Color(224, 224, 224)
    bg = Color.from_rich_color(style.bgcolor) if style.bgcolor else Color(30, 30, 30)
    if style.reverse:
        fg, bg = bg, fg
    return (bg.brightness > 0.15, bool(style.bold), round(abs(fg.brightness - bg.brightness), 2))


@d.aio
async def test_severity_stays_legible_under_no_color(committed, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")  # Textual turns every colour into a grey (its Monochrome filter)
    _, index = committed
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    app = create_app(source, poll_interval=0.02)
    try:
        async with app.run_test(size=(160, 30)) as pilot:
            await d.settle(pilot)
            assert app.no_color
            app.screen.query_one(RunsTable).move_cursor(row=0)
            styles = _status_segments(app, app.screen.query_one(RunsTable))
    finally:
        source.close()
    failed, stalled, interrupted = (_prominence(styles[w]) for w in ("failed", "stalled", "interrupted"))
    assert failed > stalled > interrupted, (failed, stalled, interrupted)  # the attention order, without colour
    assert failed[0] and failed[1] and failed[2] >= 0.5  # bold, a block of its own, readable (not grey on black)
    assert not interrupted[0] and not interrupted[1]  # never louder than failed


def _cell_segments(app, table, texts: dict[str, str]) -> dict[str, object]:
    """The style of the cell showing each text (``{name: text}``) of the Runs table, after the app's filters."""
    out = {}
    for y in range(1, table.row_count + 1):
        segments = list(table.render_line(y))
        for line_filter in app._filters:
            if line_filter.enabled:
                segments = line_filter.apply(segments, app.screen.styles.background)
        line = "".join(seg.text for seg in segments)
        for name, text in texts.items():
            if name in line:
                out[name] = next(seg.style for seg in segments if text in seg.text)
    return out


@d.aio
async def test_the_straggler_cell_keeps_its_severity_under_no_color(committed, monkeypatch):
    """A straggler from +20 % stands out, and stays readable without colour (it read as dark grey on near-black:
    the least readable cell of the row); a rank a little slower reads as plain text; one rank shows a quiet –."""
    monkeypatch.setenv("NO_COLOR", "1")
    _, index = committed
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    app = create_app(source, poll_interval=0.02)
    try:
        async with app.run_test(size=(200, 30)) as pilot:
            await d.settle(pilot)
            assert app.no_color
            table = app.screen.query_one(RunsTable)
            rows = {r.name: r for r in app.runs_snapshot.rows}
            cases = (fr.name_of("rank_sigkilled"), fr.name_of("rank_raises"))
            # the cursor on another run: its highlight is not what is measured
            table.move_cursor(row=next(i for i in range(table.row_count) if table.get_row_at(i)[1] not in cases))
            await pilot.pause(0.1)
            styles = _cell_segments(app, table, {n: f"r{rows[n].slowest_rank} {rows[n].straggler_pct:+.0f}%"
                                                 for n in cases})
    finally:
        source.close()
    loud = rows[fr.name_of("rank_sigkilled")]
    plain = rows[fr.name_of("rank_raises")]
    assert loud.straggler_score >= 1.2 > plain.straggler_score  # the cases, as committed
    alert, quiet = _prominence(styles[fr.name_of("rank_sigkilled")]), _prominence(styles[fr.name_of("rank_raises")])
    assert alert > quiet, (alert, quiet)
    assert alert[1] and alert[2] >= 0.5, alert  # bold and readable: never grey on black
    assert quiet[2] >= 0.5, quiet  # plain text reads too


@d.aio
async def test_the_rank_tables_large_delta_stays_legible_under_no_color(committed, monkeypatch):
    """The Run screen's Δ median from +20 % (the slow rank of the committed rank-sigkilled run, +39 %) stands out
    as the Runs screen's Straggler cell does, and stays readable without colour; the +0 % of its peer is plain."""
    from rich.style import Style

    from traceml_tui.tui.widgets.rank_table import RankTable

    monkeypatch.setenv("NO_COLOR", "1")
    _, index = committed
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    app = create_app(source, poll_interval=0.02)
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            await d.settle(pilot)
            app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == fr.name_of("rank_sigkilled")))
            await d.settle(pilot, rounds=3)
            table = app.screen.query_one(RankTable)
            detail = app.screen.detail
            slow = detail.run.slowest_rank
            table.blur()  # the row cursor's highlight is not what is measured
            await pilot.pause(0.1)
            styles = {}
            for y in range(1, table.row_count + 1):
                segments = list(table.render_line(y))
                for line_filter in app._filters:
                    if line_filter.enabled:
                        segments = line_filter.apply(segments, app.screen.styles.background)
                rank = int("".join(seg.text for seg in segments).split()[0])
                delta = next(r.delta_pct for r in detail.ranks if r.rank == rank)
                styles[rank] = next(seg.style for seg in segments if seg.text.strip() == f"{delta:+.0f}%") or Style()
    finally:
        source.close()
    assert detail.run.straggler_pct >= 20
    alert, plain = _prominence(styles[slow]), _prominence(styles[1 - slow])
    assert alert > plain and alert[1] and alert[2] >= 0.5, (alert, plain)


@d.aio
async def test_severity_order_holds_on_sixteen_colours(committed, monkeypatch):
    monkeypatch.setenv("TEXTUAL_COLOR_SYSTEM", "standard")
    _, index = committed
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    app = create_app(source, poll_interval=0.02)
    try:
        async with app.run_test(size=(160, 30)) as pilot:
            await d.settle(pilot)
            styles = _status_segments(app, app.screen.query_one(RunsTable))
    finally:
        source.close()

    def sixteen(color) -> int:
        return color.downgrade(ColorSystem.STANDARD).number

    failed, interrupted = styles["failed"], styles["interrupted"]
    assert failed.bold and sixteen(failed.bgcolor) in (1, 9)  # a red block (not magenta), bold
    assert not interrupted.bold and sixteen(interrupted.bgcolor) == sixteen(styles["completed"].bgcolor)  # no block
    assert sixteen(interrupted.color) in (3, 11)  # yellow: quieter than the red block
    assert _prominence(failed) > _prominence(interrupted)


# --------------------------------------------------------------------------- a live SIGSTOPped rank (slow)

#: The stall floor the reader decides with here (``traceml status --stall-after``): well past the quiet floor.
LIVE_STALL_S = 15.0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_sigstopped_rank_is_greyed_before_the_stall_and_named_alone_when_declared(tmp_path, cli_env):
    import psutil

    from support import realruns

    logs, pids = tmp_path / "logs", tmp_path / "pids"
    logs.mkdir()
    index = tmp_path / "index.sqlite"
    # rank 0's watchdog writes its hang record after 2 s (a rank that still runs; the SIGSTOPped one cannot)
    env = realruns.subprocess_env(tmp_path / "state", TRACEML_HANG_FLOOR_S="2")
    args = [str(realruns.DDP_SCRIPT), "--run-name", "stopped", "--logs-dir", str(logs), "--nproc-per-node", "2",
            "--args", "--steps", "100000", "--sleep", "0.1", "--pid-dir", str(pids)]
    daemon = subprocess.Popen([sys.executable, "-m", "traceml_tui", "daemon", str(logs), "--index", str(index)],
                              env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(tmp_path / "launcher.err", "wb") as err:
        launcher = subprocess.Popen([*realruns.TRACEML, "run", *args], cwd=tmp_path, env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)
    seen_quiet: list = []
    try:
        def wait(predicate, what: str, timeout: float = realruns.LAUNCH_TIMEOUT_S):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                value = predicate()
                if value:
                    return value
                assert launcher.poll() is None, (tmp_path / "launcher.err").read_text()[-3000:]
                time.sleep(0.2)
            raise AssertionError(f"timed out waiting for {what}")

        def run_now():
            if not index.is_file():
                return None
            with Reader(index, stall_floor_s=LIVE_STALL_S) as reader:
                runs = reader.list_runs()
                if not runs:
                    return None
                (run,) = runs
                rows = reader.rank_rows(run.run_id)
                return run, reader.rank_views(run, rows), time.time(), reader.figures(run)

        # both ranks step, and the index has them
        wait(lambda: (got := run_now()) and all((v.last_step or 0) >= 5 for v in got[1]) and len(got[1]) == 2,
             "5 steps of each rank in the index")
        rank1 = psutil.Process(int((pids / "rank_1.pid").read_text()))
        rank1.suspend()  # SIGSTOP
        assert wait(lambda: rank1.status() == psutil.STATUS_STOPPED, "rank 1 to stop")

        def stalled():
            got = run_now()
            if got is None:
                return None
            run = got[0]
            if run.status is RunStatus.RUNNING and 1 in dict(run.quiet_ranks):
                seen_quiet.append(got)
            return got if run.status is RunStatus.STALLED else None

        run = wait(stalled, "the stall to be declared", timeout=240)[0]
    finally:
        realruns._kill_all(realruns._tree(launcher.pid))  # SIGKILL ends a stopped process too
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()

    # before the stall: rank 1 greyed with its silence age, the run row saying so, its word still `running`
    assert seen_quiet, "rank 1 was never seen quiet before the stall was declared"
    q_run, q_views, q_now, q_figures = seen_quiet[0]
    silent_s = dict(q_run.quiet_ranks)[1]
    assert silent_s > QUIET_FLOOR_S and dict(q_run.rank_states)[1] is RankState.RUNNING
    assert "r1" in q_run.marks and "silent" in q_run.status_text
    runs_row = present.run_row(q_run, q_figures, workload=None, trend=(), backlog=0)  # the Runs screen's row
    assert runs_row.quiet_ranks and 1 in runs_row.quiet_ranks
    assert status_text(runs_row).plain.startswith("▶ running ") and "silent" in status_text(runs_row).plain
    row = present.rank_row(next(v for v in q_views if v.rank == 1), q_now, tuple(r for r, _ in q_run.quiet_ranks))
    state_cell = rank_cells(row)[2]
    assert row.quiet and state_cell.plain.startswith("▶ silent ") and state_cell.style == QUIET_STYLE
    # when the stall is declared: the rank that stopped first is named, alone
    assert run.explaining_ranks == (1,), (run.rank_states, run.stopped_first)
    assert run.status_text.startswith("stalled r1") and "r0" not in run.status_text.split(" silent")[0]
