"""How the Hugging Face callback times an update's parts (docs/trainers.md, "What each step records" and
"Overhead"): through the Trainer's own ``compute_loss`` and ``Accelerator.backward``, no model hooks; a
trainer whose ``training_step`` calls neither gets the model's hooks from its second update on; this rank's
loss is the sum of its ``training_step`` outputs; a failure in a per-update event switches the callback off.

The Trainers run in one child process (tests/scripts/hf_phases.py: two tiny one-process trainers), one of the
trainer runs' one-process fits (tests/support/integrations.py ``Fit``: forked from the process that imported
Lightning, which has imported most of transformers already, through the bootstrap); without Lightning
installed, in a process of its own. The fail-open test needs no framework.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import integrations as integrations_support

SCRIPT = Path(__file__).resolve().parent / "scripts" / "hf_phases.py"
UPDATES, GRAD_ACCUM, BATCH = 4, 2, 4
HAS_HF = importlib.util.find_spec("transformers") is not None
#: The pool's one-process fits run in the process that imported Lightning (tests/support/integrations.py).
POOLED = HAS_HF and importlib.util.find_spec("lightning") is not None


def needs_hf(test):
    """A test reading the Trainers' records: slow, with the trainer runs' pool, only with the hf extra."""
    for mark in (pytest.mark.slow, pytest.mark.xdist_group(integrations_support.GROUP),
                 pytest.mark.skipif(not HAS_HF, reason="the hf extra is not installed")):
        test = mark(test)
    return test


def _steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "ranks" / "rank_0" / "steps-0.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "step"]


def _plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf-phases")
    return {"phases": integrations_support.Fit(SCRIPT, folder, ("phases",))}, folder


if POOLED:
    integrations_support.register(__name__.rpartition(".")[2], _plan)


@pytest.fixture(scope="module")
def trained(request, tmp_path_factory):
    if POOLED:
        procs, folder = integrations_support.runs(__name__.rpartition(".")[2], request)
        proc = procs["phases"]
    else:
        folder = tmp_path_factory.mktemp("hf-phases")
        env = dict(os.environ, OMP_NUM_THREADS="1", XDG_STATE_HOME=str(folder / "state"))
        for name in ("TRACEML_RUN_DIR", "TRACEML_RUN_NAME", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(name, None)
        proc = subprocess.run([sys.executable, "-m", "traceml_tui.integrations.bootstrap", str(SCRIPT), "phases"],
                              cwd=folder, env=env, capture_output=True, text=True,
                              timeout=integrations_support.RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    return seen, _steps(folder / "logs" / "phases")


@needs_hf
def test_stock_trainer_parts_come_from_its_own_methods_not_model_hooks(trained):
    seen, rows = trained
    stock = rows[:UPDATES]
    assert [r["step"] for r in stock] == list(range(1, UPDATES + 1))
    assert seen["stock"]["hooks"] == [0] * UPDATES  # no forward hook on the model at any update's end
    for r in stock:
        parts = r["cpu_ms"]
        assert all(math.isfinite(parts[p]) and parts[p] > 0 for p in ("forward", "backward", "optimizer")), r
        assert parts["forward"] + parts["backward"] + parts["optimizer"] <= parts["step"]
    # this rank's loss: the sum of the update's training_step outputs (each divided by the accumulation steps)
    outputs = seen["stock"]["outputs"]
    assert len(outputs) == UPDATES * GRAD_ACCUM
    assert [r["loss"] for r in stock] == pytest.approx(
        [sum(outputs[i * GRAD_ACCUM:(i + 1) * GRAD_ACCUM]) for i in range(UPDATES)], rel=1e-6)
    assert [r["examples"] for r in stock] == [BATCH * GRAD_ACCUM * s for s in range(1, UPDATES + 1)]


@needs_hf
def test_a_training_step_of_its_own_is_timed_by_model_hooks_from_its_second_update(trained):
    seen, rows = trained
    own = rows[UPDATES:]
    assert [r["step"] for r in own] == list(range(UPDATES + 1, 2 * UPDATES + 1))
    # a second train() in the process: its first update has no input wait, as the first train()'s first (the
    # time between the two trainers, building the second, is not the training loop's)
    assert rows[0]["cpu_ms"]["input_wait"] is None and own[0]["cpu_ms"]["input_wait"] is None
    assert all(r["cpu_ms"]["input_wait"] is not None for r in own[1:])
    # the first update showed that neither method runs: its forward and backward are missing, never wrong ...
    assert own[0]["cpu_ms"]["forward"] is None and own[0]["cpu_ms"]["backward"] is None
    # ... and the model's hooks time them from then on (one forward pre-hook and one forward hook)
    assert seen["own"]["hooks"] == [2] * UPDATES
    for r in own[1:]:
        parts = r["cpu_ms"]
        assert all(math.isfinite(parts[p]) and parts[p] > 0 for p in ("forward", "backward", "optimizer")), r
        assert parts["forward"] + parts["backward"] + parts["optimizer"] <= parts["step"]
    outputs = seen["own"]["outputs"]
    assert [r["loss"] for r in own] == pytest.approx(
        [sum(outputs[i * GRAD_ACCUM:(i + 1) * GRAD_ACCUM]) for i in range(UPDATES)], rel=1e-6)


_FAILING_UPDATE = """
import traceml_tui as traceml
from traceml_tui.integrations.hf import _Tracer


class Groups:
    @property
    def param_groups(self):
        raise RuntimeError("a broken optimizer")


tracer = _Tracer()
traceml.init()
for update in range(3):
    tracer.on_step_begin(None, None, None)
    tracer.on_pre_optimizer_step(None, None, None, optimizer=object() if update == 0 else Groups())
    tracer.on_optimizer_step(None, None, None)
    tracer.on_step_end(None, None, None)  # never raised into the trainer
assert tracer._traceml_off and tracer._state is None
print("trained on")
"""


def test_a_failing_update_event_switches_the_callback_off_and_drops_the_open_update(tmp_path):
    env = dict(os.environ, TRACEML_RUN_DIR=str(tmp_path / "run"), TRACEML_RUN_NAME="run")
    env.pop("RANK", None)
    proc = subprocess.run([sys.executable, "-c", _FAILING_UPDATE], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "trained on", proc.stderr
    line = ("traceml: nothing measured: Hugging Face Trainer callback failed in on_pre_optimizer_step "
            "(RuntimeError: a broken optimizer)")
    assert proc.stderr.count(line) == 1, proc.stderr
    rows = [json.loads(x) for x in (tmp_path / "run" / "ranks" / "rank_0" / "steps-0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "step"] == [1]  # the update that failed is not recorded
    assert [r["stream"] for r in rows if r["kind"] == "unmeasured"].count("all") == 1
