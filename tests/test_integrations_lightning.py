"""Lightning ``Trainer.fit`` under `traceml run` with no traceml code (docs/trainers.md), real 2-rank gloo runs.

One set of runs (started in the pool the Hugging Face module's runs share,
tests/support/integrations.py), many assertions: a 2-rank run of examples/lightning (validation and
checkpoint every 10 updates, a `hygiene:` validation block); the same fit with traceml's explicit callback
started without `traceml run` but through the bootstrap (records under ./logs; never instrumented twice);
and two limits (manual optimization, a fit that starts its own processes). The one-process fits
(``direct``, ``manual``) run as forked children of the pool's one Lightning process (``Fit``). The kill
switches (the flag and the environment variable) are tested with a framework-free probe in
tests/test_integrations_bootstrap.py: with them the ranks never install the import hook that attaches.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import sys

import pytest

from support import integrations as integrations_support
from support.integrations import SCRIPTS, evals, finite, measured_fields, prepare, records, steps

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group(integrations_support.GROUP),  # one worker launches the pool's runs once
    pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="the lightning extra is not installed"),
]

TRACEML = [sys.executable, "-m", "traceml_tui"]
DETECTED = "traceml: Lightning Trainer detected: traceml callback added"
UPDATES, EVERY, BATCH = 20, 10, 32


def _plan(tmp_path_factory):
    """The runs by name: ``auto`` (2 ranks) and ``selfspawn`` (Lightning starts its second process itself)
    under `traceml run`; the one-process fits ``direct`` (the script adds the callback; no launcher, but the
    bootstrap's import hook, which must not add a second one) and ``manual`` (manual optimization, 6 updates,
    no traceml code: the hook attaches; no launcher, so rank 0 writes the summary at exit, docs/run.md).

    ``auto`` and ``direct`` run in a copy of the example (its `traceml.yaml`: guard and hygiene); the others
    in folders with no `traceml.yaml`, since what they test needs neither (no curve refreshes)."""
    work = prepare(tmp_path_factory.mktemp("lightning"), "lightning", "lightning_explicit.py")
    plain = tmp_path_factory.mktemp("lightning-plain")
    for script in ("lightning_manual.py", "lightning_selfspawn.py", "lightning_wrapped.py"):
        shutil.copy(SCRIPTS / script, plain / script)
    env = dict(os.environ, OMP_NUM_THREADS="1", XDG_STATE_HOME=str(work / "state"))
    env.pop("TRACEML_RUN_DIR", None)
    env.pop("TRACEML_AUTO_ATTACH", None)
    runs = {  # the longest first: the pool packs them better
        "auto": (["train.py", "--nproc-per-node", "2", "--args", "--checkpoint-dir", "ckpt-auto"], work),
        "selfspawn": (["lightning_selfspawn.py"], plain),
    }
    plan = {name: ([*TRACEML, "run", "--run-name", name, *args], cwd, env) for name, (args, cwd) in runs.items()}
    run_dirs = {name: cwd / "logs" / name for name, (_, cwd) in runs.items()}
    direct, manual, wrapped = work / "direct", plain / "manual", plain / "wrapped"
    for folder in (direct, manual, wrapped):
        folder.mkdir()
    plan["direct"] = integrations_support.Fit(work / "lightning_explicit.py", direct)
    plan["manual"] = integrations_support.Fit(plain / "lightning_manual.py", manual, ("6",))
    plan["wrapped"] = integrations_support.Fit(plain / "lightning_wrapped.py", wrapped, ("6",))
    return plan, (direct, run_dirs, {"direct": direct, "manual": manual, "wrapped": wrapped})


if importlib.util.find_spec("lightning") is not None:
    integrations_support.register(__name__.rpartition(".")[2], _plan)


@pytest.fixture(scope="module")
def pl(request):
    procs, (direct, run_dirs, fit_folders) = integrations_support.runs(__name__.rpartition(".")[2], request)
    runs = {name: (procs[name], run_dir) for name, run_dir in run_dirs.items()}
    for name, folder in fit_folders.items():  # no launcher: the run folder the SDK made under ./logs
        found = sorted((folder / "logs").iterdir()) if (folder / "logs").is_dir() else []
        runs[name] = (procs[name], found[0] if len(found) == 1 else None)
    return direct.parent, runs


def test_every_rank_records_every_update(pl):
    _, runs = pl
    proc, run_dir = runs["auto"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(DETECTED) == 1
    for rank in (0, 1):
        rows = steps(run_dir, rank)
        assert [r["step"] for r in rows] == list(range(1, UPDATES + 1))
        for r in rows:
            assert finite(r["cpu_ms"]["step"]) and r["cpu_ms"]["step"] > 0 and finite(r["loss"])
            assert all(finite(r["cpu_ms"][p]) for p in ("forward", "backward", "optimizer"))
        assert all(finite(r["cpu_ms"]["data_wait"]) for r in rows[1:])
        assert [r["examples"] for r in rows] == [BATCH * s for s in range(1, UPDATES + 1)]
        # StepLR(step_size=5, gamma=0.5), stepped every update: the lr each update used, before the scheduler
        assert [r["lr"] for r in rows] == pytest.approx([0.05 * 0.5 ** ((s - 1) // 5) for s in range(1, UPDATES + 1)])
        # forward and backward run inside optimizer.step(closure): they are not optimizer time
        optimizer = statistics.median(r["cpu_ms"]["optimizer"] for r in rows)
        compute = statistics.median(r["cpu_ms"]["forward"] + r["cpu_ms"]["backward"] for r in rows)
        assert optimizer < compute, (optimizer, compute)
    assert any(a["loss"] != b["loss"] for a, b in zip(steps(run_dir, 0), steps(run_dir, 1)))  # each rank's own


def test_validation_is_eval_and_checkpoints_are_published(pl):
    _, runs = pl
    _, run_dir = runs["auto"]
    for rank in (0, 1):
        rows = evals(run_dir, rank)  # the sanity check is not an evaluation
        assert [r["step"] for r in rows] == [EVERY, UPDATES]
        assert all(set(r["metrics"]) == {"loss"} and finite(r["metrics"]["loss"]) for r in rows)
    requests = sorted(p.name for p in (run_dir / "validation" / "requests").iterdir())
    assert requests == ["step-00000010.json", "step-00000020.json"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-00000010.ckpt", "step-00000020.ckpt"]
    assert not [r for r in records(run_dir, 1) if r["kind"] == "checkpoint"]


def test_explicit_callback_records_what_the_automatic_path_does_once(pl):
    _, runs = pl
    proc, run_dir = runs["direct"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert run_dir is not None, "the explicit callback without traceml run wrote no run folder under ./logs"
    assert DETECTED not in proc.stderr
    explicit, automatic = steps(run_dir), steps(runs["auto"][1])
    assert [r["step"] for r in explicit] == list(range(1, UPDATES + 1))  # never instrumented twice
    assert [r["step"] for r in evals(run_dir)] == [EVERY, UPDATES]
    assert {frozenset(measured_fields(r)) for r in explicit[1:]} == {frozenset(measured_fields(r)) for r in automatic[1:]}
    assert [r["lr"] for r in explicit] == pytest.approx([r["lr"] for r in automatic])


def test_a_trace_step_inside_the_traced_update_is_ignored_the_run_is_traced_once(pl):
    """Found trying the product: a Lightning script that also wraps its training_step in traceml.trace_step (as
    the README shows for a hand-written loop) recorded each of 20 updates as two steps, one a ~0.1 ms phantom:
    step time halved, steps/s doubled, the guard's figures wrong, without a word. Its validation_step calling
    training_step (validation every 3 updates, and the sanity check) records no step either (found by an
    independent review: a phantom step per validation batch)."""
    _, runs = pl
    proc, run_dir = runs["wrapped"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in steps(run_dir, 0)] == list(range(1, 7))
    assert all(r["cpu_ms"]["forward"] is not None and r["cpu_ms"]["step"] > r["cpu_ms"]["forward"]
               for r in steps(run_dir, 0))
    assert proc.stderr.count("trace_step inside a step already traced") == 1


def test_manual_optimization_is_named_unmeasured_never_split_wrongly(pl):
    _, runs = pl
    proc, run_dir = runs["manual"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(DETECTED) == 1 and run_dir is not None  # attached by the import hook
    for part in ("forward", "backward", "optimizer"):
        assert proc.stderr.count(f"traceml: {part} not measured") == 1, proc.stderr[-3000:]
    unmeasured = {r["stream"]: r["reason"] for r in records(run_dir) if r["kind"] == "unmeasured"}
    assert set(unmeasured) == {"forward", "backward", "optimizer"}
    assert all("manual optimization" in reason for reason in unmeasured.values())
    rows = steps(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 7))  # one per optimizer update, as ever
    assert all(r["cpu_ms"][p] is None for r in rows for p in ("forward", "backward", "optimizer"))
    assert all(finite(r["cpu_ms"]["step"]) and finite(r["lr"]) and finite(r["loss"]) for r in rows)
    # the summary says which streams are missing and why (the words of the records)
    summary = json.loads((run_dir / "final_summary.json").read_text())
    assert summary["integration"] == {"steps_traced": True, "unmeasured": [
        {"rank": 0, "stream": stream, "reason": unmeasured[stream]} for stream in ("backward", "forward", "optimizer")]}  # by stream


def test_a_fit_that_starts_its_own_processes_says_nothing_is_measured(pl):
    _, runs = pl
    proc, run_dir = runs["selfspawn"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = "traceml: nothing measured: Lightning Trainer launches its own 2 processes"
    assert proc.stderr.count(line) == 1, proc.stderr[-3000:]
    rows = records(run_dir)
    assert [r["stream"] for r in rows if r["kind"] == "unmeasured"] == ["all"]
    assert not [r for r in rows if r["kind"] == "step"]  # no half-recorded run: rank 1 was never traced
    assert sorted(p.name for p in (run_dir / "ranks").iterdir()) == ["rank_0"]
    summary = json.loads((run_dir / "final_summary.json").read_text())
    (why,) = [r["reason"] for r in rows if r["kind"] == "unmeasured"]
    assert summary["integration"] == {"steps_traced": False, "unmeasured": [{"rank": 0, "stream": "all", "reason": why}]}
