"""Failure forensics on real failed runs: the summary's ``failure`` section, the card, status and the Run screen.

The runs come from the real SDK and ``traceml run`` (tests/support/realruns.py):
``rank_raises`` (rank 1 raises ``RuntimeError("CUDA out of memory (simulated)")``
in step 5; rank 0 then fails in its all-reduce) and ``rank_sigkilled`` (rank 1
SIGKILLs itself after step 4; rank 0 fails in step 5's all-reduce). Every
surface must name rank 1 as the first failure and rank 0 as aborted after it.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Optional

import pytest

from traceml_tui.tui.app import create_app
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.failure_panel import FailurePanel
from traceml_tui.tui.widgets.rank_table import RankTable

from support import tui_data as d

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: case -> (state, cause, signal, exception line) of rank 1, the first failure
EXPECTED = {
    "rank_raises": ("failed", "cuda-oom", None, "RuntimeError: CUDA out of memory (simulated)"),
    "rank_sigkilled": ("lost", "killed", "SIGKILL", None),
    # sys.exit(3) after step 4: no exception; torchrun's report has the code its rank_end record lacks
    "rank_exits": ("failed", "exit-code", None, None),
}


def _summary(run) -> dict:
    return json.loads((run.run_dir / "final_summary.json").read_text())


def _reported_exit_code(run, rank: int) -> Optional[int]:
    """The exit code torchrun's report in the node's stderr gives ``rank`` (read here without the product);
    None when the report does not list it (torchrun stopped it without counting it a failure)."""
    text = (run.run_dir / "nodes/node_0/training.stderr.log").read_text()
    codes = re.findall(rf"rank\s*:\s*{rank} \(local_rank.*\n\s*exitcode\s*:\s*(-?\d+)", text)
    assert len(codes) <= 1, codes
    return int(codes[0]) if codes else None


def _status_json(index, cli_env) -> dict:
    """The one run of ``index`` as `traceml status --json` gives it."""
    proc = subprocess.run([sys.executable, "-m", "traceml_tui", "status", "--json", "--index", str(index)],
                          capture_output=True, text=True, env=cli_env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    (as_json,) = json.loads(proc.stdout)["runs"]
    return as_json


def _expected(run, case: str) -> tuple:
    """EXPECTED[case], for ``rank_exits`` as torchrun saw rank 1 end: its sys.exit(3), or (under load, seen in
    CI) SIGABRT from gloo tearing down a process that left mid-collective — still the first failure."""
    if case == "rank_exits" and _reported_exit_code(run, 1) == -6:
        return ("failed", "crash", "SIGABRT", None)
    return EXPECTED[case]


@pytest.mark.realruns("rank_raises", "rank_sigkilled", "rank_exits")
@pytest.mark.parametrize("case", list(EXPECTED))
def test_summary_failure_section_names_rank_1_first(real_runs, case) -> None:
    run = real_runs[case]
    state, cause, signal, exception = _expected(run, case)
    failure = _summary(run)["failure"]
    assert (failure["rank"], failure["node"], failure["step"], failure["last_step"]) == (1, 0, 5, 4)
    assert (failure["state"], failure["cause"], failure["signal"]) == (state, cause, signal)
    assert failure["exception"] == exception
    assert failure["victims"] == [0]
    assert failure["log"] == "nodes/node_0/training.stderr.log" and (run.run_dir / failure["log"]).is_file()
    # an artifact holds no absolute path and no host name
    text = json.dumps(failure)
    assert str(run.run_dir) not in text and "/work/" not in text and '"/' not in text
    for host in {socket.gethostname(), "localhost", "127.0.0.1"}:
        assert host not in text
    card = (run.run_dir / "final_summary.txt").read_text()
    assert f"Failure: rank 1 on node 0, in step 5 — {cause}" in card
    assert "r0 aborted after r1" in card
    if exception:
        assert exception in card


@pytest.mark.realruns("rank_exits", "single_exits")
def test_an_exit_code_without_an_exception_is_the_failure(real_runs) -> None:
    """sys.exit(3) under `traceml run`: the bootstrap writes rank_end `exited` with code 3 (the SDK's exit hook
    alone could not see it); torchrun's report (2 ranks) or the process's exit status (one process) agrees: the
    rank is the failure, cause exit-code, exit code 3 (or the SIGABRT torchrun reports when gloo aborted the
    leaving rank: cause crash)."""
    run = real_runs["rank_exits"]
    end = json.loads((run.run_dir / "ranks/rank_1/steps-0.jsonl").read_text().splitlines()[-1])
    assert (end["kind"], end["status"], end["exit_code"], end["step"]) == ("rank_end", "exited", 3, 4)
    ddp = _summary(run)["failure"]
    code = _reported_exit_code(run, 1)
    assert code in (3, -6)
    assert (ddp["rank"], ddp["exit_code"], ddp["cause"]) == (1, code, "exit-code" if code == 3 else "crash")
    single = _summary(real_runs["single_exits"])["failure"]
    assert (single["rank"], single["node"], single["step"], single["state"], single["exit_code"], single["cause"]) \
        == (0, 0, 5, "failed", 3, "exit-code")


@pytest.mark.realruns("completed")
def test_a_completed_run_has_no_failure_section(real_runs) -> None:
    run = real_runs["completed"]
    assert _summary(run)["failure"] is None
    assert "Failure:" not in (run.run_dir / "final_summary.txt").read_text()


@pytest.mark.realruns("rank_raises", "rank_sigkilled", "rank_exits")
@pytest.mark.parametrize("case", list(EXPECTED))
def test_status_and_run_screen_show_culprit_and_victim(real_runs, case, tmp_path, cli_env) -> None:
    run = real_runs[case]
    state, cause, _signal, exception = _expected(run, case)
    index = tmp_path / "index.sqlite"
    d.ingest(index, [run.logs_dir])

    as_json = _status_json(index, cli_env)
    assert as_json["status"] == "failed"
    assert as_json["rank_states"] == {"0": "aborted", "1": state}
    failure = as_json["failure"]
    assert (failure["rank"], failure["node"], failure["step"], failure["cause"]) == (1, 0, 5, cause)
    assert failure["exception"] == exception and failure["victims"] == [0]
    table = subprocess.run([sys.executable, "-m", "traceml_tui", "status", "--index", str(index)],
                           capture_output=True, text=True, env=cli_env, timeout=120, check=False)
    (line,) = [ln for ln in table.stdout.splitlines() if ln.startswith(run.name)]
    at = table.stdout.splitlines()[0].index("STATUS")  # the name column is as wide as the longest name
    assert line[at:].split()[:2] == ["failed", "r1"], line  # the culprit, not the aborted rank 0

    async def screen() -> tuple[str, list[str]]:
        source = IndexSource(index)
        app = create_app(source, poll_interval=0.02)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                await d.settle(pilot)
                app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == run.name))
                await d.settle(pilot)
                panel = app.screen.query_one(FailurePanel)
                assert panel.display
                table = app.screen.query_one(RankTable)
                words = [d.status_word(table.get_row_at(i)[2]).lower() for i in range(table.row_count)]
                return panel.render().plain, words
        finally:
            source.close()

    text, words = asyncio.run(screen())
    assert f"Failure: rank 1 on node 0, in step 5 — {cause}" in text
    assert "r0 aborted after r1" in text and "log: nodes/node_0/training.stderr.log" in text
    if exception:
        assert exception in text
    assert words == ["aborted", state]


def test_before_the_summary_the_panel_names_the_first_failure_from_the_rank_states(tmp_path) -> None:
    # the committed real rank-raises run without its final summary: the launcher has not finalized it (yet)
    from support import fixture_runs as fr

    root = tmp_path / "logs"
    shutil.copytree(fr.FIXTURE_RUNS / fr.name_of("rank_raises"), root / fr.name_of("rank_raises"))
    for name in ("final_summary.json", "final_summary.txt"):
        (root / fr.name_of("rank_raises") / name).unlink()
    index = tmp_path / "index.sqlite"
    d.ingest(index, [root])

    async def screen() -> str:
        source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
        app = create_app(source, poll_interval=0.02)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                await d.settle(pilot)
                app.open_run(app.runs_snapshot.rows[0].run_id)
                await d.settle(pilot)
                return app.screen.query_one(FailurePanel).render().plain
        finally:
            source.close()

    text = asyncio.run(screen())
    assert "rank 1 on node 0, in step 5 — unknown (no final summary" in text
    assert "r0 aborted after r1" in text


def test_a_sigkilled_launcher_leaves_a_lost_run_with_terminated_ranks(tmp_path, cli_env) -> None:
    # real `traceml run` (2-rank gloo DDP), SIGKILLed while training: its lifeline SIGTERMs torchrun, torchrun
    # SIGTERMs the ranks, the SDK records each rank_end "terminated"; nobody finalizes, so the run is lost once
    # the launcher's lease (2 s here) has expired (docs/run.md, "Launcher lease")
    import psutil

    from support import realruns

    logs, pids = tmp_path / "logs", tmp_path / "pids"
    env = realruns.subprocess_env(tmp_path / "state", TRACEML_LAUNCHER_LEASE_S="2")
    args = [str(realruns.DDP_SCRIPT), "--run-name", "orphaned", "--logs-dir", str(logs), "--nproc-per-node", "2",
            "--args", "--steps", "100000", "--sleep", "0.05", "--pid-dir", str(pids)]
    with open(tmp_path / "launcher.err", "wb") as err:
        launcher = subprocess.Popen([*realruns.TRACEML, "run", *args], cwd=tmp_path, env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)
    run_dir = logs / "orphaned"
    try:
        deadline = time.monotonic() + realruns.LAUNCH_TIMEOUT_S
        while realruns.count_steps(run_dir, 0) < 5 or realruns.count_steps(run_dir, 1) < 5:
            assert launcher.poll() is None and time.monotonic() < deadline, (tmp_path / "launcher.err").read_text()
            time.sleep(0.05)
        ranks = [psutil.Process(int(p.read_text())) for p in sorted(pids.glob("*.pid"))]
        launcher.kill()
        launcher.wait(timeout=15)
        gone, alive = psutil.wait_procs(ranks, timeout=30)
        assert alive == [], "ranks outlived their launcher"
    finally:
        realruns._kill_all(realruns._tree(launcher.pid))
    for rank in (0, 1):
        last = json.loads((run_dir / "ranks" / f"rank_{rank}" / "steps-0.jsonl").read_bytes().splitlines()[-1])
        assert (last["kind"], last["status"], last["exit_code"]) == ("rank_end", "terminated", 143)
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "running"  # nobody finalized it

    index = tmp_path / "index.sqlite"
    d.ingest(index, [logs])
    time.sleep(2.5)  # the lease (2 s) unchanged by the daemon's clock, and the stall limit below (1 s)
    d.ingest(index, [logs])  # the daemon looks at the lease again: not seen to change for longer than its length

    def status() -> dict:
        proc = subprocess.run([sys.executable, "-m", "traceml_tui", "status", "--json", "--index", str(index),
                               "--stall-after", "1"], capture_output=True, text=True, env=cli_env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        (run,) = json.loads(proc.stdout)["runs"]
        return run

    run = status()
    assert run["status"] == "lost"
    assert run["rank_states"] == {"0": "interrupted", "1": "interrupted"}

    async def screen() -> str:
        source = IndexSource(index, stall_floor_s=1.0)
        app = create_app(source, poll_interval=0.02)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                await d.settle(pilot)
                app.open_run(app.runs_snapshot.rows[0].run_id)
                await d.settle(pilot)
                return app.screen.query_one(FailurePanel).render().plain
        finally:
            source.close()

    assert "Failure: the launcher — launcher-lost (the launcher died before finalizing the run)" in asyncio.run(screen())


@pytest.mark.realruns("all_exit")
def test_every_rank_whose_code_decided_its_state_is_in_the_summary(real_runs) -> None:
    """Every rank called sys.exit(3): the summary names the first as the failure, the other as aborted after it.
    Under `traceml run` the bootstrap writes each rank's code in its own end record (``exited``, 3) as the script
    raises SystemExit; the summary carries a launcher-reported code only for a rank whose record has none, so the
    index (which reads them from the summary) gives each rank the same word (tests/test_status_surfaces.py)."""
    run = real_runs["all_exit"]
    failure = _summary(run)["failure"]
    ends = {rank: json.loads((run.run_dir / f"ranks/rank_{rank}/steps-0.jsonl").read_text().splitlines()[-1])
            for rank in (0, 1)}
    own = {rank for rank, end in ends.items() if (end["status"], end["exit_code"]) == ("exited", 3)}
    # on a loaded machine torchrun may stop one rank (terminated) before its own sys.exit: then it is aborted
    assert own and all(end["status"] == "terminated" for rank, end in ends.items() if rank not in own), ends
    reported = {rank: _reported_exit_code(run, rank) for rank in (0, 1)}
    stood_in = {str(rank): code for rank, code in reported.items()
                if ends[rank]["exit_code"] is None and ends[rank]["status"] == "exited" and code in (3, -6)}
    assert failure["exit_codes"] == stood_in, (failure, reported)
    assert failure["state"] == "failed" and failure["rank"] in own
    assert failure["victims"] == [r for r in (0, 1) if r != failure["rank"]]


@pytest.mark.realruns("teardown_crash")
def test_a_crash_after_training_reads_as_a_teardown_crash_on_every_surface(real_runs, tmp_path, cli_env) -> None:
    """Rank 1 trained its 4 steps, its script returned, then it aborted (SIGABRT) while the interpreter shut down —
    as gloo's abort at exit does. The exit status stays a failure (the launcher's, the guard's), but every surface
    says what it was: training completed, a crash in teardown after the last step; not a crash "in step 5"."""
    run = real_runs["teardown_crash"]
    for rank in (0, 1):  # the bootstrap wrote each rank's end as its script returned, before the abort
        end = json.loads((run.run_dir / f"ranks/rank_{rank}/steps-0.jsonl").read_text().splitlines()[-1])
        assert (end["kind"], end["status"], end["step"]) == ("rank_end", "completed", 4)
    summary = _summary(run)
    assert run.returncode != 0 and summary["run_context"]["run"]["status"] == "failed"
    failure = summary["failure"]
    assert (failure["rank"], failure["cause"], failure["step"], failure["last_step"]) == (1, "teardown-crash", None, 4)
    assert (failure["signal"], failure["victims"]) == ("SIGABRT", [])
    line = "Failure: rank 1 on node 0, after its last step (4) — teardown-crash (training completed"
    assert line in (run.run_dir / "final_summary.txt").read_text()

    index = tmp_path / "index.sqlite"
    d.ingest(index, [run.logs_dir])
    as_json = _status_json(index, cli_env)
    assert as_json["rank_states"] == {"0": "completed", "1": "failed"}
    assert (as_json["failure"]["cause"], as_json["failure"]["step"]) == ("teardown-crash", None)
    assert as_json["status_text"] == "failed r1 after training"  # the word every surface prints (describe)
    table = subprocess.run([sys.executable, "-m", "traceml_tui", "status", "--index", str(index)],
                           capture_output=True, text=True, env=cli_env, timeout=120, check=False)
    (row,) = [ln for ln in table.stdout.splitlines() if ln.startswith(run.name)]
    assert "failed r1 after training" in row

    async def screen() -> tuple[str, str]:
        source = IndexSource(index)
        app = create_app(source, poll_interval=0.02)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                await d.settle(pilot)
                (row,) = [r for r in app.runs_snapshot.rows if r.name == run.name]
                app.open_run(row.run_id)
                await d.settle(pilot)
                return row.marks, app.screen.query_one(FailurePanel).render().plain
        finally:
            source.close()

    marks, panel = asyncio.run(screen())
    assert marks == "after training" and line in panel


def test_an_interrupted_run_without_a_hang_is_not_analysed_further(monkeypatch):
    """A run stopped from outside has a failure only when it was hung (run/launch.py): without a hang record the
    analysis ends before the node logs are read and host names looked up (DNS in a scheduler's grace period)."""
    from pathlib import Path

    from traceml_tui.run.failure import failure_section

    run = Path(__file__).resolve().parent / "fixtures" / "runs" / "interrupted"
    manifest = json.loads((run / "manifest.json").read_text())

    def no_lookup(*_args):
        raise AssertionError("host names looked up")

    monkeypatch.setattr(socket, "getfqdn", no_lookup)
    monkeypatch.setattr(socket, "gethostname", no_lookup)
    assert failure_section(run, manifest.get("exit_code"), only_hang=True) is None
