"""The Log screen (`l`) and the Describe screen (`d`) of `traceml watch`, on the committed real runs.

``rank-raises`` is a real 2-rank DDP run whose rank 1 raised ``RuntimeError: CUDA
out of memory (simulated)`` in step 5; its ``training.stderr.log`` is the one
torch's launcher wrote (see tests/fixtures/runs/README.md). The index is built
by the real ingester, the App is the real one (``run_test``); the log file the
follow test appends to is the copy under the test's tmp folder.
"""

from __future__ import annotations

import subprocess

import pytest

from traceml_tui.tui.app import create_app
from traceml_tui.tui.logtail import LogTail
from traceml_tui.tui.screens.describe import DescribeScreen
from traceml_tui.tui.screens.logs import LogScreen
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.describe_tree import DescribeTree
from traceml_tui.tui.widgets.log_view import LogView
from traceml_tui.tui.widgets.rank_table import RankTable
from traceml_tui.tui.widgets.runs_table import RunsTable

from support import fixture_runs as fr
from support import tui_data as d

pytestmark = pytest.mark.timeout(60)

RAISES = fr.name_of("rank_raises")


aio = d.aio


@pytest.fixture
def real(committed_index):
    """(root, source) over the module's index of the committed runs: for tests that only read them."""
    root, index = committed_index
    src = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    yield root, src
    src.close()


@pytest.fixture
def real_copy(tmp_path):
    """(root, source) over this test's own copy of the committed runs: for a test that writes into them."""
    root, index = fr.build_real_index(tmp_path)
    src = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    yield root, src
    src.close()


def _run_id(app, name: str) -> int:
    return next(r.run_id for r in app.runs_snapshot.rows if r.name == name)


async def _until(pilot, predicate, limit: int = 400) -> None:
    """Wait (bounded, never a fixed sleep) until ``predicate()`` holds; fail the test when it never does."""
    for _ in range(limit):
        if predicate():
            return
        await pilot.pause(0.02)
    assert predicate()


async def _log_screen(pilot) -> LogScreen:
    await _until(pilot, lambda: isinstance(pilot.app.screen, LogScreen) and pilot.app.screen.reads >= 1)
    await pilot.pause()
    return pilot.app.screen


@aio
async def test_log_opens_at_the_failing_ranks_first_error(real):
    _, src = real
    app = create_app(src, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        app.open_run(_run_id(app, RAISES))
        await d.settle(pilot)
        await pilot.press("l")
        screen = await _log_screen(pilot)
        view = screen.query_one(LogView)
        texts = [ln.text for ln in view.lines]
        assert "RuntimeError: CUDA out of memory (simulated)" in texts
        current = view.lines[view.cursor]
        # rank 1 failed first (the summary's failure section): its traceback, not rank 0's, is where the view opens
        assert (current.rank, current.text, current.error) == (1, "Traceback (most recent call last):", True)
        assert view.cursor == next(i for i, ln in enumerate(view.lines) if ln.error)
        exception = texts.index("RuntimeError: CUDA out of memory (simulated)")
        assert view.lines[exception].error and view.lines[exception].rank == 1
        # every line is labelled: rank lines by their [rankN]: prefix, torchrun's own lines by none
        assert {ln.rank for ln in view.lines} == {0, 1, None}
        assert all(ln.node == 0 for ln in view.lines)
        assert not view.follow  # a finished run: nothing to follow
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, LogScreen)


