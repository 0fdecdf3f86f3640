"""manifest.json's telemetry status (seed 000): what the ranks delivered, beside status and guard.training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from traceml_tui.core import artifacts

from support import realruns

SCRIPT = ("import sys, time\nimport traceml_tui as traceml\n"
          "for _ in range(int(sys.argv[1])):\n    with traceml.trace_step():\n        time.sleep(float(sys.argv[2]))\n"
          "        traceml.log(loss=1.0)\n")


def _guarded(tmp_path: Path, steps: int, sleep: float, retention: int) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "train.py").write_text(SCRIPT)
    config = {"history_retention": retention,
              "guard": {"schema_version": 1, "workload": {"name": "w", "parameters": {"model": "m"}},
                        "measurement": {"start_step": 1, "completed_steps": 4}}}
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "traceml_tui", "run", "train.py", "--run-name", "g", "--args",
                           str(steps), str(sleep)], cwd=tmp_path, env=realruns.subprocess_env(tmp_path / "state"),
                          capture_output=True, text=True, timeout=120)
    return done, json.loads((tmp_path / "logs" / "g" / "manifest.json").read_text())


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("traceml run: warning:")]


@pytest.mark.slow
@pytest.mark.realruns("completed")
def test_every_rank_delivered_its_steps(real_runs) -> None:
    manifest = json.loads((real_runs["completed"].run_dir / "manifest.json").read_text())
    telemetry = manifest["telemetry"]
    assert telemetry["status"] == "complete" and telemetry["reasons"] == []
    assert telemetry["records"] == {"0": 8, "1": 8} and telemetry["ranks_expected"] == 2
    assert manifest["status"] == "completed"  # three separate statuses: run, telemetry, (guard.training)
    decoded = artifacts.decode_manifest(json.dumps(manifest).encode())
    assert decoded is not None and decoded.telemetry.records == {"0": 8, "1": 8}


@pytest.mark.slow
def test_a_guarded_run_that_stops_inside_its_window_is_incomplete(tmp_path: Path) -> None:
    done, manifest = _guarded(tmp_path, steps=2, sleep=0.0, retention=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    telemetry = manifest["telemetry"]
    assert telemetry["status"] == "incomplete" and telemetry["reasons"] == ["measurement_window_incomplete"]
    assert telemetry["window"] == [1, 4] and telemetry["window_incomplete_ranks"] == [0]
    assert manifest["guard"]["training"]["status"] == "completed"  # the launcher's view stays its own
    assert "traceml run: warning: telemetry incomplete: rank(s) 0 did not record every declared step 1-4" in (
        _warnings(done.stderr))


@pytest.mark.slow
def test_a_window_longer_than_history_retention_warns(tmp_path: Path) -> None:
    done, manifest = _guarded(tmp_path, steps=4, sleep=0.6, retention=1)
    assert done.returncode == 0, done.stderr[-2000:]
    telemetry = manifest["telemetry"]
    assert telemetry["status"] == "complete" and telemetry["window_exceeds_retention"] is True
    assert telemetry["window_span_s"] > 1.0
    [warning] = [w for w in _warnings(done.stderr) if "history_retention" in w]
    assert "longer than history_retention (1 s): the summary analyzes only its newest 1 s" in warning
