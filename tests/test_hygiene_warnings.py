"""The end-of-run warnings of seed 004's rules (hygiene/warnings.py): launcher stderr and summary say the same.

Real launches: tests/scripts/hygiene_train.py declares early stopping but never applies it, trains
past max_budget and logs lr but no grad_norm; the session's `completed` real run logs a loss with
no validation declared. `require_validation: true` refuses a launch without a hygiene block.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from traceml_tui.hygiene.warnings import hygiene_warnings, step_facts
from traceml_tui.run import cli as run_cli

from support import realruns

NEVER_APPLIED = ("early stopping never applied: hygiene.early_stopping is declared but the script never consulted "
                 "it (no early_stopping.json; call EarlyStopping.should_stop after each update)")
NO_GRAD_NORM = ("grad_norm never logged: no step record carries grad_norm (traceml.log(grad_norm=...); a Lightning "
                "fit computes none: call it in the LightningModule's on_before_optimizer_step)")
NO_VALIDATION = ("loss logged without validation: this run trains but declares no hygiene.validation (seed 004: "
                 "validation is mandatory for learning experiments; docs/hygiene.md)")


def _config(early_stopping: dict) -> dict:
    config = realruns.hygiene_config()
    config["hygiene"]["early_stopping"] = early_stopping
    return config


def _said(run_dir: Path, stderr: str) -> tuple[list[str], list[str], list[str]]:
    summary = json.loads((run_dir / "final_summary.json").read_text())
    launcher = [line.removeprefix("traceml run: warning: ") for line in stderr.splitlines()
                if line.startswith("traceml run: warning: ")]
    text = [line.removeprefix("Warning: ") for line in (run_dir / "final_summary.txt").read_text().splitlines()
            if line.startswith("Warning: ")]
    return summary["hygiene_warnings"], launcher, text


@pytest.mark.slow
def test_unapplied_early_stopping_exceeded_budget_and_missing_grad_norm_are_said(tmp_path: Path) -> None:
    policy = {"metric": "r2", "direction": "max", "min_delta": 0.001, "patience": 2, "warmup": 0, "max_budget": 10}
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump(_config(policy)))
    done = subprocess.run([*realruns.TRACEML, "run", str(realruns.HYGIENE_SCRIPT), "--run-name", "w",
                           "--args", "--steps", "12", "--no-publish"], cwd=tmp_path,
                          env=realruns.subprocess_env(tmp_path / "state"), capture_output=True, text=True,
                          timeout=realruns.LAUNCH_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    summary, launcher, text = _said(tmp_path / "logs" / "w", done.stderr)
    expected = [NEVER_APPLIED, "max_budget exceeded: training reached update 12, hygiene.early_stopping.max_budget is 10",
                NO_GRAD_NORM]
    assert summary == text == expected
    assert [line for line in launcher if line in expected] == expected  # each once, in the summary's order


@pytest.mark.slow  # reads a real 2-rank run (the fast lane keeps the rule's own test below)
@pytest.mark.realruns("completed")
def test_a_loss_without_declared_validation_is_said(real_runs) -> None:
    run = real_runs["completed"]
    summary, _, text = _said(run.run_dir, "")
    assert summary == text == [NO_VALIDATION]


def test_the_rules_stay_quiet_for_a_run_that_follows_them() -> None:
    class Step:
        def __init__(self, step: int) -> None:
            self.step, self.loss, self.lr, self.grad_norm = step, 1.0, 0.1, 2.0

    facts = step_facts([Step(1), Step(5)])
    assert facts == {"last_step": 5, "loss": True, "lr": True, "grad_norm": True}
    hygiene = {"early_stopping": {"enabled": True, "max_budget": 5}}
    assert hygiene_warnings(hygiene, {"early_stopping": {"state": "not-stopped"}}, facts) == []
    disabled = {"early_stopping": {"enabled": False, "reason": "fixed", "max_budget": 4}}
    assert hygiene_warnings(disabled, {"early_stopping": {"state": "disabled"}}, facts) == [
        "max_budget exceeded: training reached update 5, hygiene.early_stopping.max_budget is 4"]
    assert hygiene_warnings(None, None, step_facts([])) == []  # nothing trained: nothing to say
    assert hygiene_warnings(None, None, facts) == [NO_VALIDATION]  # it trains and declares no validation


def test_require_validation_refuses_a_launch_without_a_hygiene_block(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "traceml.yaml").write_text("require_validation: true\n")
    (tmp_path / "train.py").write_text("open('SCRIPT_RAN', 'w').write('yes')\n")
    monkeypatch.chdir(tmp_path)
    rc = run_cli.main(["train.py", "--run-name", "r"])
    assert rc == run_cli.EXIT_REFUSED
    assert capsys.readouterr().err == (f"traceml run: {(tmp_path / 'traceml.yaml').resolve()}: require_validation: "
                                       "is true but no hygiene: block declares validation (docs/hygiene.md)\n")
    assert not (tmp_path / "SCRIPT_RAN").exists() and not (tmp_path / "logs").exists()
    (tmp_path / "traceml.yaml").write_text("require_validation: false\n")
    assert run_cli.main(["train.py", "--run-name", "r"]) == 0 and (tmp_path / "SCRIPT_RAN").exists()
