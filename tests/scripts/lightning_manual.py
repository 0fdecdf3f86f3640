"""A Lightning fit with manual optimization and no traceml code: training_step runs backward and the
optimizer itself, so traceml cannot split the step (docs/trainers.md, "Limits")."""

import sys

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Manual(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        optimizer = self.optimizers()
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
trainer = L.Trainer(max_steps=int(sys.argv[1]), accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Manual(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16))
