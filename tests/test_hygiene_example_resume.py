"""The hygiene example interrupted with SIGINT and resumed with `traceml run --resume` (real training, drainers).

Seed 004: the resumed attempt continues from the newest recovery save (no jump of
the loss ratio back to its initial value), checkpoints carry their true update,
early stopping keeps its patience and best, and the summary says so.
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
from traceml_tui.core.rundir import RunDir
from traceml_tui.hygiene import backlog
from traceml_tui.hygiene.curve import load_curve_data

from support import realruns

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hygiene"
CADENCE, BUDGET, INTERRUPT_AT = 100, 500, 250


def _steps(run_dir: Path, attempt: int) -> list[records.Step]:
    lines = (RunDir(run_dir).steps_file(0, attempt)).read_bytes().splitlines()
    return [r for r in map(records.decode, lines) if isinstance(r, records.Step)]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("example-resume")
    for name in ("train_regression.py", "validate.py", "data.py"):
        shutil.copy(EXAMPLE / name, work / name)
    config = yaml.safe_load((EXAMPLE / "traceml.yaml").read_text())
    config["hygiene"]["validation"]["cadence"] = CADENCE
    config["hygiene"]["curve"]["cadence"] = 50
    # patience longer than the run: the budget ends it, and every eligible evaluation must be counted once
    config["hygiene"]["early_stopping"].update(patience=5, warmup=100, max_budget=BUDGET)
    (work / "traceml.yaml").write_text(yaml.safe_dump(config))
    run_dir = work / "logs" / "demo"
    env = realruns.subprocess_env(work / "state")
    args = ["train_regression.py", "--run-name", "demo"]
    with realruns._Launch(args, work, env, work / "first") as launch:
        realruns._wait_for(lambda: realruns.count_steps(run_dir, 0) >= INTERRUPT_AT, 240, f"{INTERRUPT_AT} updates",
                           launch)
        launch.proc.send_signal(signal.SIGINT)
        first_rc = launch.wait(timeout=120)
    done = subprocess.run([*realruns.TRACEML, "run", *args, "--resume"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"run_dir": run_dir, "first_rc": first_rc, "stderr": done.stderr}


@pytest.mark.slow
def test_training_continues_from_the_recovery_save(resumed: dict) -> None:
    run_dir = resumed["run_dir"]
    assert resumed["first_rc"] != 0
    before, after = _steps(run_dir, 0), _steps(run_dir, 1)
    restored = json.loads((run_dir / "recovery" / "resumes.jsonl").read_text().splitlines()[-1])["step"]
    assert restored % 50 == 0 and restored >= INTERRUPT_AT - 50
    assert after[0].step == restored + 1 and after[-1].step == BUDGET
    assert f"resumed at update {restored}" in resumed["stderr"]
    # no jump back: the updates both attempts ran have the very same loss (restored state and RNG)
    overlap = {r.step: r for r in before if r.step > restored}
    for record in after[: len(overlap)]:
        assert record.loss == overlap[record.step].loss, record.step
    ratio = [r.components["mse"].ratio for r in before]
    first_after = after[0].components["mse"].ratio
    assert first_after < 0.5 * ratio[0]  # not the initialization's ratio (~1.2)
    assert first_after < 2.0 * max(ratio[restored - 10:restored])
    # the curve draws the resumed attempt as its own line from its true update, marked as a resume
    attempts = load_curve_data(run_dir).attempts
    assert [(a.attempt, a.steps[0], a.steps[-1]) for a in attempts] == [(0, 1, before[-1].step), (1, restored + 1, BUDGET)]
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_checkpoints_are_labelled_by_their_true_update(resumed: dict) -> None:
    run_dir = resumed["run_dir"]
    requests = backlog.list_requests(run_dir)
    assert [r["step"] for r in requests] == list(range(0, BUDGET + 1, CADENCE))
    assert [r["checkpoint"] for r in requests] == [f"step-{r['step']:08d}" for r in requests]  # no re-published id
    recorded = {}
    for attempt in (0, 1):
        lines = RunDir(run_dir).steps_file(0, attempt).read_bytes().splitlines()
        recorded.update({r.id: r.step for r in map(records.decode, lines) if isinstance(r, records.Checkpoint)})
    assert recorded == {r["checkpoint"]: r["step"] for r in requests}


@pytest.mark.slow
def test_summary_newest_checkpoint_and_early_stopping_state(resumed: dict) -> None:
    run_dir = resumed["run_dir"]
    validation = json.loads((run_dir / "final_summary.json").read_text())["validation"]
    assert validation["completed"] == validation["requested"] == BUDGET // CADENCE + 1
    assert validation["newest_completed"]["checkpoint"] == f"step-{BUDGET:08d}"
    assert validation["newest_completed"]["step"] == BUDGET
    receipts = {r["checkpoint"]: r for r in (backlog.read_receipt(run_dir, f"step-{s:08d}")
                                             for s in range(0, BUDGET + 1, CADENCE))}
    eligible = [c for c, r in receipts.items() if r["step"] >= 100]
    policy = json.loads((run_dir / "manifest.json").read_text())["hygiene"]["early_stopping"]
    best, stale = None, 0  # the declared rule applied in checkpoint order (docs/hygiene.md, "Early stopping")
    for ckpt in eligible:
        value = receipts[ckpt]["metrics"]["r2"]
        if best is None or value > receipts[best]["metrics"]["r2"] + policy["min_delta"]:
            best, stale = ckpt, 0
        else:
            stale += 1
    stopping = validation["early_stopping"]
    assert stopping["state"] == "stopped" and stopping["reason"] == "max_budget" and stopping["trigger_step"] == BUDGET
    assert stopping["evaluations"] == len(eligible)  # none counted twice, none lost across the resume
    assert validation["best"]["checkpoint"] == best
    assert stopping["patience_counter"] == stale
    text = (run_dir / "final_summary.txt").read_text()
    assert f"newest completed: step-{BUDGET:08d} (update {BUDGET})" in text
    assert f"early stopping: stopped, max_budget at update {BUDGET}" in text
