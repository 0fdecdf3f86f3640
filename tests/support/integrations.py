"""Helpers of the trainer integration tests (tests/test_integrations_*.py): launch, read records.

The real runs of all those modules share one pool (:func:`register`, :func:`runs`): the first module
fixture that asks starts every selected module's runs, a few at a time, so Lightning's runs train
while the Hugging Face tests read theirs, and the two cores stay busy between launches.

A run is either a command (``traceml run …``: its own processes) or a :class:`Fit`, a one-process
Lightning fit. Every selected module's fits run in one process, ``tests/scripts/forked_fits.py``, which
imports Lightning once and forks a fresh child per fit: importing Lightning is most of a small fit's
CPU (docs/trainers.md, "The tests, and what they cost").

The pool lives in one process. Under ``pytest -n 2`` every test that reads it is in the xdist group
:data:`GROUP`, so one worker runs them all and each run is launched once a session (without the group each
worker that asked started the whole pool again: every real run twice). Under ``--dist loadgroup`` (the
suite's mode, README "test lanes") a second launch fails loudly; other modes ignore groups, and every
module-scoped fixture is then made once per worker anyway.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional, Union

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


@dataclass(frozen=True)
class Fit:
    """A one-process Lightning fit: ``script args…`` started in ``cwd`` through traceml's bootstrap (as
    ``python -m traceml_tui.integrations.bootstrap SCRIPT ARGS`` would: the import hook in place, no
    launcher), run as a forked child of the pool's one Lightning process (``tests/scripts/forked_fits.py``)."""

    script: Path
    cwd: Path
    args: tuple[str, ...] = field(default=())


#: The ``xdist_group`` of every test module reading the pool (``pytestmark``): one worker, one pool.
GROUP = "trainer-runs"
#: Runs at a time: a run spends much of its wall time in single-threaded startup (launcher, torchrun,
#: imports), so three keep the suite's two cores busy.
WORKERS = 3
#: Seconds one fit may take in the forked-fits process (the process as a whole: :data:`RUN_TIMEOUT_S`).
FIT_TIMEOUT_S = 240
FORKED_FITS = SCRIPTS / "forked_fits.py"
Plan = dict[str, Union[tuple[list[str], Path, dict], Fit]]
_builders: dict[str, Callable[[Any], tuple[Plan, Any]]] = {}
_started: dict[str, tuple[dict[str, Callable[[], subprocess.CompletedProcess]], Any]] = {}
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
        plans: dict[str, tuple[Plan, Any]] = {}
        # the asking group first, then the others whose tests were selected
        for name in [group, *sorted(_builders)]:
            if name in _started or name in plans or (name != group and not any(m.endswith(name) for m in selected)):
                continue
            if request.config.getoption("dist", "no") == "loadgroup":  # where xdist honours the group
                _claim(factory, name)
            plans[name] = _builders[name](factory)
        fits = {(name, run): fit for name, (plan, _) in plans.items() for run, fit in plan.items()
                if isinstance(fit, Fit)}
        # the fits first: one process that holds several of them, so among the longest
        forked = _pool.submit(_run_fits, fits, factory.mktemp("forked-fits")) if fits else None
        for name, (plan, context) in plans.items():
            results = {run: partial(_fit_result, forked, name, run) if isinstance(spec, Fit)
                       else _pool.submit(launch, *spec).result for run, spec in plan.items()}
            _started[name] = (results, context)
    results, context = _started[group]
    return {run: result() for run, result in results.items()}, context


def _run_fits(fits: dict[tuple[str, str], Fit], folder: Path, preload: tuple[str, ...] = ("lightning.pytorch",)
              ) -> tuple[subprocess.CompletedProcess, dict, dict]:
    """Run ``fits`` in one forked-fits process that imported ``preload``; (that process, exit status by fit,
    fit -> (stdout, stderr) files)."""
    names = {key: f"{key[0]}.{key[1]}" for key in fits}
    outputs = {key: (folder / f"{names[key]}.stdout", folder / f"{names[key]}.stderr") for key in fits}
    spec = {
        "preload": list(preload), "results": str(folder / "results.json"), "timeout_s": FIT_TIMEOUT_S,
        "fits": [{"name": names[key], "script": str(fit.script), "args": list(fit.args), "cwd": str(fit.cwd),
                  "stdout": str(outputs[key][0]), "stderr": str(outputs[key][1])} for key, fit in fits.items()],
    }
    (folder / "spec.json").write_text(json.dumps(spec, indent=1))
    env = dict(os.environ, OMP_NUM_THREADS="1", XDG_STATE_HOME=str(folder / "state"))
    for name in ("TRACEML_RUN_DIR", "TRACEML_RUN_NAME", "TRACEML_AUTO_ATTACH", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    proc = launch([sys.executable, "-m", "traceml_tui.integrations.bootstrap", str(FORKED_FITS),
                   str(folder / "spec.json")], folder, env)
    results = json.loads((folder / "results.json").read_text()) if (folder / "results.json").is_file() else {}
    return proc, {key: results.get(name) for key, name in names.items()}, outputs


def _fit_result(forked: Future, group: str, run: str) -> subprocess.CompletedProcess:
    """One fit's outcome as a finished process: its exit status, stdout and stderr."""
    proc, codes, outputs = forked.result()
    code = codes[(group, run)]
    out, err = (path.read_text() if path.is_file() else "" for path in outputs[(group, run)])
    if code is None:  # the forked-fits process ended before this fit did: its own error says why
        code, err = proc.returncode or 1, err + "\n[forked-fits process]\n" + proc.stderr[-3000:]
    return subprocess.CompletedProcess([str(FORKED_FITS), group, run], code, out, err)


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
