"""Sanity of the real-run fixtures (tests/support/realruns.py): raw facts read from their files.

No status rule is applied here: only what the SDK and the launcher wrote
(manifest fields, each rank's records, backlog files), so these tests hold
whatever words the status rules use.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import psutil
import pytest

from support import realruns
from support.shared_runs import SharedRealRuns


def _records(run_dir: Path, rank: int) -> list[dict]:
    data = (run_dir / "ranks" / f"rank_{rank}" / "steps-0.jsonl").read_bytes()
    assert data.endswith(b"\n"), f"rank {rank} ends in a partial line"
    return [json.loads(line) for line in data.splitlines()]


def _steps(run_dir: Path, rank: int) -> list[int]:
    return [r["step"] for r in _records(run_dir, rank) if r["kind"] == "step"]


def _rank_ends(run_dir: Path, rank: int) -> list[dict]:
    return [r for r in _records(run_dir, rank) if r["kind"] == "rank_end"]


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def test_the_mapping_is_lazy_and_lists_every_case(tmp_path: Path) -> None:
    runs = realruns.RealRuns(tmp_path)
    assert list(runs) == list(realruns.CASES) and len(runs) == len(realruns.BUILDERS) == 13
    assert runs.built() == {} and list(tmp_path.iterdir()) == []
    with pytest.raises(KeyError):
        runs["no-such-case"]


def test_a_failing_case_raises_on_every_access_and_spares_the_others(tmp_path: Path, monkeypatch) -> None:
    calls = []

    def ok(ctx):
        calls.append(ctx.case)
        return realruns.RealRun(case=ctx.case, name=ctx.name, run_dir=ctx.run_dir, logs_dir=ctx.logs_dir,
                                work_dir=ctx.work_dir, now_hint=1.0)

    def broken(ctx):
        calls.append(ctx.case)
        raise realruns.CaseBuildError(f"{ctx.case}: boom")

    for case in realruns.CASES:
        monkeypatch.setitem(realruns.BUILDERS, case, ok)
    monkeypatch.setitem(realruns.BUILDERS, "completed", broken)
    runs = realruns.RealRuns(tmp_path)
    for _ in range(2):
        with pytest.raises(realruns.CaseBuildError, match="boom"):
            runs["completed"]
    assert runs["hung"].run_dir == tmp_path / "hung" / "logs" / "hung"
    runs.prefetch(["interrupted", "hung", "no-such-case"])
    assert runs["interrupted"].name == "interrupted"
    runs.close()
    assert calls == ["completed", "hung", "interrupted"]  # each built once, the failed one too
    assert sorted(runs.built()) == ["hung", "interrupted"]


def _quick_builders(monkeypatch, log: Path) -> None:
    """Every case built in a moment (a file in its run folder); ``completed`` fails. Each build appends the
    case to ``log`` (O_APPEND: one line per build, from whichever process built it)."""

    def quick(ctx):
        with open(log, "a") as f:
            f.write(ctx.case + "\n")
        time.sleep(0.2)  # long enough that the processes overlap
        if ctx.case == "completed":
            raise realruns.CaseBuildError(f"{ctx.case}: boom")
        ctx.run_dir.mkdir(parents=True)
        (ctx.run_dir / "manifest.json").write_text("{}")
        return realruns.RealRun(case=ctx.case, name=ctx.name, run_dir=ctx.run_dir, logs_dir=ctx.logs_dir,
                                work_dir=ctx.work_dir, now_hint=1.0, expected_backlog={"step-1": "pending"})

    for case in realruns.CASES:
        monkeypatch.setitem(realruns.BUILDERS, case, quick)


def _use_every_case(root: Path, out: Path) -> None:
    """One test process of a session: prefetch every case, then read each (as the real_runs fixture does)."""
    runs = SharedRealRuns(root, builders=1)
    runs.prefetch(realruns.CASES)
    seen = {}
    for case in realruns.CASES:
        try:
            run = runs[case]
            seen[case] = [str(run.run_dir), dict(run.expected_backlog)]
        except realruns.CaseBuildError as exc:
            seen[case] = str(exc)
    runs.close()
    out.write_text(json.dumps(seen))


def test_shared_runs_are_built_once_for_every_process_of_a_session(tmp_path: Path, monkeypatch) -> None:
    """pytest -n N: each worker process asks for every case; each case is built once in all (the failed one
    too) and every process sees the same run folders and the same error."""
    log = tmp_path / "builds.log"
    _quick_builders(monkeypatch, log)
    root = tmp_path / "shared"
    fork = multiprocessing.get_context("fork")  # the children keep the quick builders
    children = [fork.Process(target=_use_every_case, args=(root, tmp_path / f"seen-{i}.json")) for i in range(2)]
    for child in children:
        child.start()
    _use_every_case(root, tmp_path / "seen-main.json")
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    assert sorted(log.read_text().split()) == sorted(realruns.CASES)
    seen = [json.loads((tmp_path / f"seen-{i}.json").read_text()) for i in ("main", 0, 1)]
    assert seen[0] == seen[1] == seen[2]
    assert seen[0]["completed"] == "completed: boom"
    assert seen[0]["hung"] == [str(root / "hung" / "logs" / "hung"), {"step-1": "pending"}]


def test_shared_runs_say_which_files_a_test_changed(tmp_path: Path, monkeypatch) -> None:
    _quick_builders(monkeypatch, tmp_path / "builds.log")
    runs = SharedRealRuns(tmp_path / "shared")
    hung, interrupted = runs["hung"], runs["interrupted"]
    assert runs.changed() == []
    (hung.run_dir / "manifest.json").write_text('{"status": "changed"}')
    (interrupted.run_dir / "extra.json").write_text("{}")
    assert runs.changed() == [f"{hung.run_dir / 'manifest.json'}: changed", f"{interrupted.run_dir / 'extra.json'}: added"]
    (interrupted.run_dir / "manifest.json").unlink()
    assert f"{interrupted.run_dir / 'manifest.json'}: removed" in runs.changed()


@pytest.mark.slow
@pytest.mark.parametrize("case,world,rank_end_status", [
    pytest.param("completed", 2, "completed", marks=pytest.mark.realruns("completed")),
    pytest.param("completed_finish", 1, "completed", marks=pytest.mark.realruns("completed_finish")),
])
def test_completed_runs_end_every_rank_with_rank_end(real_runs, case: str, world: int, rank_end_status: str) -> None:
    run = real_runs[case]
    assert run.case == case and run.run_dir == run.logs_dir / run.name and run.returncode == 0
    manifest = _manifest(run.run_dir)
    assert (manifest["status"], manifest["exit_code"]) == ("completed", 0)
    assert manifest["topology"] == {"nnodes": 1, "nproc_per_node": world, "world_size": world}
    assert sorted(p.name for p in (run.run_dir / "ranks").iterdir()) == [f"rank_{r}" for r in range(world)]
    for rank in range(world):
        records = _records(run.run_dir, rank)
        assert records[0]["kind"] == "header" and records[0]["world_size"] == world
        assert _steps(run.run_dir, rank) == list(range(1, 9))
        last = records[-1]
        assert (last["kind"], last["status"], last["step"]) == ("rank_end", rank_end_status, 8)
        assert len(_rank_ends(run.run_dir, rank)) == 1
    assert (run.run_dir / "final_summary.json").is_file()
    assert run.now_hint >= manifest["ended_at"]


@pytest.mark.slow
@pytest.mark.realruns("rank_raises")
def test_rank_raises(real_runs) -> None:
    run = real_runs["rank_raises"]
    manifest = _manifest(run.run_dir)
    assert manifest["status"] == "failed" and manifest["exit_code"] == run.returncode != 0
    assert _steps(run.run_dir, 1) == [1, 2, 3, 4]  # step 5 raised: never recorded as completed
    (end,) = _rank_ends(run.run_dir, 1)
    assert (end["status"], end["step"], end["exit_code"]) == ("failed", 4, 1)
    assert _records(run.run_dir, 1)[-1] == end
    assert "CUDA out of memory (simulated)" in (run.run_dir / "nodes/node_0/training.stderr.log").read_text()
    # rank 0 fails in its next collective (torchrun checks its workers only every second here)
    assert _steps(run.run_dir, 0) == [1, 2, 3, 4]
    assert [(e["status"], e["step"]) for e in _rank_ends(run.run_dir, 0)] == [("failed", 4)]
    assert _records(run.run_dir, 0)[-1]["kind"] == "rank_end"


@pytest.mark.slow
@pytest.mark.realruns("rank_sigkilled")
def test_rank_sigkilled(real_runs) -> None:
    run = real_runs["rank_sigkilled"]
    manifest = _manifest(run.run_dir)
    assert manifest["status"] == "failed" and manifest["exit_code"] == run.returncode != 0
    assert _steps(run.run_dir, 1) == [1, 2, 3, 4]
    assert _rank_ends(run.run_dir, 1) == []  # SIGKILL: no exit hook ran
    assert _records(run.run_dir, 1)[-1]["kind"] == "step"
    assert _steps(run.run_dir, 0) == [1, 2, 3, 4]  # step 5's all-reduce failed on the closed connection
    assert [(e["status"], e["step"]) for e in _rank_ends(run.run_dir, 0)] == [("failed", 4)]
    assert (run.run_dir / "final_summary.json").is_file()


@pytest.mark.slow
@pytest.mark.realruns("interrupted")
def test_interrupted(real_runs) -> None:
    run = real_runs["interrupted"]
    manifest = _manifest(run.run_dir)
    assert manifest["status"] == "interrupted" and manifest["exit_code"] == run.returncode != 0
    assert len(_steps(run.run_dir, 0)) >= 5
    assert _records(run.run_dir, 0)[-1]["kind"] == "rank_end"  # the script's KeyboardInterrupt ran its exit hook
    assert (run.run_dir / "final_summary.json").is_file()


@pytest.mark.slow
@pytest.mark.realruns("hung")
def test_hung_is_a_copy_taken_while_rank_1_was_stopped(real_runs) -> None:
    run = real_runs["hung"]
    assert run.returncode is None and run.captured_at is not None and run.now_hint == run.captured_at
    manifest = _manifest(run.run_dir)
    assert (manifest["status"], manifest["ended_at"], manifest["exit_code"]) == ("running", None, None)
    assert not (run.run_dir / "final_summary.json").exists()
    assert _steps(run.run_dir, 1) == [1, 2, 3, 4, 5]  # stopped itself after step 5
    assert _steps(run.run_dir, 0) == [1, 2, 3, 4, 5]  # blocked in step 6's all-reduce
    last_ts = max(r["ts"] for rank in (0, 1) for r in _records(run.run_dir, rank))
    assert run.captured_at - last_ts >= realruns.HUNG_SETTLE_S
    for rank in (0, 1):
        assert _rank_ends(run.run_dir, rank) == []
    # the live run it was copied from is gone, and so is every process of it
    pids = [int(p.read_text()) for p in (run.work_dir / "pids").glob("*.pid")]
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)


@pytest.mark.slow
@pytest.mark.realruns("hygiene")
def test_hygiene_backlog_files(real_runs) -> None:
    run = real_runs["hygiene"]
    assert _manifest(run.run_dir)["status"] == "completed" and "hygiene" in _manifest(run.run_dir)
    assert dict(run.expected_backlog) == {
        "step-00000000": "completed",
        "step-00000002": "completed",
        "step-00000004": "failed",
        "step-00000006": "blocked",
        "step-00000008": "stale-claim",
        "step-00000010": "pending",
    }
    validation = run.run_dir / "validation"

    def names(kind: str) -> list[str]:
        return sorted(p.name for p in (validation / kind).glob("*.json") if not p.name.startswith("."))

    assert names("requests") == [f"step-{s:08d}.json" for s in (0, 2, 4, 6, 8, 10)]
    assert names("receipts") == ["step-00000000.json", "step-00000002.json"]
    assert names("failures") == ["step-00000004-1.json", "step-00000006-1.json", "step-00000006-2.json",
                                 "step-00000006-3.json"]
    assert names("claims") == ["step-00000008.json"]
    receipt = json.loads((validation / "receipts/step-00000002.json").read_text())
    assert set(receipt["metrics"]) == {"r2", "mse"} and receipt["step"] == 2
    failure = json.loads((validation / "failures/step-00000004-1.json").read_text())
    assert failure["attempt"] == 1 and "exit code 3" in failure["error"]
    claim = json.loads((validation / "claims/step-00000008.json").read_text())
    assert not _alive(claim["owner"]["pid"])  # its drainer was SIGKILLed
    for step in (0, 2, 4, 6, 8, 10):  # every published checkpoint exists and is recorded by rank 0
        assert (run.run_dir / "checkpoints" / f"step-{step:08d}.pt").is_file()
    assert [r["id"] for r in _records(run.run_dir, 0) if r["kind"] == "checkpoint"] == list(run.expected_backlog)


@pytest.mark.slow
@pytest.mark.realruns("hung")
def test_nothing_built_is_left_running(real_runs) -> None:
    real_runs["hung"]  # the case that kills its own processes
    # The folders of the cases whose build returned: under pytest -n another worker may be building other cases
    # in the shared root right now (support/shared_runs.py); those builds have not returned yet.
    roots = [str(work) + os.sep for work in real_runs.finished()]
    assert str(real_runs["hung"].work_dir) + os.sep in roots
    # Other workers' tests read those folders too (e.g. `traceml daemon --once` over a finished case) while this
    # test looks; their processes are children of a live worker, not leftovers. A leftover of a build is an orphan
    # (its launcher is gone) or a child of this worker.
    others = _other_workers()
    leftovers = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        try:
            text = " ".join(proc.info["cmdline"] or []) + " " + (proc.info["cwd"] or "") + os.sep
            if not any(root in text for root in roots):
                continue
            if others & {parent.pid for parent in proc.parents()}:
                continue
        except psutil.Error:
            continue
        leftovers.append((proc.info["pid"], text[:200]))
    assert leftovers == []


def _other_workers() -> set[int]:
    """The pids of the other pytest-xdist workers of this session (none when not under xdist)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return set()
    try:
        return {p.pid for p in psutil.Process(os.getppid()).children() if p.pid != os.getpid()}
    except psutil.Error:
        return set()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