@aio
async def test_log_from_the_runs_screen_and_rank_filter(real):
    _, src = real
    app = create_app(src, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        table = app.screen.query_one(RunsTable)
        table.move_cursor(row=table.get_row_index(str(_run_id(app, RAISES))))
        await pilot.press("l")
        screen = await _log_screen(pilot)
        every = len(screen.query_one(LogView).lines)
        await pilot.press("r")  # all ranks → r0
        await pilot.pause()
        view = screen.query_one(LogView)
        assert screen.rank == 0 and view.lines and {ln.rank for ln in view.lines} == {0}
        assert len(view.lines) < every
        assert view.lines[view.cursor].text == "Traceback (most recent call last):"  # rank 0's own first error
        await pilot.press("r", "r")  # r1, then all ranks again
        await pilot.pause()
        assert screen.rank is None and len(view.lines) == every


@aio
async def test_log_of_the_selected_rank_from_the_run_screen(real):
    _, src = real
    app = create_app(src, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        app.open_run(_run_id(app, RAISES))
        await d.settle(pilot)
        ranks = app.screen.query_one(RankTable)
        ranks.move_cursor(row=ranks.get_row_index("0"))
        await pilot.press("L")
        screen = await _log_screen(pilot)
        view = screen.query_one(LogView)
        assert screen.rank == 0 and {ln.rank for ln in view.lines} == {0}
        assert any("Connection closed by peer" in ln.text for ln in view.lines)
        assert not any("CUDA out of memory" in ln.text for ln in view.lines)


@aio
async def test_log_search_next_and_previous(real):
    _, src = real
    app = create_app(src, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        app.open_logs(_run_id(app, RAISES))
        screen = await _log_screen(pilot)
        view = screen.query_one(LogView)
        await pilot.press("slash", *"connection closed", "enter")
        await pilot.pause()
        assert "Connection closed by peer" in view.lines[view.cursor].text
        found = view.cursor
        await pilot.press("slash", "ctrl+a", "ctrl+k", *"DDP_TRAIN.PY", "enter")  # a new search (any case)
        await pilot.pause()
        matches = [i for i, ln in enumerate(view.lines) if "ddp_train.py" in ln.text]
        assert len(matches) >= 3
        after = [i for i in matches if i > found]
        first = view.cursor
        assert first == after[0]  # the next match after the current line
        await pilot.press("n")
        await pilot.pause()
        second = view.cursor
        assert second == (after[1] if len(after) > 1 else matches[0])  # the next one, wrapping at the end
        await pilot.press("N")
        await pilot.pause()
        assert view.cursor == first
        await pilot.press("slash", "ctrl+a", "ctrl+k", *"no such text anywhere", "enter")
        await pilot.pause()
        assert view.cursor == first  # no match: the view stays where it was


@aio
async def test_log_follow_shows_an_appended_line(real_copy):
    root, src = real_copy
    app = create_app(src, poll_interval=0.02)
    stderr = root / RAISES / "nodes" / "node_0" / "training.stderr.log"
    async with app.run_test(size=(120, 20)) as pilot:
        await d.settle(pilot)
        app.open_logs(_run_id(app, RAISES))
        screen = await _log_screen(pilot)
        view = screen.query_one(LogView)
        await pilot.press("f")
        assert view.follow
        before = len(view.lines)
        with stderr.open("a") as f:
            f.write("[rank1]: appended while watching\n[rank0]: and a line without its newline")
        await _until(pilot, lambda: len(view.lines) > before)
        await pilot.pause()
        last = view.lines[-1]
        assert (last.rank, last.text) == (1, "appended while watching")  # the unfinished line waits for its end
        await _until(pilot, lambda: view.scroll_y == view.max_scroll_y and view.max_scroll_y > 0)
        with stderr.open("a") as f:
            f.write("\n")
        await _until(pilot, lambda: view.lines[-1].text == "and a line without its newline")
        assert view.lines[-1].rank == 0


@aio
async def test_an_empty_log_says_why_for_an_ended_and_a_vanished_run(tmp_path):
    """No line to show: an ended run "wrote no training output" (not "yet"), a run whose folder is gone says so."""
    import shutil

    root, index = fr.build_real_index(tmp_path)
    ended, gone = fr.name_of("completed"), fr.name_of("completed_finish")
    for log in (root / ended / "nodes").rglob("training.*.log"):
        log.write_bytes(b"")
    shutil.rmtree(root / gone)
    d.ingest(index, [root])  # the ingester marks the vanished run missing
    src = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    app = create_app(src, poll_interval=0.02)
    try:
        async with app.run_test(size=(120, 20)) as pilot:
            await d.settle(pilot)
            for name, words in ((ended, "the run wrote no training output (2 log files"),
                                (gone, "the run's folder is gone from disk")):
                app.open_logs(_run_id(app, name))
                screen = await _log_screen(pilot)
                status = str(screen.query_one("#log-status").render())
                assert status.startswith(words) and "yet" not in status, status
                await pilot.press("escape")
                await _until(pilot, lambda: not isinstance(pilot.app.screen, LogScreen))
    finally:
        src.close()


def test_log_tail_reads_at_most_max_bytes_and_skips_a_burst(tmp_path):
    """A huge log is read from its last ``max_bytes``; a burst larger than that is skipped, not read."""
    node = tmp_path / "nodes" / "node_0"
    node.mkdir(parents=True)
    log = node / "training.stdout.log"
    log.write_text("".join(f"line {i}\n" for i in range(10_000)))
    tail = LogTail(tmp_path, [(0, "stdout", "nodes/node_0/training.stdout.log")], max_bytes=1000)
    lines = tail.read()
    assert lines[-1].text == "line 9999" and 0 < len(lines) <= 1000 // len("line 9999\n") + 1
    assert not lines[0].text.startswith("ine")  # the cut first line is dropped, not shown in part
    assert tail.skipped_bytes > 0 and tail.read() == []
    with log.open("a") as f:
        f.write("".join(f"burst {i}\n" for i in range(1000)))
    burst = tail.read()
    assert burst[-1].text == "burst 999" and len(burst) < 1000


def test_log_tail_refuses_a_link(tmp_path):
    """A log replaced by a symbolic link is not followed (core/rundir.open_under)."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not a log\n")
    node = tmp_path / "run" / "nodes" / "node_0"
    node.mkdir(parents=True)
    (node / "training.stderr.log").symlink_to(secret)
    tail = LogTail(tmp_path / "run", [(0, "stderr", "nodes/node_0/training.stderr.log")])
    assert tail.read() == []


def _tree_text(tree: DescribeTree) -> list[str]:
    out = []

    def walk(node, depth: int) -> None:
        out.append("  " * depth + str(node.label))
        for child in node.children:
            walk(child, depth + 1)

    walk(tree.root, 0)
    return out


@aio
async def test_describe_shows_topology_hygiene_and_versions(real):
    _, src = real
    app = create_app(src, poll_interval=0.02)
    async with app.run_test(size=(100, 40)) as pilot:
        await d.settle(pilot)
        app.open_run(_run_id(app, RAISES))
        await d.settle(pilot)
        await pilot.press("d")
        await _until(pilot, lambda: isinstance(app.screen, DescribeScreen) and app.screen.loaded)
        lines = [ln.strip() for ln in _tree_text(app.screen.query_one(DescribeTree))]
        assert lines[0] == RAISES
        topology = lines.index("Topology")
        assert lines[topology + 1: topology + 5] == ["nnodes: 1", "nproc_per_node: 2", "world_size: 2",
                                                    "launch: torch.distributed.run"]
        assert "Guard contract: (unguarded run: no guard block declared)" in lines
        assert "Hygiene: (no hygiene block)" in lines
        assert "status: failed" in lines and "exit_code: 1" in lines
        assert "torch: 2.13.0+cpu" in lines  # final_summary.json's environment section
        await pilot.press("escape")
        await pilot.pause()
        # from the Runs screen, on the hygiene run
        while len(app.screen_stack) > 2:
            app.pop_screen()
        await pilot.pause()
        table = app.screen.query_one(RunsTable)
        table.move_cursor(row=table.get_row_index(str(_run_id(app, fr.name_of("hygiene")))))
        await pilot.press("d")
        await _until(pilot, lambda: isinstance(app.screen, DescribeScreen) and app.screen.loaded)
        lines = [ln.strip() for ln in _tree_text(app.screen.query_one(DescribeTree))]
        assert "Hygiene" in lines and "recipe: realruns-fixture-v1" in lines


GUARD_YAML = """guard:
  schema_version: 1
  workload:
    name: tiny-guarded
    parameters:
      model: linear
      per_rank_batch_size: 4
  measurement:
    start_step: 1
    completed_steps: 2
"""


@aio
async def test_describe_shows_the_guard_contract_and_log_labels_a_one_process_run(tmp_path, cli_env, traceml_cmd):
    """A real guarded one-process `traceml run`: Describe shows its declaration; its stdout lines are rank 0's."""
    (tmp_path / "traceml.yaml").write_text(GUARD_YAML)
    (tmp_path / "train.py").write_text("print('hello from training')\n")
    done = subprocess.run([*traceml_cmd, "run", "train.py", "--run-name", "guarded"], cwd=tmp_path, env=cli_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    index = tmp_path / "index.sqlite"
    d.ingest(index, [tmp_path / "logs"])
    src = IndexSource(index)
    try:
        app = create_app(src, poll_interval=0.02)
        async with app.run_test(size=(100, 40)) as pilot:
            await d.settle(pilot)
            app.open_describe(_run_id(app, "guarded"))
            await _until(pilot, lambda: isinstance(app.screen, DescribeScreen) and app.screen.loaded)
            lines = [ln.strip() for ln in _tree_text(app.screen.query_one(DescribeTree))]
            contract = lines.index("Guard contract")
            assert lines[contract + 1] == "declaration"
            assert "name: tiny-guarded" in lines and "completed_steps: 2" in lines
            assert any(ln.startswith("digest: sha256:") for ln in lines)
            await pilot.press("escape")
            app.open_logs(_run_id(app, "guarded"))
            screen = await _log_screen(pilot)
            view = screen.query_one(LogView)
            hello = next(ln for ln in view.lines if ln.text == "hello from training")
            assert (hello.rank, hello.stream, hello.node) == (0, "stdout", 0)
            assert view.cursor is None  # no error line: the view is at the end
    finally:
        src.close()
