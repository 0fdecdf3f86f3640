"""Helpers of the trainer integration tests (tests/test_integrations_*.py): launch, read records.

The real runs of all those modules share one pool (:func:`register`, :func:`runs`): the first module
fixture that asks starts every selected module's runs, a few at a time, so Lightning's runs train
while the Hugging Face tests read theirs, and the two cores stay busy between launches.

The pool lives in one process. Under ``pytest -n 2`` every test that reads it is in the xdist group
:data:`GROUP`, so one worker runs them all and each run is launched once a session (without the group each
worker that asked started the whole pool again: every real run twice). Under ``--dist loadgroup`` (the
suite's mode, README "test lanes") a second launch fails loudly; other modes ignore groups, and every
module-scoped fixture is then made once per worker anyway.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

from support.parallel import session_dir

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


#: The ``xdist_group`` of every test module reading the pool (``pytestmark``): one worker, one pool.
GROUP = "trainer-runs"
#: Runs at a time: a run spends much of its wall time in single-threaded startup (launcher, torchrun,
#: imports), so three keep the suite's two cores busy.
WORKERS = 3
Plan = dict[str, tuple[list[str], Path, dict]]
_builders: dict[str, Callable[[Any], tuple[Plan, Any]]] = {}
_started: dict[str, tuple[dict[str, Future], Any]] = {}
_lock = threading.Lock()
_pool: Optional[ThreadPoolExecutor] = None
_claims: Optional[Path] = None


def _claim(factory: Any, module: str) -> None:
    """Mark ``module``'s runs launched for the whole session; fail if another worker of it launched them already
    (a test reading the pool outside :data:`GROUP`: every run would train twice)."""
    global _claims
    if _claims is None:
        _claims = session_dir(factory, "trainer-runs")
    try:
        (_claims / f"{module}.launched").touch(exist_ok=False)
    except FileExistsError:
        raise RuntimeError(f"{module}: its real runs were already launched by another pytest worker of this session; "
                           f"every test reading them belongs in xdist_group {GROUP!r} (tests/support/integrations.py)"
                           ) from None


def register(group: str, build: Callable[[Any], tuple[Plan, Any]]) -> None:
    """Declare a test module's runs: ``build(tmp_path_factory)`` -> (plan name -> (cmd, cwd, env), context)."""
    _builders[group] = build


def runs(group: str, request: Any) -> tuple[dict[str, subprocess.CompletedProcess], Any]:
    """``group``'s finished runs and its build context, started (with every selected group's) on first use."""
    global _pool
    factory = request.getfixturevalue("tmp_path_factory")
    selected = {item.module.__name__ for item in request.session.items if getattr(item, "module", None)}
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="integration-run")
        # the asking group first, then the others whose tests were selected
        for name in [group, *sorted(_builders)]:
            if name in _started or (name != group and not any(m.endswith(name) for m in selected)):
                continue
            if request.config.getoption("dist", "no") == "loadgroup":  # where xdist honours the group
                _claim(factory, name)
            plan, context = _builders[name](factory)
            _started[name] = ({run: _pool.submit(launch, cmd, cwd, env) for run, (cmd, cwd, env) in plan.items()},
                              context)
    futures, context = _started[group]
    return {run: future.result() for run, future in futures.items()}, context


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
