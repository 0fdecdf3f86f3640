"""Where a Lightning update ends (docs/trainers.md, "What each step records").

The update is one optimizer update: its optimizer part runs from the module's
``on_before_optimizer_step`` through ``optimizer_step`` and the step-interval
scheduler step that Lightning runs right after it; the batch-end hooks that
follow (a checkpoint save, a slow callback), validation and the next fetch are
between steps (with gradient accumulation, the batch ends of the update's
earlier micro-batches are inside it). A real fit per accumulation, each a one-process fit of the
trainer runs (tests/support/integrations.py ``Fit``: a forked child of the one process that imported
Lightning; its import costs seconds): the scheduler and a batch-end callback each sleep a known time, and
the records show where each landed.
"""

import importlib.util
import json

import pytest

from support import integrations as integrations_support

needs_lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                     reason="the lightning extra is not installed")

SCHEDULER_S, BATCH_END_S = 0.12, 0.2

_FIT = r"""
import json, sys, time
import torch, lightning.pytorch as L
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import traceml_tui as traceml
from traceml_tui.integrations.lightning import TraceMLCallback

SCHEDULER_S, BATCH_END_S, ACCUMULATE = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
MODE = sys.argv[4] if len(sys.argv) > 4 else ""
LOG_GRAD_NORM = MODE == "grad-norm"
norms = []

def slow_factor(step):
    if step:  # (the scheduler's own first call, at set-up, is not a step)
        time.sleep(SCHEDULER_S)
    return 1.0

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)
    def on_before_optimizer_step(self, optimizer):
        if LOG_GRAD_NORM:  # the recipe the hygiene warning names (docs/trainers.md): Lightning computes none
            norm = float(torch.nn.utils.get_total_norm([p.grad for p in self.parameters()]))
            norms.append(norm)
            traceml.log(grad_norm=norm)
    def configure_optimizers(self):
        if MODE == "lbfgs":  # its closure evaluates training_step several times per micro-batch
            return torch.optim.LBFGS(self.parameters(), lr=0.1, max_iter=4)
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, slow_factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

batch_losses = []

class SlowBatchEnd(L.Callback):  # what a checkpoint save at the batch end costs
    def on_train_batch_end(self, trainer, module, outputs, *args):
        batch_losses.append(float(outputs["loss"]))  # what Lightning hands the batch end
        time.sleep(BATCH_END_S)

torch.manual_seed(0)
x = torch.randn(32, 4)
def fit():
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=ACCUMULATE,
                        callbacks=[TraceMLCallback(), SlowBatchEnd()])
    trainer.fit(Net(), DataLoader(TensorDataset(x, x[:, :1]), batch_size=4))
fit()
if MODE == "two-fits":  # other work, then a second fit in the same process (the same session)
    time.sleep(0.5)
    fit()
traceml.finish()
print(json.dumps({"path": str(traceml.current_run().path), "norms": norms, "batch_losses": batch_losses}))
"""


ACCUMULATIONS = (1, 2)


def _plan(tmp_path_factory):
    plan, folders = {}, {}
    for accumulate in ACCUMULATIONS:
        folder = folders[accumulate] = tmp_path_factory.mktemp(f"update-end-{accumulate}")
        (folder / "fit.py").write_text(_FIT)
        plan[f"accumulate-{accumulate}"] = integrations_support.Fit(
            folder / "fit.py", folder, (str(SCHEDULER_S), str(BATCH_END_S), str(accumulate)))
    folder = folders["grad-norm"] = tmp_path_factory.mktemp("update-end-grad-norm")
    (folder / "fit.py").write_text(_FIT)
    plan["grad-norm"] = integrations_support.Fit(folder / "fit.py", folder, ("0", "0", "1", "grad-norm"))
    for accumulate in ACCUMULATIONS:
        folder = folders[f"lbfgs-{accumulate}"] = tmp_path_factory.mktemp(f"update-end-lbfgs-{accumulate}")
        (folder / "fit.py").write_text(_FIT)
        plan[f"lbfgs-{accumulate}"] = integrations_support.Fit(folder / "fit.py", folder,
                                                               ("0", "0", str(accumulate), "lbfgs"))
    folder = folders["two-fits"] = tmp_path_factory.mktemp("update-end-two-fits")
    (folder / "fit.py").write_text(_FIT)
    plan["two-fits"] = integrations_support.Fit(folder / "fit.py", folder, ("0", "0", "1", "two-fits"))
    return plan, folders


if importlib.util.find_spec("lightning") is not None:
    integrations_support.register(__name__.rpartition(".")[2], _plan)


