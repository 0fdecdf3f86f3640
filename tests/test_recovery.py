"""Recovery saves and the split record (seed 004, "Write Checkpoints So A Run Can Actually Resume").

Real runs of tests/scripts/resume_train.py through `traceml run` (one process, CPU):
40 updates straight, and 40 updates interrupted with SIGINT at update ~20 and
resumed with `--resume`. The resumed run must end bit-identical to the straight one.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from traceml_tui.core import records
from traceml_tui.core.atomic import atomic_write_json
from traceml_tui.core.rundir import RunDir
from traceml_tui.sdk import recovery

from support import realruns
from support.lanes import IMPORTS_TORCH, needs

pytestmark = needs("torch")  # saves are torch files (imported where used: README, "test lanes")

SCRIPT = realruns.SCRIPTS / "resume_train.py"
STEPS = 40
EVERY, KEEP = 5, 2


def _config() -> dict:
    return {
        "mode": "summary",
        "history_enabled": True,
        "hygiene": {
            "history": {"schema": 1, "output": "ranks"},
            "curve": {"cadence": 10},
            "validation": {"recipe": "resume-test-v1", "cadence": 10, "first_evaluation": 0,
                           "worker": ["python", "absent.py", "--checkpoint", "{checkpoint}"],
                           "dispatcher": "external"},
            "early_stopping": {"enabled": False, "reason": "a fixed 40 updates"},
            "qc": {"cadence": 10},
            "recovery": {"every": EVERY, "keep": KEEP},
        },
    }


def _args(work: Path, name: str, *extra: str, script_args: tuple = ()) -> list[str]:
    return [str(SCRIPT), "--run-name", name, "--logs-dir", str(work / "logs"), *extra,
            "--args", "--steps", str(STEPS), *map(str, script_args)]


def _launch(work: Path, name: str, *extra: str, script_args: tuple = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*realruns.TRACEML, "run", *_args(work, name, *extra, script_args=script_args)], cwd=work,
                          env=realruns.subprocess_env(work / "state"), capture_output=True, text=True,
                          timeout=realruns.LAUNCH_TIMEOUT_S)


def _final_steps(run_dir: Path) -> dict[int, records.Step]:
    """Each update's record from the newest attempt that wrote it (a resume supersedes repeated updates)."""
    out: dict[int, records.Step] = {}
    for stream in sorted(RunDir(run_dir).step_files(0), key=lambda s: s.attempt):
        for line in stream.path.read_bytes().splitlines():
            record = records.decode(line)
            if isinstance(record, records.Step):
                out[record.step] = record
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("recovery")
    (work / "traceml.yaml").write_text(yaml.safe_dump(_config(), sort_keys=False))
    straight = _launch(work, "straight", script_args=("--final", work / "straight.pt"))
    assert straight.returncode == 0, straight.stderr[-3000:]
    cut_dir = work / "logs" / "cut"
    env = realruns.subprocess_env(work / "state")
    with realruns._Launch(_args(work, "cut", script_args=("--sleep", 0.25)), work, env, work / "cut") as launch:
        realruns._wait_for(lambda: realruns.count_steps(cut_dir, 0) >= 20, realruns.LAUNCH_TIMEOUT_S,
                           "20 updates", launch)
        launch.proc.send_signal(signal.SIGINT)
        interrupted_rc = launch.wait(timeout=120)
    interrupted_at = realruns.count_steps(cut_dir, 0)
    saves_before = [s.path.name for s in recovery.list_saves(cut_dir, 0)]
    resumed = _launch(work, "cut", "--resume", script_args=("--final", work / "cut.pt"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return {"work": work, "straight": work / "logs" / "straight", "cut": cut_dir, "interrupted_rc": interrupted_rc,
            "interrupted_at": interrupted_at, "saves_before": saves_before, "resumed_stderr": resumed.stderr}


@pytest.mark.slow
def test_interrupted_and_resumed_run_ends_bit_identical(runs: dict) -> None:
    import torch

    assert runs["interrupted_rc"] != 0 and STEPS > runs["interrupted_at"] >= 20
    straight = torch.load(runs["work"] / "straight.pt")
    resumed = torch.load(runs["work"] / "cut.pt")
    assert straight.keys() == resumed.keys()
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
    a, b = _final_steps(runs["straight"]), _final_steps(runs["cut"])
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    for step in range(21, STEPS + 1):
        assert (a[step].loss, a[step].lr, a[step].grad_norm, a[step].examples) == \
               (b[step].loss, b[step].lr, b[step].grad_norm, b[step].examples), step
    assert b[STEPS].examples == STEPS * 16
    # the resumed attempt continued after the newest save of the interrupted one, not from update 1
    newest = max(int(name[5:13]) for name in runs["saves_before"])
    first_resumed = min(r.step for r in b.values() if r.attempt == 1)
    assert first_resumed == newest + 1 and newest % EVERY == 0
    assert f"restored update {newest}" in runs["resumed_stderr"]


@pytest.mark.slow
def test_recovery_saves_stay_bounded_and_never_request_validation(runs: dict) -> None:
    assert [s.step for s in recovery.list_saves(runs["straight"], 0)] == [35, 40]
    # the resumed run keeps the newest two and the save its resume record refers to
    resumed_from = json.loads((runs["cut"] / "recovery" / recovery.RESUMES).read_text().splitlines()[-1])
    kept = {s.path.relative_to(runs["cut"]).as_posix() for s in recovery.list_saves(runs["cut"], 0)}
    assert kept == {resumed_from["path"], "recovery/rank_0/step-00000035.attempt-1.pt",
                    "recovery/rank_0/step-00000040.attempt-1.pt"}
    for run_dir in (runs["straight"], runs["cut"]):
        assert RunDir(run_dir).backlog_files("requests") == []  # no save published a checkpoint
        # lr and grad_norm logged, early stopping disabled with its reason: the hygiene rules have nothing to say
        assert json.loads((run_dir / "final_summary.json").read_text())["hygiene_warnings"] == []
        assert not list((run_dir / "recovery").rglob("*.tmp"))


def _save(run_dir: Path, step: int) -> Path:
    return recovery.write_save(run_dir, 0, step, 0, {"format": recovery.FORMAT, "step": step})


@IMPORTS_TORCH
def test_a_save_a_pending_request_refers_to_is_never_pruned(tmp_path: Path) -> None:
    """The validation request format is a contract an external publisher may write too (docs/hygiene.md)."""
    run_dir = tmp_path / "run"
    first = _save(run_dir, 5)
    request = {"checkpoint": "step-00000005", "step": 5, "path": first.relative_to(run_dir).as_posix(),
               "config_digest": "sha256:x", "created": 0.0}
    RunDir(run_dir).request("step-00000005").parent.mkdir(parents=True)
    atomic_write_json(RunDir(run_dir).request("step-00000005"), request)
    for step in (10, 15, 20):
        _save(run_dir, step)
        recovery.prune(run_dir, 0, KEEP)
    assert [s.step for s in recovery.list_saves(run_dir, 0)] == [5, 15, 20]
    # once validated (a receipt), nothing refers to it any more: the next save prunes it
    RunDir(run_dir).receipt("step-00000005").parent.mkdir(parents=True)
    atomic_write_json(RunDir(run_dir).receipt("step-00000005"), {"checkpoint": "step-00000005"})
    _save(run_dir, 25)
    assert [p.name for p in recovery.prune(run_dir, 0, KEEP)] == ["step-00000005.attempt-0.pt",
                                                                   "step-00000015.attempt-0.pt"]
    assert [s.step for s in recovery.list_saves(run_dir, 0)] == [20, 25]


@IMPORTS_TORCH
def test_an_unreadable_newest_save_falls_back_to_the_older_one(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _save(run_dir, 5)
    broken = _save(run_dir, 10)
    broken.write_bytes(b"not a torch file")
    said: list[str] = []
    found = recovery.load_newest(run_dir, 0, warn=said.append)
    assert found is not None and found[0].step == 5
    assert len(said) == 1 and "step-00000010.attempt-0.pt is unreadable" in said[0]


@pytest.mark.slow
def test_resume_with_changed_split_code_is_refused_before_training(runs: dict, tmp_path: Path) -> None:
    work = tmp_path
    shutil.copy(runs["work"] / "traceml.yaml", work / "traceml.yaml")
    shutil.copytree(runs["straight"], work / "logs" / "straight")
    run_dir = work / "logs" / "straight"
    split_before = {p.name: p.read_bytes() for p in (run_dir / "provenance" / "splits").iterdir()}
    done = _launch(work, "straight", "--resume", script_args=("--split", "shifted"))
    assert done.returncode != 0
    refusal = [line for line in done.stderr.splitlines() if "record_split" in line]
    assert len(refusal) == 1 and "split 'train' differs from the run's record provenance/splits/train.json" in refusal[0]
    assert "Traceback" not in done.stderr
    assert {p.name: p.read_bytes() for p in (run_dir / "provenance" / "splits").iterdir()} == split_before
    assert realruns.count_steps(run_dir, 0, attempt=1) == 0  # training did not start
    recorded = json.loads(split_before["train.json"])
    assert recorded["count"] == 128 and len(recorded["members"]) == 128 and recorded["policy"].startswith("fixed")


@IMPORTS_TORCH
def test_an_extra_the_safe_loader_would_refuse_is_refused_at_the_call() -> None:
    import torch

    recovery.check_extras({"gen": torch.Generator().get_state(), "pos": [1, (2, "a")], "x": None})
    with pytest.raises(recovery.RecoveryError) as err:
        recovery.check_extras({"pos": [1, {"gen": torch.Generator()}]})
    assert str(err.value) == ("save_recovery: extras['pos'][1]['gen'] is a Generator; extras hold tensors, numbers, "
                              "strings, lists, tuples and dicts (a generator: pass its get_state())")


@IMPORTS_TORCH
def test_ranks_restore_the_newest_update_every_visible_rank_saved(tmp_path: Path) -> None:
    """Rank 1 was interrupted before its save of update 10: both ranks continue from update 5."""
    run_dir = tmp_path / "run"
    for rank, steps in ((0, (5, 10)), (1, (5,))):
        for step in steps:
            recovery.write_save(run_dir, rank, step, 0, {"format": recovery.FORMAT, "step": step})
    assert recovery.common_steps(run_dir, 0, 2) == {5}
    assert recovery.load_newest(run_dir, 0, steps=recovery.common_steps(run_dir, 0, 2))[0].step == 5
    assert recovery.common_steps(run_dir, 0, 1) is None  # one rank: its own newest save
    assert recovery.load_newest(run_dir, 0, steps=None)[0].step == 10
