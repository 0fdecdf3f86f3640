"""The config binding is real: a drainer refuses a request bound to another recipe/command (seed 004).

On copies of the real hygiene run (tests/support/realruns.py ``hygiene``): its requests
carry the digest of the declared recipe and worker command.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.hygiene.config import validation_config_digest

from support import realruns


def _copy(real_runs, tmp_path: Path) -> tuple[Path, Path, dict]:
    run = real_runs["hygiene"]
    run_dir = tmp_path / "run"
    shutil.copytree(run.run_dir, run_dir)
    declared = json.loads((run_dir / "manifest.json").read_text())["hygiene"]["validation"]
    return run_dir, run.work_dir, declared


def _drain(run_dir: Path, cwd: Path, command: list[str], *options: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "traceml_tui", "validate", "drain", str(run_dir), "--no-curve", *options,
            "--", *command]
    return subprocess.run(args, cwd=cwd, env=realruns.subprocess_env(cwd / "state"), capture_output=True, text=True,
                          timeout=120)


def _files(run_dir: Path, kind: str) -> list[str]:
    return sorted(p.name for p in (run_dir / "validation" / kind).iterdir())


@pytest.mark.slow
@pytest.mark.realruns("hygiene")
def test_a_drain_with_another_command_is_refused_and_leaves_no_receipt(real_runs, tmp_path: Path) -> None:
    run_dir, cwd, declared = _copy(real_runs, tmp_path)
    other = [arg for arg in declared["worker"] if arg not in ("--step", "{step}")]  # same script, another command
    before = {kind: _files(run_dir, kind) for kind in ("receipts", "claims", "failures")}
    done = _drain(run_dir, cwd, other)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    requested = json.loads((run_dir / "validation/requests/step-00000004.json").read_text())["config_digest"]
    actual = validation_config_digest({"recipe": declared["recipe"], "worker": other})
    assert requested == validation_config_digest(declared) != actual
    assert lines[0].startswith("traceml validate: step-00000004 was requested for validation config ")
    assert requested in lines[0] and actual in lines[0]
    assert {kind: _files(run_dir, kind) for kind in ("receipts", "claims", "failures")} == before


@pytest.mark.slow
@pytest.mark.realruns("hygiene")
def test_recipe_override_runs_and_records_the_override(real_runs, tmp_path: Path) -> None:
    run_dir, cwd, declared = _copy(real_runs, tmp_path)
    other = [arg for arg in declared["worker"] if arg not in ("--step", "{step}")]
    done = _drain(run_dir, cwd, other, "--recipe-override")
    assert done.returncode == 0, done.stderr
    actual = validation_config_digest({"recipe": declared["recipe"], "worker": other})
    for ckpt in ("step-00000004", "step-00000008", "step-00000010"):  # failed, stale claim, pending; blocked stays
        receipt = json.loads((run_dir / "validation/receipts" / f"{ckpt}.json").read_text())
        assert receipt["override"] == {"config_digest": actual}
        assert receipt["config_digest"] == validation_config_digest(declared)
    assert not (run_dir / "validation/receipts/step-00000006.json").exists()
    # receipts written under the declared command carry no override
    assert "override" not in json.loads((run_dir / "validation/receipts/step-00000000.json").read_text())


@pytest.mark.slow
@pytest.mark.realruns("hygiene")
def test_the_declared_command_drains_without_override(real_runs, tmp_path: Path) -> None:
    run_dir, cwd, declared = _copy(real_runs, tmp_path)
    done = _drain(run_dir, cwd, declared["worker"])
    assert done.returncode == 0, done.stderr
    receipt = json.loads((run_dir / "validation/receipts/step-00000010.json").read_text())
    assert "override" not in receipt and receipt["config_digest"] == validation_config_digest(declared)
