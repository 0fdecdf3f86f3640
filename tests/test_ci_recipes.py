"""The CI recipes in examples/ci/: both parse, and the GitHub recipe's own shell lines, run here on real
runs, give the job result each exit code of `traceml compare` calls for (0 green; 3 and 4 red, as seed 000's
comparison step fails for inconclusive evidence; 3 green with a warning only in the commented variant) with the
Markdown verdict in the step summary and a JUnit file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
GITHUB = REPO / "examples" / "ci" / "github-actions.yml"
GITLAB = REPO / "examples" / "ci" / "gitlab-ci.yml"


def _github() -> dict:
    return yaml.safe_load(GITHUB.read_text())


def _step(name: str) -> dict:
    (step,) = [s for s in _github()["jobs"]["guard"]["steps"] if s.get("name") == name]
    return step


def test_both_recipes_parse_and_wire_the_exit_codes():
    gh = _github()
    assert gh["env"]["TRAIN"] and "pull_request" in gh[True if True in gh else "on"]  # YAML 1.1 reads "on" as True
    compare = _step("Compare step time")["run"]
    assert "--format markdown" in compare and '>> "$GITHUB_STEP_SUMMARY"' in compare and "--junit" in compare
    lab = yaml.safe_load(GITLAB.read_text())
    guard = lab["traceml-guard"]
    assert "allow_failure" not in guard  # exit 3 fails the job by default
    assert "# allow_failure:" in GITLAB.read_text() and "#   exit_codes: [3]" in GITLAB.read_text()
    assert guard["artifacts"]["reports"]["junit"] == "traceml-compare.xml"
    assert any(line.startswith("traceml compare") and "--junit traceml-compare.xml" in line for line in guard["script"])
    assert "needs" in guard and lab["traceml-reference"]["artifacts"]["paths"] == ["logs/reference/final_summary.json"]


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    # GitHub runs `run:` blocks as `bash --noprofile --norc -eo pipefail {0}`.
    path = cwd / ".step.sh"
    path.write_text(script)
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_github_recipe_lines_on_real_runs(tmp_path, cli_env):
    work = tmp_path / "workspace"  # the checkout: the recipe names paths relative to it
    shutil.copytree(REPO / "examples", work / "examples")
    bindir = tmp_path / "bin"  # `traceml` as installed by the recipe's pip install
    bindir.mkdir()
    (bindir / "traceml").write_text(f"#!/bin/sh\nexec {sys.executable} -m traceml_tui \"$@\"\n")
    (bindir / "traceml").chmod(0o755)
    env = dict(cli_env, PATH=f"{bindir}{os.pathsep}{cli_env['PATH']}", GITHUB_WORKSPACE=str(work),
               **{k: str(v) for k, v in _github()["env"].items()})
    train = _step("Train the candidate (this commit)")["run"]
    compare = _step("Compare step time")["run"]

    def run_step(script: str, run_id: str, **extra: str) -> tuple[subprocess.CompletedProcess, str, str]:
        summary, output = tmp_path / f"summary-{run_id}.md", tmp_path / f"output-{run_id}"
        step_env = dict(env, GITHUB_RUN_ID=run_id, GITHUB_STEP_SUMMARY=str(summary), GITHUB_OUTPUT=str(output),
                        **extra)
        proc = _bash(script, work, step_env)
        return proc, summary.read_text() if summary.exists() else "", output.read_text() if output.exists() else ""

    # The reference: the candidate step's own lines, its run then named as the next run's reference.
    proc, _, _ = run_step(train, "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (work / "logs" / "candidate-1").rename(work / "logs" / "reference-2")
    proc, _, _ = run_step(train, "2")
    assert proc.returncode == 0, proc.stderr[-2000:]

    # Exit 0: green, verdict in the step summary, exit code in the step output, JUnit written.
    proc, summary, output = run_step(compare, "2", THRESHOLD_PCT="1000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary.lstrip().startswith("#") and "Step Time" in summary, summary[:500]
    assert "exit_code=0" in output and (work / "traceml-compare.xml").exists()
    assert "within 1000% or faster" in proc.stdout

    def candidate(run_id: str, nproc: str, *args: str) -> None:
        (work / "logs" / f"reference-{run_id}").symlink_to(work / "logs" / "reference-2")
        out = subprocess.run(["traceml", "run", env["TRAIN"], "--run-name", f"candidate-{run_id}", "--logs-dir", "logs",
                              "--nproc-per-node", nproc, "--args", *args], cwd=work, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]

    # Exit 4: a candidate 40 ms slower per step fails the job with an error annotation.
    candidate("3", "2", "--steps", "20", "--extra-step-ms", "40")
    proc, summary, output = run_step(compare, "3")
    assert proc.returncode == 4 and "exit_code=4" in output, proc.stdout + proc.stderr
    assert "::error title=traceml compare::step time regressed more than 5%" in proc.stdout
    assert "Step Time" in summary

    # Exit 3: a candidate on another topology (one process) cannot be judged; by default the job fails.
    candidate("4", "1", "--steps", "20")
    proc, summary, output = run_step(compare, "4")
    assert proc.returncode == 3 and "exit_code=3" in output, proc.stdout + proc.stderr
    assert "::error title=traceml compare::inconclusive (exit 3)" in proc.stdout

    # The commented variant, swapped in as the recipe's header says: the same pair is green with a warning.
    lines = compare.splitlines()
    (default,) = [i for i, line in enumerate(lines) if line.strip().startswith("3)")]
    assert lines[default + 1].strip().startswith("# 3)")
    variant = lines[:default] + [lines[default + 1].replace("# 3)", "3)", 1)] + lines[default + 2:]
    proc, summary, output = run_step("\n".join(variant) + "\n", "4")
    assert proc.returncode == 0 and "exit_code=3" in output, proc.stdout + proc.stderr
    assert "::warning title=traceml compare::inconclusive (exit 3)" in proc.stdout
