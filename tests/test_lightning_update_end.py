"""Where a Lightning update ends (docs/trainers.md, "What each step records").

The update is one optimizer update: its optimizer part runs from the module's
``on_before_optimizer_step`` through ``optimizer_step`` and the step-interval
scheduler step that Lightning runs right after it; the batch-end hooks that
follow (a checkpoint save, a slow callback), validation and the next fetch are
between steps (with gradient accumulation, the batch ends of the update's
earlier micro-batches are inside it). A real fit in a subprocess (Lightning's import costs seconds):
the scheduler and a batch-end callback each sleep a known time, and the
records show where each landed.
"""

import importlib.util
import json
import subprocess
import sys

import pytest

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
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, slow_factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

class SlowBatchEnd(L.Callback):  # what a checkpoint save at the batch end costs
    def on_train_batch_end(self, *args):
        time.sleep(BATCH_END_S)

torch.manual_seed(0)
x = torch.randn(32, 4)
trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=ACCUMULATE,
                    callbacks=[TraceMLCallback(), SlowBatchEnd()])
trainer.fit(Net(), DataLoader(TensorDataset(x, x[:, :1]), batch_size=4))
traceml.finish()
print(json.dumps({"path": str(traceml.current_run().path)}))
"""


@pytest.mark.slow
@needs_lightning
@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_scheduler_step_is_in_the_update_and_the_batch_end_hooks_are_not(tmp_path, cli_env, accumulate) -> None:
    done = subprocess.run([sys.executable, "-c", _FIT, str(SCHEDULER_S), str(BATCH_END_S), str(accumulate)],
                          cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    path = tmp_path / json.loads(done.stdout.strip().splitlines()[-1])["path"]
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
