"""`traceml run` drains the declared validation backlog itself (seed 004: validation is mandatory).

Real launches of tests/scripts/hygiene_train.py, a script with no dispatcher
code: it only publishes checkpoints. The declared worker is
tests/scripts/validator.py (fast, no torch).
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import realruns
import yaml


def _launch(tmp_path: Path, *script_args: str, dispatcher: str | None = None,
            early_stopping: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(realruns.VALIDATOR_SCRIPT, work / "validator.py")
    config = copy.deepcopy(realruns.hygiene_config())
    config["hygiene"]["validation"].pop("dispatcher", None)  # the default: the launcher drains
    if dispatcher is not None:
        config["hygiene"]["validation"]["dispatcher"] = dispatcher
    if early_stopping is not None:
        config["hygiene"]["early_stopping"] = early_stopping
    (work / "traceml.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    args = [sys.executable, "-m", "traceml_tui", "run", str(realruns.HYGIENE_SCRIPT), "--run-name", "drained",
            "--args", *script_args]
    done = subprocess.run(args, cwd=work, env=realruns.subprocess_env(work / "state"), capture_output=True,
                          text=True, timeout=180)
    return done, work / "logs" / "drained"


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("traceml run: warning: validation")]


@pytest.mark.slow
def test_the_launcher_drains_every_request_of_a_script_without_a_dispatcher(tmp_path: Path) -> None:
    done, run_dir = _launch(tmp_path, "--steps", "6")
    assert done.returncode == 0, done.stderr[-3000:]
    requests = sorted(p.stem for p in (run_dir / "validation" / "requests").glob("*.json"))
    receipts = sorted(p.stem for p in (run_dir / "validation" / "receipts").glob("*.json"))
    assert requests == ["step-00000000", "step-00000002", "step-00000004", "step-00000006"]
    assert receipts == requests  # every request completed, the last ones by the drain after training
    section = json.loads((run_dir / "final_summary.json").read_text())["validation"]
    assert section["status"] == "complete" and section["completed"] == 4 and section["missing"] is None
    assert section["newest_completed"]["checkpoint"] == "step-00000006"
    assert section["curve"] == "learning_curve.png" and (run_dir / "learning_curve.png").is_file()
    assert _warnings(done.stderr) == []
    # the worker ran as a drainer from the launcher: its log is in the run directory
    assert "drained:" in (run_dir / "validation" / "drainer.log").read_text()


@pytest.mark.slow
def test_a_hygiene_run_that_publishes_nothing_ends_with_validation_missing(tmp_path: Path) -> None:
    done, run_dir = _launch(tmp_path, "--steps", "3", "--no-publish")
    assert done.returncode == 0, done.stderr[-3000:]  # training succeeded: the exit code stays its own
    assert _warnings(done.stderr) == [
        "traceml run: warning: validation missing: no checkpoint was published for validation"]
    summary = json.loads((run_dir / "final_summary.json").read_text())
    assert summary["validation"]["status"] == "missing" and summary["validation"]["requested"] == 0
    assert "Validation: MISSING — no checkpoint was published for validation" in (
        run_dir / "final_summary.txt").read_text()


@pytest.mark.slow
def test_early_stopping_consumes_the_receipts_of_the_final_drain(tmp_path: Path) -> None:
    """The script's stopper never waits for validation; the launcher lets it consume what the final drain completed."""
    policy = {"metric": "r2", "direction": "max", "min_delta": 0.0, "patience": 10, "warmup": 0, "max_budget": 100}
    done, run_dir = _launch(tmp_path, "--steps", "6", "--early-stopping", early_stopping=policy)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((run_dir / "early_stopping.json").read_text())
    receipts = sorted(p.stem for p in (run_dir / "validation" / "receipts").glob("*.json"))
    assert len(receipts) == 4 and state["consumed"] == receipts  # every receipt, in checkpoint order
    # the validator's r2 grows with the step: the newest checkpoint is the selected best
    assert state["best_checkpoint"] == "step-00000006" and not state["stopped"]
    section = json.loads((run_dir / "final_summary.json").read_text())["validation"]
    assert section["best"]["checkpoint"] == "step-00000006" and section["best"]["selected_on"] == "eval"
    assert section["early_stopping"]["state"] == "not-stopped" and section["status"] == "complete"


@pytest.mark.slow
def test_an_external_drainer_after_the_run_brings_its_record_up_to_date(tmp_path: Path) -> None:
    """dispatcher: external — receipts drained after `traceml run` ended reach early stopping and the summary.

    docs/hygiene.md: a drainer finishing on an ended run lets early stopping consume what it completed and
    rebuilds the summary's validation section, so status, summary, early_stopping.json (and watch, which
    shows the summary) agree.
    """
    policy = {"metric": "r2", "direction": "max", "min_delta": 0.0, "patience": 10, "warmup": 0, "max_budget": 100}
    done, run_dir = _launch(tmp_path, "--steps", "6", "--early-stopping", dispatcher="external", early_stopping=policy)
    assert done.returncode == 0, done.stderr[-3000:]
    launchers = json.loads((run_dir / "final_summary.json").read_text())
    before = launchers["validation"]
    assert before["pending"] == 4 and before["status"] == "missing"  # nothing drained while it ran
    worker = json.loads((run_dir / "manifest.json").read_text())["hygiene"]["validation"]["worker"]
    env = realruns.subprocess_env(tmp_path / "state")
    drain = subprocess.run([sys.executable, "-m", "traceml_tui", "validate", "drain", str(run_dir), "--", *worker],
                           cwd=run_dir.parents[1], env=env, capture_output=True, text=True, timeout=180)
    assert drain.returncode == 0 and "4 completed" in drain.stdout, drain.stderr[-3000:]
    status = json.loads(subprocess.run(
        [sys.executable, "-m", "traceml_tui", "validate", "status", str(run_dir), "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=True).stdout)
    receipts = sorted(p.stem for p in (run_dir / "validation" / "receipts").glob("*.json"))
    assert status["counts"]["completed"] == len(receipts) == 4
    state = json.loads((run_dir / "early_stopping.json").read_text())
    assert state["consumed"] == receipts and state["best_checkpoint"] == "step-00000006"  # r2 grows with the step
    summary = json.loads((run_dir / "final_summary.json").read_text())
    section = summary["validation"]
    assert section["status"] == "complete" and section["completed"] == 4 and section["pending"] == 0
    assert section["newest_completed"] == status["newest_completed"]
    assert section["best"]["checkpoint"] == state["best_checkpoint"]
    assert section["early_stopping"]["evaluations"] == state["evaluations"] == 4
    text = (run_dir / "final_summary.txt").read_text()
    assert text == summary["text"] + "\n" and "MISSING" not in text
    assert "selected best: step-00000006 (update 6)" in text
    # every other section is the launcher's, untouched
    others = [k for k in launchers if k not in ("validation", "text")]
    assert {k: summary[k] for k in others} == {k: launchers[k] for k in others} and set(summary) == set(launchers)
    # a drainer with nothing left to do rewrites nothing
    mtime = (run_dir / "final_summary.json").stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-m", "traceml_tui", "validate", "drain", str(run_dir), "--", *worker],
                           cwd=run_dir.parents[1], env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0 and (run_dir / "final_summary.json").stat().st_mtime_ns == mtime
