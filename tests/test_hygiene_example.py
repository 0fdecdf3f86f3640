"""End to end: the hygiene example under `traceml run` (real training, real drainers)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from traceml_tui.hygiene import backlog

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hygiene"


@pytest.mark.slow
def test_example_trains_validates_stops_and_renders(tmp_path, traceml_cmd, cli_env):
    work = tmp_path / "example"
    work.mkdir()
    for name in ("train_regression.py", "validate.py", "data.py"):
        shutil.copy(EXAMPLE / name, work / name)
    config = yaml.safe_load((EXAMPLE / "traceml.yaml").read_text())
    # Same pipeline, smaller budget: fewer checkpoints keep the test short.
    config["hygiene"]["validation"]["cadence"] = 100
    config["hygiene"]["curve"]["cadence"] = 50
    config["hygiene"]["early_stopping"].update(patience=2, warmup=100, max_budget=300)
    (work / "traceml.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run([*traceml_cmd, "run", "train_regression.py", "--run-name", "demo"], cwd=work, env=cli_env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = work / "logs" / "demo"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["hygiene"]["early_stopping"]["patience"] == 2
    status = backlog.backlog_status(run_dir)
    assert status["outstanding"] == []  # the final backlog was drained after training stopped
    rows = status["requests"]
    assert rows[0]["checkpoint"] == "step-00000000" and len(rows) >= 3
    assert all(set(row["metrics"]) == {"r2", "mse", "mse_ratio"} for row in rows)
    state = json.loads((run_dir / "early_stopping.json").read_text())
    assert state["stopped"] and state["reason"] in ("patience_exhausted", "max_budget")
    assert state["best_checkpoint"] in {row["checkpoint"] for row in rows}
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    steps = (run_dir / "ranks" / "rank_0" / "steps-0.jsonl").read_text().splitlines()
    last_step = [line for line in steps if '"kind":"step"' in line][-1]
    assert '"ratio"' in last_step and '"r2"' in last_step

    # The index shows the policy's own state (issue 25): the real daemon ingests the run, the reader returns
    # what early_stopping.json says — the policy's best (min_delta and warm-up weighed), patience, the stop.
    from daemon.reader import Reader
    from traceml_tui.core import hygiene_files, stopping

    index = tmp_path / "index.sqlite"
    daemon = subprocess.run([*traceml_cmd, "daemon", str(run_dir.parent), "--once", "--no-inotify", "--index",
                             str(index)], env=cli_env, capture_output=True, text=True, timeout=240)
    assert daemon.returncode == 0, daemon.stderr[-3000:]
    with Reader(index) as reader:
        (run,) = reader.list_runs()
        view = reader.backlog.early_stopping(run.run_id)
    assert view == stopping.stopping_view(hygiene_files.decode_early_stopping((run_dir / "early_stopping.json")
                                                                              .read_bytes()))
    assert (view.metric, view.direction, view.min_delta, view.warmup, view.patience) == ("r2", "max", 0.002, 100, 2)
    assert view.stopped and view.reason == state["reason"] and view.best_checkpoint == state["best_checkpoint"]
    assert view.best_value == state["best_metric"] and view.patience_used == state["patience_counter"]
