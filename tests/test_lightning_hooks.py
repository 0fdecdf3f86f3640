"""The Lightning callback costs Lightning no callback dispatch per update (docs/trainers.md "Overhead").

The update is timed by wrappers on the LightningModule's own methods; the callback's batch hooks are set to
None for the fit, and its unused per-batch hooks on the class, only where Lightning's dispatcher skips a
hook that is not callable; a Lightning whose dispatcher would call it keeps them callable (fail open).
Lightning is imported only in the process of a real fit (its import costs seconds): the fit is one of the
trainer runs' one-process fits (tests/support/integrations.py ``Fit``: a forked child of the one process
that imported Lightning, started through the bootstrap, whose import hook adds nothing to a trainer that
has the callback already).
"""

import importlib.util
import json

import pytest

from traceml_tui.integrations import lightning as pl_adapter

from support import integrations as integrations_support

needs_lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                     reason="the lightning extra is not installed")


def test_an_unknown_dispatcher_keeps_the_hooks_callable() -> None:
    assert not pl_adapter._dispatcher_skips_none("json")  # no trainer/call.py: keep every hook callable


_FIT = r"""
import json, sys
import torch, lightning.pytorch as L
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import traceml_tui as traceml
from traceml_tui.integrations.lightning import TraceMLCallback

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"loss": nn.functional.mse_loss(self.net(x), y)}
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

tracer = TraceMLCallback()
seen = {"dispatched": set(), "outputs": []}

class Probe(L.Callback):
    # what Lightning would dispatch to the tracer, and the loss it hands the batch end
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        seen["dispatched"].update(h for h in ("on_train_batch_start", "on_before_optimizer_step",
                                              "on_train_batch_end") if callable(getattr(tracer, h)))
        seen["outputs"].append(outputs["loss"].item())

torch.manual_seed(0)
x = torch.randn(48, 4)
trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=3,
                    callbacks=[tracer, Probe()])
model = Net()
trainer.fit(model, DataLoader(TensorDataset(x, x[:, :1]), batch_size=4))
traceml.finish()
from traceml_tui.integrations import lightning as adapter
print(json.dumps({"skips_none": adapter._dispatcher_skips_none("lightning.pytorch"),
                  "callback_subclass": issubclass(type(tracer), L.Callback),
                  "class_hooks": [getattr(type(tracer), h) for h in adapter._SKIPPED_HOOKS],
                  "dispatched": sorted(seen["dispatched"]), "outputs": seen["outputs"],
                  "wrapped_after": sorted(k for k in vars(model) if k in ("training_step", "optimizer_step")),
                  "hooks_after": [callable(getattr(tracer, h)) for h in ("on_train_batch_start", "on_train_batch_end")],
                  "path": str(traceml.current_run().path)}))
"""


def _plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lightning-hooks")
    (folder / "fit.py").write_text(_FIT)
    return {"fit": integrations_support.Fit(folder / "fit.py", folder)}, folder


if importlib.util.find_spec("lightning") is not None:
    integrations_support.register(__name__.rpartition(".")[2], _plan)


@pytest.fixture(scope="module")
def fit(request):
    procs, folder = integrations_support.runs(__name__.rpartition(".")[2], request)
    return procs["fit"], folder


@pytest.mark.slow
@needs_lightning
@pytest.mark.xdist_group(integrations_support.GROUP)  # one worker runs the trainer runs, once
def test_a_fit_dispatches_no_batch_hook_to_the_callback_and_records_what_lightning_reports(fit) -> None:
    """The installed dispatcher skips a hook that is not callable, so the unused per-batch hooks are None on the
    class; the update is timed by the module's wrappers: no callback batch hook is dispatched, and the records
    hold Lightning's own batch-end losses summed over each accumulated update (3 micro-batches), every part
    measured."""
    done, folder = fit
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["skips_none"] and got["callback_subclass"] and got["class_hooks"] == [None] * 3
    assert got["dispatched"] == []
    assert got["wrapped_after"] == [] and got["hooks_after"] == [True, True]  # undone at teardown
    rows = [r for r in map(json.loads, (folder / got["path"]).read_text().splitlines()) if r["kind"] == "step"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    outputs = got["outputs"]
    assert len(outputs) == 12
    for r in rows:
        assert r["loss"] == pytest.approx(sum(outputs[3 * (r["step"] - 1): 3 * r["step"]]), rel=1e-6)
        assert r["lr"] == 0.1 and r["examples"] == 12 * r["step"]
        assert all(r["cpu_ms"][p] > 0 for p in ("step", "forward", "backward", "optimizer"))
        assert r["cpu_ms"]["forward"] + r["cpu_ms"]["backward"] + r["cpu_ms"]["optimizer"] <= r["cpu_ms"]["step"]
