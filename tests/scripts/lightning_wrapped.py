"""A Lightning fit whose training_step also wraps its work in ``traceml.trace_step`` (as a hand-written loop
would), and whose validation_step calls training_step (a common pattern), run with the callback the bootstrap
attaches, validating every 3 updates and in the sanity check: the run is traced once (docs/trainers.md)."""

import sys

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import traceml_tui as traceml


class Wrapped(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        x, y = batch
        with traceml.trace_step(self):  # inside the update the callback traces: ignored
            loss = nn.functional.mse_loss(self.net(x), y)
        return loss

    def validation_step(self, batch, batch_idx):  # noqa: ANN001
        return self.training_step(batch, batch_idx)  # in validation: no step either

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
data = TensorDataset(x, x.sum(1, keepdim=True))
trainer = L.Trainer(max_steps=int(sys.argv[1]), accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, val_check_interval=3, limit_val_batches=3)
trainer.fit(Wrapped(), DataLoader(data, batch_size=16), DataLoader(data, batch_size=16))