@pytest.fixture(scope="module")
def fits(request):
    procs, folders = integrations_support.runs(__name__.rpartition(".")[2], request)
    out = {accumulate: (procs[f"accumulate-{accumulate}"], folders[accumulate]) for accumulate in ACCUMULATIONS}
    for name in ("grad-norm", "two-fits", *(f"lbfgs-{a}" for a in ACCUMULATIONS)):
        out[name] = (procs[name], folders[name])
    return out


@pytest.mark.slow
@needs_lightning
@pytest.mark.xdist_group(integrations_support.GROUP)  # one worker runs the trainer runs, once
@pytest.mark.parametrize("accumulate", ACCUMULATIONS)
def test_the_scheduler_step_is_in_the_update_and_the_batch_end_hooks_are_not(fits, accumulate) -> None:
    done, folder = fits[accumulate]
    assert done.returncode == 0, done.stderr[-3000:]
    path = folder / json.loads(done.stdout.strip().splitlines()[-1])["path"]
    rows = [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "step"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        cpu = r["cpu_ms"]
        # the scheduler step (once per update, right after its optimizer_step) is in the optimizer part ...
        assert cpu["optimizer"] >= SCHEDULER_S * 1000
        # ... the batch end that follows is not (it sleeps longer than the scheduler)
        assert cpu["optimizer"] < (SCHEDULER_S + BATCH_END_S) * 1000
        assert cpu["forward"] > 0 and cpu["backward"] > 0
        assert cpu["forward"] + cpu["backward"] + cpu["optimizer"] <= cpu["step"]
        # an earlier micro-batch's batch end is inside its update (the micro-batches fold into the update)
        assert cpu["step"] - cpu["optimizer"] >= (accumulate - 1) * BATCH_END_S * 1000
    # the last micro-batch's batch end runs between updates: in the gap before the next update
    for r in rows[1:]:
        assert r["cpu_ms"]["input_wait"] >= BATCH_END_S * 1000


@pytest.mark.slow
@needs_lightning
@pytest.mark.xdist_group(integrations_support.GROUP)
def test_a_gradient_norm_logged_in_on_before_optimizer_step_is_on_its_updates_record(fits) -> None:
    """Lightning computes no gradient norm; the hygiene warning tells a script to log one in the module's
    ``on_before_optimizer_step`` (hygiene/warnings.py): each value lands on the record of the update it was
    computed in."""
    done, folder = fits["grad-norm"]
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    rows = [r for r in map(json.loads, (folder / out["path"]).read_text().splitlines()) if r["kind"] == "step"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert len(out["norms"]) == 3 and all(n > 0 for n in out["norms"])
    assert [r["grad_norm"] for r in rows] == out["norms"]
    assert all(r["loss"] is not None and r["lr"] == 0.1 for r in rows)  # the integration's figures are kept


@pytest.mark.slow
@needs_lightning
@pytest.mark.xdist_group(integrations_support.GROUP)
def test_a_second_fit_in_the_process_does_not_count_the_time_between_fits_as_input_wait(fits) -> None:
    """Two fits, 0.5 s of other work between them: the second fit's first update has no input wait (as the
    first fit's first update), not the gap since the first fit's last update; steps and examples count on."""
    done, folder = fits["two-fits"]
    assert done.returncode == 0, done.stderr[-3000:]
    path = folder / json.loads(done.stdout.strip().splitlines()[-1])["path"]
    rows = [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "step"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0]["cpu_ms"]["input_wait"] is None and rows[3]["cpu_ms"]["input_wait"] is None
    assert all(r["cpu_ms"]["input_wait"] is not None and r["cpu_ms"]["input_wait"] < 400 for r in rows[1:3] + rows[4:])
    assert [r["examples"] for r in rows] == [4, 8, 12, 16, 20, 24]


@pytest.mark.slow
@needs_lightning
@pytest.mark.xdist_group(integrations_support.GROUP)
@pytest.mark.parametrize("accumulate", ACCUMULATIONS)
def test_an_lbfgs_updates_loss_is_what_lightning_hands_the_batch_end(fits, accumulate) -> None:
    """LBFGS's closure evaluates ``training_step`` several times for one micro-batch; the update's loss is the
    last evaluation of each micro-batch (what Lightning hands the batch end), summed over the update's
    micro-batches — not the sum of every evaluation (found by an independent review: 4–5× the loss)."""
    done, folder = fits[f"lbfgs-{accumulate}"]
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    rows = [r for r in map(json.loads, (folder / out["path"]).read_text().splitlines()) if r["kind"] == "step"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    batch = out["batch_losses"]
    assert len(batch) == 3 * accumulate
    want = [sum(batch[i * accumulate:(i + 1) * accumulate]) for i in range(3)]
    assert [r["loss"] for r in rows] == pytest.approx(want, rel=1e-6)
