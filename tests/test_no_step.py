"""A guarded run whose ranks recorded no step says so (docs/run.md, "A run with no step").

Real guarded ``traceml run``s (a ``guard:`` block in traceml.yaml) of
``tests/scripts/untraced_train.py``, a script that trains with no traceml code
at all: 2-rank gloo DDP that exits 0, and one process that exits 3. Each ends with
the one stderr line, the summary says the same, the exit status is the script's,
and ``traceml compare`` of two such runs is indeed INCONCLUSIVE (exit 3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from traceml_tui.core import coverage

from support.cli import run_main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SCRIPT = Path(__file__).parent / "scripts" / "untraced_train.py"
GUARD = {
    "schema_version": 1,
    "workload": {"name": "untraced", "parameters": {"model": "tiny"}},
    "measurement": {"start_step": 1, "completed_steps": 3},
}
LINE = f"traceml run: {coverage.NO_STEP_LINE}"


def _cli(args: list[str], env: dict, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_tui", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def untraced(tmp_path_factory):
    """name -> (run_dir, launcher result): a clean 2-rank run and a one-process run exiting 3."""
    from support.realruns import subprocess_env

    work = tmp_path_factory.mktemp("nostep")
    (work / "traceml.yaml").write_text(yaml.safe_dump({"guard": GUARD}))
    env = subprocess_env(work / "state")
    launches = {name: ["run", str(SCRIPT), "--run-name", name, "--logs-dir", str(work / "logs"), *extra]
                for name, extra in (("ddp", ["--nproc-per-node", "2"]), ("exits3", ["--args", "--exit-code", "3"]))}
    # Both at once: each spends much of its wall time in single-threaded startup (launcher, torchrun, imports).
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = {name: pool.submit(_cli, args, env, work) for name, args in launches.items()}
    return {name: (work / "logs" / name, future.result()) for name, future in done.items()}


@pytest.mark.parametrize("name, code", [("ddp", 0), ("exits3", 3)])
def test_the_launcher_says_no_step_was_traced_and_keeps_the_exit_status(untraced, name, code):
    run_dir, proc = untraced[name]
    assert proc.returncode == code, proc.stderr[-3000:]
    assert proc.stderr.count(LINE) == 1, proc.stderr[-3000:]
    assert proc.stderr.rstrip("\n").endswith(LINE)  # the last word, after the summary card
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["exit_code"] == code and "contract" in manifest["guard"]  # a guarded run


@pytest.mark.parametrize("name", ["ddp", "exits3"])
def test_the_summary_says_the_same(untraced, name):
    run_dir, _proc = untraced[name]
    summary = json.loads((run_dir / "final_summary.json").read_text())
    assert summary["integration"] == {"steps_traced": False, "unmeasured": []}
    diagnosis = summary["step_time"]["diagnosis"]
    sentence = coverage.NO_STEP_LINE[0].upper() + coverage.NO_STEP_LINE[1:] + "."
    assert (diagnosis["status"], diagnosis["summary"]) == ("NO DATA", sentence)
    assert diagnosis["action"] == coverage.NO_STEP_ACTION
    assert summary["primary_diagnosis"]["summary"] == sentence
    text = (run_dir / "final_summary.txt").read_text()
    assert f"Verdict: NO DATA — {sentence}" in text and summary["text"] in text


def test_compare_of_two_such_runs_is_inconclusive(untraced, tmp_path):
    """What the line promises: `traceml compare` with a threshold exits 3 (INCONCLUSIVE)."""
    (ddp, _), (single, _) = untraced["ddp"], untraced["exits3"]
    done = run_main(["compare", str(ddp / "final_summary.json"), str(single / "final_summary.json"),
                     "--max-step-time-regression-pct", "5", "--output", str(tmp_path / "cmp")], env=dict(os.environ),
                    cwd=tmp_path)  # in this process (support/cli.py; README "test lanes")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "INCONCLUSIVE" in done.stdout


@pytest.mark.realruns("completed")
def test_a_run_with_steps_does_not_say_it(real_runs):
    """The completed fixture (2-rank DDP, 8 traced steps): no such line, steps_traced true."""
    run = real_runs["completed"]
    summary = json.loads((run.run_dir / "final_summary.json").read_text())
    assert summary["integration"]["steps_traced"] is True
    assert coverage.NO_STEP_LINE not in (run.run_dir / "final_summary.txt").read_text()
    launcher_err = (run.work_dir / f"{run.case}.launcher.err").read_text()
    assert coverage.NO_STEP_LINE not in launcher_err
