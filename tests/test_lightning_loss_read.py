"""A CPU loss is read as ``training_step`` returns it, the record's loss unchanged (docs/trainers.md "Overhead").

Under Lightning, the loss of an update without gradient accumulation, on CPU, is read at the end of the
``training_step`` wrapper (torch's dispatch is warm there) instead of when the record is written, so the
update does not hold the loss tensor and its autograd graph until it ends. The record's loss must be exactly
the float Lightning hands the batch end. A real fit, one of the trainer runs' one-process fits
(tests/support/integrations.py ``Fit``: a forked child of the one process that imported Lightning).
"""

import importlib.util
import json

import pytest

from support import integrations as integrations_support

needs_lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                     reason="the lightning extra is not installed")

_FIT = r"""
import json
import torch, lightning.pytorch as L
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import traceml_tui as traceml
from traceml_tui.integrations.lightning import TraceMLCallback

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

tracer = TraceMLCallback()
seen = {"held": [], "outputs": []}

class Probe(L.Callback):
    def on_before_backward(self, trainer, pl_module, loss):
        # after training_step returned, before backward: what the open update holds as its loss
        seen["held"].append(type(tracer._loss).__name__)
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        seen["outputs"].append(outputs["loss"].item())  # what Lightning hands the batch end

torch.manual_seed(0)
x = torch.randn(40, 4)
trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, callbacks=[tracer, Probe()])
trainer.fit(Net(), DataLoader(TensorDataset(x, x[:, :1] * 3.0), batch_size=4))
traceml.finish()
print(json.dumps({**seen, "path": str(traceml.current_run().path)}))
"""


def _plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loss-read")
    (folder / "fit.py").write_text(_FIT)
    return {"fit": integrations_support.Fit(folder / "fit.py", folder)}, folder


if importlib.util.find_spec("lightning") is not None:
    integrations_support.register(__name__.rpartition(".")[2], _plan)


@pytest.mark.slow
@needs_lightning
@pytest.mark.xdist_group(integrations_support.GROUP)  # one worker runs the trainer runs, once
def test_a_cpu_loss_is_read_at_the_forward_end_and_recorded_as_lightning_reports_it(request) -> None:
    procs, folder = integrations_support.runs(__name__.rpartition(".")[2], request)
    done = procs["fit"]
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["held"] == ["float"] * 6  # a number, not the tensor with its graph
    rows = [r for r in map(json.loads, (folder / got["path"]).read_text().splitlines()) if r["kind"] == "step"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in rows] == got["outputs"]  # the same float, not an approximation
    assert len(set(got["outputs"])) > 1  # the updates trained: each record has its own update's loss
