"""A tiny Lightning fit with no traceml code: a 2-layer MLP on a synthetic regression, CPU.

Under `traceml run` every rank is recorded automatically (docs/trainers.md):

    OMP_NUM_THREADS=1 traceml run train.py --nproc-per-node 2 --run-name lightning-demo

Pass the same device count to Lightning as `--nproc-per-node` (this script reads WORLD_SIZE): then
torchrun, not Lightning, starts the ranks. One step record per optimizer update, eval records at
every validation, and with the `hygiene:` block of traceml.yaml every checkpoint file in the backlog.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Optional

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def data(count: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 16, generator=generator)
    weights = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
    return TensorDataset(x, x @ weights + 0.1 * torch.randn(count, 1, generator=generator))


def build(argv: Optional[list[str]] = None, callbacks: Optional[list[Any]] = None) -> tuple[L.Trainer, Regressor, Any, Any]:
    """Trainer, module and loaders of this example (``callbacks``: extra ones, e.g. traceml's explicit callback)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=10, help="validate and checkpoint every N updates")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    checkpoint = ModelCheckpoint(dirpath=args.checkpoint_dir, every_n_train_steps=args.every, save_top_k=-1)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        val_check_interval=args.every,
        limit_val_batches=2,
        num_sanity_val_steps=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoint, *(callbacks or [])],
    )
    train = DataLoader(data(4096, 1), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(data(64, 2), batch_size=32)
    return trainer, Regressor(), train, val


if __name__ == "__main__":
    trainer, model, train, val = build()
    trainer.fit(model, train, val)
