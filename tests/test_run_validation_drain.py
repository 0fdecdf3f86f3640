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
import yaml

from support import realruns


def _launch(tmp_path: Path, *script_args: str, dispatcher: str | None = None,
            early_stopping: dict | None = None, validation: dict | None = None,
            plan: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(realruns.VALIDATOR_SCRIPT, work / "validator.py")
    config = copy.deepcopy(realruns.hygiene_config())
    config["hygiene"]["validation"].pop("dispatcher", None)  # the default: the launcher drains
    if dispatcher is not None:
        config["hygiene"]["validation"]["dispatcher"] = dispatcher
    if early_stopping is not None:
        config["hygiene"]["early_stopping"] = early_stopping
    config["hygiene"]["validation"].update(validation or {})
    (work / "traceml.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = realruns.subprocess_env(work / "state")
    if plan is not None:  # what tests/scripts/validator.py does per checkpoint
        (work / "plan.json").write_text(json.dumps(plan))
        env["REALRUNS_VALIDATION_PLAN"] = str(work / "plan.json")
    args = [sys.executable, "-m", "traceml_tui", "run", str(realruns.HYGIENE_SCRIPT), "--run-name", "drained",
            "--args", *script_args]
    done = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=180)
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


@pytest.mark.slow
def test_a_worker_that_never_returns_is_timed_out_blocked_and_skipped_and_said_so(tmp_path: Path) -> None:
    """QA #2, #1, #9, #11: a hung worker is killed after hygiene.validation.timeout_s and counts as a failed
    attempt, so the run ends (a bounded final drain) and later checkpoints are validated; the blocked one is
    skipped by early stopping instead of freezing it; a monitored metric no receipt reports is flagged; and a
    manual drainer afterwards respects the run's declared max_attempts."""
    policy = {"metric": "R2", "direction": "max", "min_delta": 0.0, "patience": 10, "warmup": 0, "max_budget": 100}
    done, run_dir = _launch(tmp_path, "--steps", "6", "--early-stopping", early_stopping=policy,
                            validation={"timeout_s": 2, "max_attempts": 1, "retry_backoff_s": 0},
                            plan={"step-00000002": "hang"})
    assert done.returncode == 0, done.stderr[-3000:]
    failures = sorted((run_dir / "validation" / "failures").glob("*.json"))
    assert [p.name for p in failures] == ["step-00000002-1.json"]
    assert json.loads(failures[0].read_text())["error"].startswith("timed out after 2 s")
    receipts = sorted(p.stem for p in (run_dir / "validation" / "receipts").glob("*.json"))
    assert receipts == ["step-00000000", "step-00000004", "step-00000006"]  # later work was not held up

    state = json.loads((run_dir / "early_stopping.json").read_text())
    assert state["consumed"] == ["step-00000000", "step-00000002", "step-00000004", "step-00000006"]
    assert [(e["checkpoint"], e["reason"].split(" (")[0]) for e in state["skipped"]] == [
        ("step-00000002", "blocked after 1 failed attempts")]
    assert [e["checkpoint"] for e in state["missing_metric"]] == receipts
    assert state["missing_metric"][0]["metrics"] == ["mse", "r2"]

    warnings = [line for line in done.stderr.splitlines() if line.startswith("traceml run: warning:")]
    assert any(w.startswith("traceml run: warning: validation blocked: step-00000002 (update 2) failed 1 attempts "
                            "(last: timed out after 2 s") for w in warnings), warnings
    assert "traceml run: warning: early stopping: skipped blocked step-00000002 (update 2): blocked after 1 " \
        "failed attempts (last: timed out after 2 s (hygiene.validation.timeout_s))" in warnings
    note = "3 completed evaluations without the monitored metric R2 (not counted; they report mse, r2)"
    assert f"traceml run: warning: early stopping: {note}" in warnings
    text = (run_dir / "final_summary.txt").read_text()
    assert f"  early stopping: {note}" in text and "  early stopping: skipped blocked step-00000002" in text

    # A manual drainer reads the run's declared max_attempts (1): the blocked request is not retried.
    worker = json.loads((run_dir / "manifest.json").read_text())["hygiene"]["validation"]["worker"]
    again = subprocess.run([sys.executable, "-m", "traceml_tui", "validate", "drain", str(run_dir), "--no-curve",
                            "--", *worker], cwd=tmp_path / "work", env=realruns.subprocess_env(tmp_path / "state"),
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "drained: 0 completed, 0 failed" in again.stdout, again.stderr
