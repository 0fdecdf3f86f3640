"""Helpers of the trainer integration tests (tests/test_integrations_*.py): launch, read records."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"
#: Seconds one real run may take on a loaded 2-core machine.
RUN_TIMEOUT_S = 400


def prepare(work: Path, example: str, explicit_script: Optional[str] = None) -> Path:
    """A working folder holding the example's train.py and traceml.yaml (and the explicit script)."""
    work.mkdir(parents=True, exist_ok=True)
    for name in ("train.py", "traceml.yaml"):
        shutil.copy(ROOT / "examples" / example / name, work / name)
    if explicit_script:
        shutil.copy(SCRIPTS / explicit_script, work / explicit_script)
    return work


def launch(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """Run one command to the end (output captured)."""
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def launch_all(plan: dict[str, tuple[list[str], Path, dict]]) -> dict[str, subprocess.CompletedProcess]:
    """Run the commands of ``plan`` (name -> (cmd, cwd, env)) two at a time (the suite's 2 cores)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(launch, cmd, cwd, env) for name, (cmd, cwd, env) in plan.items()}
        return {name: future.result() for name, future in futures.items()}


def records(run_dir: Path, rank: int = 0) -> list[dict]:
    """Every record of one rank's first attempt, in file order."""
    path = run_dir / "ranks" / f"rank_{rank}" / "steps-0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps(run_dir: Path, rank: int = 0) -> list[dict]:
    return [r for r in records(run_dir, rank) if r["kind"] == "step"]


def evals(run_dir: Path, rank: int = 0) -> list[dict]:
    return [r for r in records(run_dir, rank) if r["kind"] == "eval"]


def finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def measured_fields(step: dict) -> set[str]:
    """The names a step record measured: its non-null values and non-null CPU parts (``cpu.<part>``)."""
    out = {k for k in ("loss", "lr", "grad_norm", "examples") if step.get(k) is not None}
    out |= {f"cpu.{k}" for k, v in step["cpu_ms"].items() if v is not None}
    return out
