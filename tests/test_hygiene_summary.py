"""The summary carries validation (seed 004): counts, newest completed, selected best, stop, curve.

Every figure is checked against the files the real hygiene run left under
``validation/`` (tests/support/realruns.py ``hygiene``: a backlog in every state), read
directly from the documented layout, not through the backlog library.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from traceml_tui.core import artifacts
from traceml_tui.hygiene import EarlyStopping
from traceml_tui.hygiene.report import SELECTION_NOTE
from traceml_tui.summary.build import build_summary
from traceml_tui.summary.text import render_text

from support import realruns


def _states_from_files(run_dir: Path) -> dict[str, str]:
    """Each checkpoint's state from its raw files (the claim owners are gone: realruns checks it)."""
    states = {}
    for ckpt, kinds in realruns.backlog_files(run_dir).items():
        if kinds["receipts"]:
            states[ckpt] = "completed"
        elif kinds["claims"]:
            states[ckpt] = "stale-claim"
        elif len(kinds["failures"]) >= 3:  # the default max_attempts: the case declares none
            states[ckpt] = "blocked"
        elif kinds["failures"]:
            states[ckpt] = "failed"
        else:
            states[ckpt] = "pending"
    return states


def _summary(run_dir: Path) -> dict:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    summary = build_summary(run_dir, manifest)
    summary["text"] = render_text(summary)
    artifacts.check_summary(summary)
    return summary


@pytest.mark.slow
@pytest.mark.realruns("hygiene")
def test_summary_validation_counts_equal_the_backlog_files(real_runs) -> None:
    run = real_runs["hygiene"]
    states = _states_from_files(run.run_dir)
    assert states == dict(run.expected_backlog)  # every state is present
    summary = _summary(run.run_dir)
    section = summary["validation"]
    for word in ("completed", "pending", "claimed", "stale-claim", "failed", "blocked"):
        assert section[word.replace("-", "_")] == sum(1 for s in states.values() if s == word), word
    assert section["requested"] == len(list((run.run_dir / "validation" / "requests").glob("*.json")))
    # the newest completed checkpoint and its metrics are its receipt's
    receipts = sorted((run.run_dir / "validation" / "receipts").glob("*.json"))
    newest = json.loads(receipts[-1].read_text())
    assert section["newest_completed"] == {"checkpoint": newest["checkpoint"], "step": newest["step"],
                                           "metrics": newest["metrics"]}
    # requests without a receipt at the end: validation is missing, and says why
    assert section["status"] == "missing"
    assert section["missing"].startswith("4 of 6 validation requests have no receipt")
    # early stopping was declared off (with its reason); nothing was selected
    declared = json.loads((run.run_dir / "manifest.json").read_text())["hygiene"]["early_stopping"]
    assert section["early_stopping"]["enabled"] is False
    assert section["early_stopping"]["disabled_reason"] == declared["reason"]
    assert section["best"] is None
    assert section["curve"] == ("learning_curve.png" if (run.run_dir / "learning_curve.png").is_file() else None)
    text = summary["text"].splitlines()
    at = text.index(next(line for line in text if line.startswith("Validation: MISSING")))
    assert text[at + 1].strip() == ("Validation: 6 requested · 1 stale-claim, 1 blocked, 1 failed, 1 pending, "
                                    "2 completed")
    assert f"newest completed: {newest['checkpoint']}" in text[at + 2]
    assert "early stopping: disabled (fixture run: a fixed 10 updates)" in summary["text"]
    # the typed view readers use decodes the same numbers
    decoded = artifacts.decode_summary(json.dumps(summary).encode())
    assert decoded is not None and decoded.validation.stale_claim == 1 and decoded.validation.requested == 6


@pytest.mark.slow
@pytest.mark.realruns("hygiene")
def test_drainers_that_finish_after_the_run_refresh_its_summary(real_runs) -> None:
    """dispatcher: external — the case's drainers ran after `traceml run` ended (docs/hygiene.md).

    The launcher's summary saw six pending requests; each drainer that finished rebuilt the validation
    section. The last to finish did so while the harness held claims on three checkpoints (then one
    drainer was SIGKILLed: nothing of its own is finished, so it refreshed nothing).
    """
    run = real_runs["hygiene"]
    summary = json.loads((run.run_dir / "final_summary.json").read_text())
    section = summary["validation"]
    receipts = len(list((run.run_dir / "validation" / "receipts").glob("*.json")))
    counts = {k: section[k] for k in ("requested", "completed", "pending", "claimed", "stale_claim", "failed", "blocked")}
    assert counts == {"requested": 6, "completed": receipts, "pending": 0, "claimed": 3, "stale_claim": 0,
                      "failed": 0, "blocked": 1}
    assert receipts == 2 and section["status"] == "missing"
    assert "Validation: MISSING — 4 of 6 validation requests have no receipt" in summary["text"]
    assert (run.run_dir / "final_summary.txt").read_text() == summary["text"] + "\n"


@pytest.mark.slow
@pytest.mark.realruns("hygiene")
def test_summary_shows_the_selected_best_and_the_stop(real_runs, tmp_path: Path) -> None:
    """Early stopping over the real receipts selects a checkpoint and stops; the summary says so (eval selected it)."""
    run_dir = tmp_path / "copy"
    shutil.copytree(real_runs["hygiene"].run_dir, run_dir)
    # The validator reports mse = 1/(2+step): falling. Monitoring it as "max" makes the second evaluation a
    # non-improvement, so patience 1 stops there and the initialization stays the best.
    stopper = EarlyStopping(run_dir, metric="mse", direction="max", min_delta=0.0, patience=1)
    assert stopper.update(2)
    section = _summary(run_dir)["validation"]
    first = json.loads((run_dir / "validation" / "receipts" / "step-00000000.json").read_text())
    assert section["best"]["checkpoint"] == "step-00000000" and section["best"]["step"] == 0
    assert section["best"]["value"] == first["metrics"]["mse"] and section["best"]["metrics"] == first["metrics"]
    assert section["best"]["selected_on"] == "eval" and section["best"]["note"] == SELECTION_NOTE
    early = section["early_stopping"]
    assert early["state"] == "stopped" and early["reason"] == "patience_exhausted"
    assert early["trigger_checkpoint"] == "step-00000002" and early["trigger_step"] == 2
    text = render_text(_summary(run_dir))
    assert f"selected best: step-00000000 (update 0) mse={first['metrics']['mse']:.6g} — {SELECTION_NOTE}" in text
    assert "early stopping: stopped, patience_exhausted at step-00000002 (update 2)" in text


def test_a_run_without_validation_has_no_section(tmp_path: Path) -> None:
    (tmp_path / "ranks").mkdir()
    assert build_summary(tmp_path, {"run_name": "plain"})["validation"] is None
