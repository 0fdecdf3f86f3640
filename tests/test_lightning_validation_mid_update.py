"""Validation that Lightning runs between two micro-batches of an update is no part of it (docs/trainers.md,
"What each step records").

An int ``val_check_interval`` counts training batches: with ``accumulate_grad_batches=2`` and
``val_check_interval=3`` validation runs after batches 3, 6 and 9, i.e. inside update 2 (its first micro-batch
done), between updates 3 and 4, and inside update 5. The update is paused for the validation: its time is the
update's input wait (between steps), as a validation between two updates is the next update's, and its
fetches are no update's data wait. Real fits (tests/support/integrations.py ``Fit``): validation sleeps a
known time per batch and its loader a known time per fetch, and the records show where each landed.
"""

import importlib.util
import json
from types import SimpleNamespace

import pytest

from traceml_tui.core import steptime

from support import integrations as integrations_support

needs_lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                     reason="the lightning extra is not installed")

#: Per validation batch: the validation_step's sleep and the validation loader's fetch (2 batches a validation).
VAL_STEP_S, VAL_FETCH_S, VAL_BATCHES = 0.2, 0.1, 2
VALIDATION_MS = VAL_BATCHES * (VAL_STEP_S + VAL_FETCH_S) * 1000
#: An update of this tiny model takes a few ms; validation inside it would add VALIDATION_MS.
UPDATE_MS = 100

_FIT = r"""
import json, sys, time
import torch, lightning.pytorch as L
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
import traceml_tui as traceml
from traceml_tui.integrations.lightning import TraceMLCallback

VAL_STEP_S, VAL_FETCH_S = float(sys.argv[1]), float(sys.argv[2])
VAL_CHECK, MAX_STEPS = int(sys.argv[3]), int(sys.argv[4])

class SlowVal(Dataset):  # each batch of 4 takes VAL_FETCH_S to fetch
    def __init__(self, x):
        self.x = x
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        time.sleep(VAL_FETCH_S / 4)
        return self.x[i], self.x[i, :1]

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        if not self.training:  # called by validation_step (a common pattern): validation's own time
            time.sleep(VAL_STEP_S)
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)
    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.training_step(batch, batch_idx))
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
x = torch.randn(64, 4)
trainer = L.Trainer(max_steps=MAX_STEPS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=2,
                    val_check_interval=VAL_CHECK, num_sanity_val_steps=2, callbacks=[TraceMLCallback()])
trainer.fit(Net(), DataLoader(TensorDataset(x, x[:, :1]), batch_size=4), DataLoader(SlowVal(x[:8]), batch_size=4))
traceml.finish()
print(json.dumps({"path": str(traceml.current_run().path)}))
"""


def _plan(tmp_path_factory):
    plan, folders = {}, {}
    for name, val_check, max_steps in (("every-3", 3, 5), ("every-1", 1, 2)):
        folder = folders[name] = tmp_path_factory.mktemp(f"validation-mid-update-{name}")
        (folder / "fit.py").write_text(_FIT)
        plan[name] = integrations_support.Fit(folder / "fit.py", folder,
                                              (str(VAL_STEP_S), str(VAL_FETCH_S), str(val_check), str(max_steps)))
    return plan, folders


if importlib.util.find_spec("lightning") is not None:
    integrations_support.register(__name__.rpartition(".")[2], _plan)


@pytest.fixture(scope="module")
def fits(request):
    procs, folders = integrations_support.runs(__name__.rpartition(".")[2], request)
    out = {}
    for name, done in procs.items():
        assert done.returncode == 0, done.stderr[-3000:]
        path = folders[name] / json.loads(done.stdout.strip().splitlines()[-1])["path"]
        out[name] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def _parts(cpu: dict) -> steptime.StepParts:
    return steptime.step_parts(SimpleNamespace(**cpu))


def _assert_parts_sum(cpu: dict) -> None:
    """The record's phases fit in its traced envelope, and its parts sum to the step time (core/steptime.py)."""
    inside = sum(cpu[k] or 0.0 for k in ("data_in_step", "forward", "backward", "optimizer"))
    assert inside <= cpu["step"]
    parts = _parts(cpu)
    assert parts is not None and parts.residual >= 0
    assert sum(parts.parts()) == pytest.approx(parts.whole)
    assert parts.whole == pytest.approx(cpu["step"] + (cpu["input_wait"] or 0.0))


@pytest.mark.slow
@needs_lightning
@pytest.mark.xdist_group(integrations_support.GROUP)  # one worker runs the trainer runs, once
def test_a_validation_inside_an_update_is_its_input_wait_not_its_step(fits) -> None:
    rows = fits["every-3"]
    steps = {r["step"]: r["cpu_ms"] for r in rows if r["kind"] == "step"}
    assert [r["step"] for r in rows if r["kind"] == "step"] == [1, 2, 3, 4, 5]  # one record per update
    # validation ran inside updates 2 and 5 (after batches 3 and 9) and between updates 3 and 4 (after batch 6)
    for step in (2, 4, 5):
        cpu = steps[step]
        assert cpu["step"] < UPDATE_MS, (step, cpu)  # the validation is not in the update's envelope ...
        assert cpu["input_wait"] >= VALIDATION_MS * 0.95, (step, cpu)  # ... it is between steps, before it
        # the validation's fetches are not the update's data wait (in its gap nor inside it)
        assert (cpu["data_wait"] or 0.0) < VAL_FETCH_S * 1000 / 2 and (cpu["data_in_step"] or 0.0) < VAL_FETCH_S * 1000 / 2
        _assert_parts_sum(cpu)
        assert _parts(cpu).between_steps >= VALIDATION_MS * 0.9
    for step in (1, 3):  # no validation around these (the sanity check ran before the first update)
        cpu = steps[step]
        assert cpu["step"] < UPDATE_MS and (step == 1) == (cpu["input_wait"] is None), (step, cpu)
        assert step == 1 or cpu["input_wait"] < VALIDATION_MS / 2, (step, cpu)
        _assert_parts_sum(cpu)
    # each validation is an eval record at the last completed update; the sanity check is none
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [1, 3, 4]


@pytest.mark.slow
@needs_lightning
@pytest.mark.xdist_group(integrations_support.GROUP)
def test_a_validation_inside_the_first_update_is_left_out_of_its_step_time(fits) -> None:
    """The first update of a fit has no known input wait (core/steptime.py): a validation inside it (after batch
    1 of 2) is in no part of it."""
    rows = fits["every-1"]
    steps = {r["step"]: r["cpu_ms"] for r in rows if r["kind"] == "step"}
    assert list(steps) == [1, 2]
    assert steps[1]["input_wait"] is None and steps[1]["step"] < UPDATE_MS, steps[1]
    # validation after batches 1 (inside update 1), 2 (between 1 and 2) and 3 (inside update 2): update 2
    # waited for two of them
    assert steps[2]["step"] < UPDATE_MS and steps[2]["input_wait"] >= 2 * VALIDATION_MS * 0.95, steps[2]
    for cpu in steps.values():
        _assert_parts_sum(cpu)
    # at the last completed update: 0 for the validation inside the first update
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 1, 1, 2]
