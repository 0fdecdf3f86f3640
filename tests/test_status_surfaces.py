"""One word per run, rank and validation request, on every surface, for runs made by the real thing.

Each case of ``tests/support/realruns.py`` is a run directory left by the real SDK and
the real ``traceml run`` (a clean end without ``finish()``, with it, a rank
that raises, a rank SIGKILLed, a SIGINT'd launch, a hung rank, a hygiene run).
Every surface must say the same word: the reader, ``traceml status --json``,
``--oneline``, the status table, the Runs and Run screens of ``traceml watch``
and its alert path. A surface with a rule of its own fails its row here.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon.reader import Reader
from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.backlog import BacklogScreen
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.backlog_table import BacklogTable
from traceml_tui.tui.widgets.rank_table import RankTable
from traceml_tui.tui.widgets.runs_table import RunsTable

from support import tui_data as d

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Seconds of silence after which a rank is stalled in these tests (`--stall-after`); the hung case's
#: ranks have been silent for longer than this when its copy is taken.
STALL_AFTER = 1.0

#: case -> (run status, {rank: the rank states allowed}). The fixtures make the races deterministic
#: (torchrun's monitor interval lets rank 0 fail on its own before it is torn down; see tests/support/realruns.py).
EXPECTED: dict[str, tuple[str, dict[int, set[str]]]] = {
    "completed": ("completed", {0: {"completed"}, 1: {"completed"}}),  # rank_end "completed": the script returned
    "completed_finish": ("completed", {0: {"completed"}}),  # rank_end "completed" from traceml.finish()
    # the first failing rank keeps failed/lost; the peer that died in the next all-reduce is aborted (core/state.py)
    "rank_raises": ("failed", {0: {"aborted"}, 1: {"failed"}}),
    "rank_sigkilled": ("failed", {0: {"aborted"}, 1: {"lost"}}),  # rank 1: no end record, then rank 0 failed
    # sys.exit(3): the rank's own end record says `exited` with its code (written by the bootstrap)
    "rank_exits": ("failed", {0: {"aborted"}, 1: {"failed"}}),
    # every rank called sys.exit(3): the first to end is failed, the other aborted after it (which is first is
    # the records' times' call); each end record carries its code (the bootstrap), and a code an end record lacks
    # (a run from before it) comes from the summary (completed: such a run's rank torchrun SIGTERMed on its way
    # out, under load, before its own code was known)
    "all_exit": ("failed", {0: {"failed", "aborted", "completed"}, 1: {"failed", "aborted", "completed"}}),
    "single_exits": ("failed", {0: {"failed"}}),
    # rank 1 aborted at interpreter exit after every script returned: the run failed (its exit status), rank 0
    # completed, rank 1 failed, and the failure is a teardown crash (core.state.crashed_in_teardown)
    "teardown_crash": ("failed", {0: {"completed"}, 1: {"failed"}}),
    "interrupted": ("interrupted", {0: {"interrupted"}}),
    "hung": ("stalled", {0: {"stalled"}, 1: {"stalled"}}),
    # rank 1 never reached the all_reduce rank 0 timed out in: the hang's culprit failed, its peer aborted
    "hang": ("failed", {0: {"aborted"}, 1: {"failed"}}),
    "hygiene": ("completed", {0: {"completed"}}),
}
ALERTING = {"failed", "lost", "stalled"}


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_tui", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def _index_of(run, tmp_path: Path, env: dict) -> Path:
    """A fresh index holding only this run, built by a real `traceml daemon --once` process."""
    index = tmp_path / "index.sqlite"
    proc = _cli(["daemon", str(run.logs_dir), "--once", "--index", str(index), "--no-inotify"], env)
    assert proc.returncode == 0, proc.stderr
    time.sleep(STALL_AFTER * 1.2)  # let the ingest itself go quiet: a just-ingested silence is not yet a stall
    return index


async def _screens(run, tmp_path: Path) -> tuple[str, list[str], list[str]]:
    """(Runs-screen status cell, Run-screen rank states, alerts rung) while the run appears in a live index."""
    index = tmp_path / "live.sqlite"
    d.ingest(index, [tmp_path / "no-runs"])  # the app starts on an index without the run …
    source = IndexSource(index, stall_floor_s=STALL_AFTER)
    app = create_app(source, poll_interval=0.02)
    alerts: list[str] = []
    app._alert = alerts.append  # the alert path's one exit (bell + notification)
    async with app.run_test(size=(160, 40)) as pilot:
        await d.settle(pilot)
        d.ingest(index, [run.logs_dir])  # … then the ingester finds it, as it does for a new run
        await pilot.pause(STALL_AFTER * 1.2)  # a just-ingested silence is not yet a stall: let it become one
        await d.settle(pilot, rounds=3)
        table = pilot.app.screen.query_one(RunsTable)
        row = next(i for i in range(table.row_count) if table.get_row_at(i)[1] == run.name)
        status_cell = table.get_row_at(row)[0].plain
        pilot.app.open_run(next(r.run_id for r in pilot.app.runs_snapshot.rows if r.name == run.name))
        await d.settle(pilot)
        assert isinstance(pilot.app.screen, RunScreen)
        ranks = pilot.app.screen.query_one(RankTable)
        states = [d.status_word(ranks.get_row_at(i)[2]).lower() for i in range(ranks.row_count)]
    source.close()
    return status_cell, states, alerts


@pytest.mark.parametrize("case", list(EXPECTED))
def test_every_surface_says_the_same_word(case, real_runs, tmp_path, cli_env):
    run = real_runs[case]
    want_status, want_ranks = EXPECTED[case]
    index = _index_of(run, tmp_path, cli_env)

    with Reader(index, stall_floor_s=STALL_AFTER) as reader:
        (summary,) = reader.list_runs()
        rank_states = {rank: str(state) for rank, state in summary.rank_states}
    assert (summary.name, str(summary.status)) == (run.name, want_status)
    assert set(rank_states) == set(want_ranks)
    for rank, allowed in want_ranks.items():
        assert rank_states[rank] in allowed, (rank, rank_states)
    failure = json.loads((run.run_dir / "final_summary.json").read_text())["failure"] \
        if (run.run_dir / "final_summary.json").is_file() else None
    if failure is not None:  # the index's words are the summary's: its first failure, and its victims aborted
        assert rank_states[failure["rank"]] == failure["state"], (failure, rank_states)
        assert sorted(r for r, s in rank_states.items() if s == "aborted") == failure["victims"], rank_states

    status = _cli(["status", "--json", "--index", str(index), "--stall-after", str(STALL_AFTER)], cli_env)
    assert status.returncode == 0, status.stderr
    (as_json,) = json.loads(status.stdout)["runs"]
    assert as_json["status"] == want_status
    assert {int(k): v for k, v in as_json["rank_states"].items()} == rank_states
    assert {r["rank"]: r["state"] for r in as_json["ranks"] if r["latest"]} == rank_states

    oneline = _cli(["status", "--oneline", "--index", str(index), "--stall-after", str(STALL_AFTER)], cli_env)
    assert oneline.stdout.startswith(f"traceml: 1 {want_status}"), oneline.stdout

    table = _cli(["status", "--index", str(index), "--stall-after", str(STALL_AFTER)], cli_env)
    (line,) = [ln for ln in table.stdout.splitlines() if ln.startswith(run.name[:24])]
    at = table.stdout.splitlines()[0].index("STATUS")  # the name column is as wide as the longest name
    assert line[at:].split()[0] == want_status, line
    header = table.stdout.splitlines()[0]  # the columns after a wide status cell (`stalled r0,r1`) stay aligned
    ranks_end = header.index("RANKS") + len("RANKS")
    assert line[:ranks_end].split()[-1] == str(as_json["rank_count"]) and line[ranks_end] == " ", table.stdout

    status_cell, screen_ranks, alerts = asyncio.run(_screens(run, tmp_path))
    assert d.status_word(status_cell) == want_status
    assert screen_ranks == [rank_states[r] for r in sorted(rank_states)]
    assert bool(alerts) == (want_status in ALERTING), alerts
    if alerts:
        assert want_status in alerts[0]
    first = [r for r, s in rank_states.items() if s in ("failed", "lost")] if "aborted" in rank_states.values() else []
    if first:  # the alert names the rank that failed first, not its aborted peers
        assert f"rank {first[0]} failed first" in alerts[0], alerts


def test_backlog_words_agree_across_validate_status_index_and_screen(real_runs, tmp_path, cli_env):
    run = real_runs["hygiene"]
    expected = dict(run.expected_backlog)
    assert {"blocked", "stale-claim", "failed", "pending", "completed"} <= set(expected.values())

    proc = _cli(["validate", "status", str(run.run_dir), "--json"], cli_env)
    assert proc.returncode == 0, proc.stderr
    from_cli = {r["checkpoint"]: r["state"] for r in json.loads(proc.stdout)["requests"]}
    assert from_cli == expected

    index = _index_of(run, tmp_path, cli_env)
    with Reader(index) as reader:
        (summary,) = reader.list_runs()
        from_index = {b.checkpoint: str(b.state) for b in reader.backlog.entries(summary.run_id)}
    assert from_index == expected

    async def screen() -> dict[str, str]:
        source = IndexSource(index)
        app = create_app(source, poll_interval=0.02)
        async with app.run_test(size=(160, 40)) as pilot:
            await d.settle(pilot)
            pilot.app.open_backlog(None)
            await d.settle(pilot, rounds=3)
            assert isinstance(pilot.app.screen, BacklogScreen)
            table = pilot.app.screen.query_one(BacklogTable)
            out = {table.get_row_at(i)[1]: d.status_word(table.get_row_at(i)[3]) for i in range(table.row_count)}
        source.close()
        return out

    assert asyncio.run(screen()) == expected


def test_status_table_cuts_long_names_in_the_middle(tmp_path, cli_env, traceml_cmd):
    """Runs named alike (a timestamp suffix) stay distinguishable in the status table: the end is kept."""
    (tmp_path / "train.py").write_text(
        "import traceml_tui as traceml\ntraceml.init()\nfor _ in range(3):\n    with traceml.trace_step():\n"
        "        pass\n")
    names = ["guard-candidate-20261130-173447-and-a-long-experiment-suffix-1",
             "guard-candidate-20261130-173447-and-a-long-experiment-suffix-2"]
    for name in names:
        run = subprocess.run([*traceml_cmd, "run", "train.py", "--run-name", name], cwd=tmp_path, env=cli_env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
    index = tmp_path / "index.sqlite"
    ing = subprocess.run([*traceml_cmd, "daemon", str(tmp_path / "logs"), "--once", "--no-inotify", "--index",
                          str(index)], env=cli_env, capture_output=True, text=True, timeout=120)
    assert ing.returncode == 0, ing.stderr
    out = subprocess.run([*traceml_cmd, "status", "--index", str(index)], env=cli_env, capture_output=True,
                         text=True, timeout=60)
    shown = [line.split()[0] for line in out.stdout.splitlines()[1:]]
    assert len(shown) == 2 and len(set(shown)) == 2, out.stdout
    for cell in shown:
        assert "…" in cell and cell.endswith(("-1", "-2")) and cell.startswith("guard-cand"), cell


@pytest.mark.parametrize("args,code,words", [
    (["status", "--bogus"], 2, "unrecognized arguments: --bogus"),
    (["status", "--stall-after", "nan"], 2, "--stall-after"),
    (["status", "--stall-after", "-5"], 2, "--stall-after"),
    (["status", "--index", "."], 1, "is a folder, not an index file"),
    (["daemon", "--bogus"], 2, "unrecognized arguments: --bogus"),
    (["daemon", "logs", "--poll-interval", "inf"], 2, "--poll-interval"),
    (["daemon", "logs", "--metrics-retention", "nan"], 2, "--metrics-retention"),
    (["watch", "--bogus"], 2, "unrecognized arguments: --bogus"),
    (["watch", "--stall-after", "inf"], 2, "--stall-after"),
])
def test_status_daemon_and_watch_say_a_bad_command_line_in_one_line(args, code, words, tmp_path, cli_env):
    (tmp_path / "logs").mkdir()
    proc = subprocess.run([sys.executable, "-m", "traceml_tui", *args], cwd=tmp_path, env=cli_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_status_root_that_is_gone_lists_its_missing_runs_and_a_mistyped_one_is_one_line(tmp_path, cli_env,
                                                                                       traceml_cmd):
    """A root deleted since it was indexed still lists its runs (kept, marked missing: docs/daemon.md rule 7);
    a ROOT that never held a run is one line and exit 1, not "no runs"."""
    import shutil

    (tmp_path / "train.py").write_text("import traceml_tui as traceml\nwith traceml.trace_step():\n    pass\n")
    run = subprocess.run([*traceml_cmd, "run", "train.py", "--run-name", "kept", "--logs-dir", "old"], cwd=tmp_path,
                         env=cli_env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    index = tmp_path / "index.sqlite"
    for _ in range(2):  # index it, then (its folder gone) mark it missing
        ing = subprocess.run([*traceml_cmd, "daemon", "old", "--once", "--index", str(index)], cwd=tmp_path,
                             env=cli_env, capture_output=True, text=True, timeout=120)
        assert ing.returncode == 0, ing.stderr
        (tmp_path / "old").exists() and shutil.rmtree(tmp_path / "old")
        (tmp_path / "old").mkdir()
    shutil.rmtree(tmp_path / "old")
    gone = subprocess.run([*traceml_cmd, "status", "old", "--json", "--index", str(index)], cwd=tmp_path,
                          env=cli_env, capture_output=True, text=True, timeout=60)
    assert gone.returncode == 0, gone.stderr
    assert [(r["name"], r["status"]) for r in json.loads(gone.stdout)["runs"]] == [("kept", "missing")]
    typo = subprocess.run([*traceml_cmd, "status", "olb", "--index", str(index)], cwd=tmp_path, env=cli_env,
                          capture_output=True, text=True, timeout=60)
    assert typo.returncode == 1 and typo.stderr.strip() == \
        "traceml status: olb is not a folder, and the index has no runs under it"
