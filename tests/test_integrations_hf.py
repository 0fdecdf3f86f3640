"""Hugging Face Trainer under `traceml run` with no traceml code (docs/trainers.md), real 2-rank gloo runs.

One set of runs, many assertions: two 2-rank runs of one declared workload (examples/hf_trainer: GPT-2
from a tiny config, gradient accumulation 2, eval and save every 10 updates, a `hygiene:` validation
block), ``auto`` with no traceml code and ``explicit`` with traceml's callback added by the script. Each
answers every per-run assertion; together they are the pair `traceml compare` judges. They start in the
pool the Lightning module's runs share (tests/support/integrations.py).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest

from support import integrations as integrations_support
from support.cli import run_main
from support.integrations import evals, finite, measured_fields, prepare, records, steps

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group(integrations_support.GROUP),  # one worker launches the pool's runs once
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="the hf extra is not installed"),
]

TRACEML = [sys.executable, "-m", "traceml_tui"]
DETECTED = "traceml: Hugging Face Trainer detected: traceml callback added"
UPDATES, GRAD_ACCUM, BATCH, EVERY = 20, 2, 4, 10


def _plan(tmp_path_factory):
    """The runs: ``auto`` (the import hook attaches the callback) and ``explicit`` (the script adds it), 2 ranks."""
    work = prepare(tmp_path_factory.mktemp("hf"), "hf_trainer", "hf_explicit.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", XDG_STATE_HOME=str(work / "state"))
    env.pop("TRACEML_RUN_DIR", None)
    env.pop("TRACEML_AUTO_ATTACH", None)
    plan = {
        name: ([*TRACEML, "run", script, "--run-name", name, "--nproc-per-node", str(nproc),
                "--args", "--output-dir", f"out-{name}"], work, env)
        for name, script, nproc in (("auto", "train.py", 2), ("explicit", "hf_explicit.py", 2))
    }
    return plan, (work, env)


if importlib.util.find_spec("transformers") is not None:
    integrations_support.register(__name__.rpartition(".")[2], _plan)


@pytest.fixture(scope="module")
def hf(request):
    procs, (work, env) = integrations_support.runs(__name__.rpartition(".")[2], request)
    return work, env, {name: (proc, work / "logs" / name) for name, proc in procs.items()}


def _history(work: Path, name: str) -> list[dict]:
    """The Trainer's own log history (rank 0's last checkpoint): cross-rank mean losses, grad norms, eval loss."""
    state = json.loads((work / f"out-{name}" / f"checkpoint-{UPDATES}" / "trainer_state.json").read_text())
    return state["log_history"]


@pytest.mark.parametrize("name", ["auto", "explicit"])
def test_every_rank_records_every_update(hf, name):
    work, _, runs = hf
    proc, run_dir = runs[name]
    assert proc.returncode == 0, proc.stderr[-3000:]
    # rank 0 says it once, rank 1 stays quiet; the script's own callback: the import hook adds none
    assert proc.stderr.count(DETECTED) == (1 if name == "auto" else 0)
    for rank in (0, 1):
        rows = steps(run_dir, rank)
        assert [r["step"] for r in rows] == list(range(1, UPDATES + 1))  # one record per optimizer update
        for r in rows:
            assert finite(r["cpu_ms"]["step"]) and r["cpu_ms"]["step"] > 0
            assert finite(r["loss"]) and finite(r["lr"]) and finite(r["grad_norm"])
            for part in ("forward", "backward", "optimizer"):
                assert finite(r["cpu_ms"][part]), (rank, r["step"], part)
        assert all(finite(r["cpu_ms"]["data_wait"]) for r in rows[1:])  # the training loader's fetches
        # examples: per-device batch × accumulation steps per update, cumulative
        assert [r["examples"] for r in rows] == [BATCH * GRAD_ACCUM * s for s in range(1, UPDATES + 1)]
        # the lr each update used (linear decay from 1e-3, read before the scheduler steps)
        assert [r["lr"] for r in rows] == pytest.approx([1e-3 * (1 - s / UPDATES) for s in range(UPDATES)])
    # per-rank losses: each rank's own, not the cross-rank mean the Trainer logs
    zero, one = steps(run_dir, 0), steps(run_dir, 1)
    assert any(a["loss"] != b["loss"] for a, b in zip(zero, one))
    # ... whose mean over ranks and updates is the Trainer's logged loss: the whole accumulation group counts
    logged = {h["step"]: h for h in _history(work, name) if "loss" in h}
    for end in (EVERY, UPDATES):
        window = [r["loss"] for rows in (zero, one) for r in rows if end - EVERY < r["step"] <= end]
        assert sum(window) / len(window) == pytest.approx(logged[end]["loss"], rel=1e-4)
        # the gradient norm the Trainer computed (synchronized by DDP: the same on every rank)
        assert zero[end - 1]["grad_norm"] == pytest.approx(logged[end]["grad_norm"], rel=1e-4)


@pytest.mark.parametrize("name", ["auto", "explicit"])
def test_eval_records_and_published_checkpoints(hf, name):
    work, _, runs = hf
    _, run_dir = runs[name]
    eval_loss = {h["step"]: h["eval_loss"] for h in _history(work, name) if "eval_loss" in h}
    for rank in (0, 1):
        rows = evals(run_dir, rank)
        assert [r["step"] for r in rows] == [EVERY, UPDATES]  # on the step axis of completed updates
        assert [r["metrics"]["loss"] for r in rows] == pytest.approx([eval_loss[EVERY], eval_loss[UPDATES]])
    # hygiene declared: every checkpoint-N/ folder the Trainer saved is in the validation backlog (rank 0 only)
    requests = sorted(p.name for p in (run_dir / "validation" / "requests").iterdir())
    assert requests == ["step-00000010.json", "step-00000020.json"]
    published = run_dir / "checkpoints" / "step-00000010"
    assert (published / "model.safetensors").is_file() and (published / "trainer_state.json").is_file()
    checkpoint_records = [r for r in records(run_dir, 0) if r["kind"] == "checkpoint"]
    assert [r["step"] for r in checkpoint_records] == [EVERY, UPDATES]
    assert not [r for r in records(run_dir, 1) if r["kind"] == "checkpoint"]


def test_two_runs_of_one_workload_get_a_verdict(hf):
    work, env, runs = hf
    for name in ("auto", "explicit"):
        summary = json.loads((runs[name][1] / "final_summary.json").read_text())
        assert summary["step_time"]["global"]["window"]["steps_analyzed"] == UPDATES
    proc = run_main(["compare", str(runs["auto"][1] / "final_summary.json"),  # in this process (support/cli.py)
                     str(runs["explicit"][1] / "final_summary.json"), "--max-step-time-regression-pct", "50"],
                    env=env, cwd=work)
    assert proc.returncode in (0, 4), proc.stdout + proc.stderr  # a verdict, never INCONCLUSIVE (3)


def test_explicit_callback_records_what_the_automatic_path_does_once(hf):
    _, _, runs = hf
    proc, run_dir = runs["explicit"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert DETECTED not in proc.stderr  # the script's own callback: the import hook adds none
    for rank in (0, 1):
        explicit, automatic = steps(run_dir, rank), steps(runs["auto"][1], rank)
        assert [r["step"] for r in explicit] == list(range(1, UPDATES + 1))  # not instrumented twice
        assert [r["step"] for r in evals(run_dir, rank)] == [r["step"] for r in evals(runs["auto"][1], rank)]
        assert ({frozenset(measured_fields(r)) for r in explicit[1:]}
                == {frozenset(measured_fields(r)) for r in automatic[1:]})
        assert [r["lr"] for r in explicit] == pytest.approx([r["lr"] for r in automatic])
        assert all(not math.isnan(r["loss"]) for r in explicit)
