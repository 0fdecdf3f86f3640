"""A tiny deterministic CPU training for the recovery tests (tests/test_recovery.py).

Shuffled DataLoader with a seeded generator (8 batches an epoch), dropout (torch's
global RNG), Python and NumPy noise, SGD with momentum and a step scheduler: every
source of state a resume must restore. It records its split with
``traceml.record_split``, restores the newest recovery save when there is one and
calls ``traceml.save_recovery`` after every update (the declared cadence decides).
The position in the epoch is saved with the loader generator's state at the
epoch's start, so a resumed attempt replays the same batches from the same place.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import traceml_tui as traceml

SAMPLES = 160  # 128 train + 32 validation
BATCH = 16


def split_members(variant: str) -> tuple[list[int], list[int]]:
    """(train, validation) indices: a fixed permutation; ``shifted`` is the "changed split code"."""
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(11)).tolist()
    if variant == "shifted":
        order = order[1:] + order[:1]
    return order[:128], order[128:]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds after each update (time to interrupt)")
    parser.add_argument("--split", default="base", choices=("base", "shifted"))
    parser.add_argument("--final", default=None, help="write the final model state here")
    args = parser.parse_args()

    traceml.init()
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)

    train_ids, val_ids = split_members(args.split)
    policy = "fixed permutation of 160 samples (seed 11): the first 128 train, the rest validation"
    traceml.record_split("train", train_ids, policy=policy)
    traceml.record_split("val", val_ids, policy=policy)

    data_gen = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=data_gen)
    y = x @ torch.randn(8, 1, generator=data_gen) + 0.1 * torch.randn(SAMPLES, 1, generator=data_gen)
    train = TensorDataset(x[train_ids], y[train_ids])
    loader_gen = torch.Generator().manual_seed(7)
    loader = DataLoader(train, batch_size=BATCH, shuffle=True, generator=loader_gen)

    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)

    step, skip = 0, 0
    epoch_state = loader_gen.get_state()
    restored = traceml.restore_recovery(model=model, optimizer=optimizer, scheduler=scheduler)
    if restored is not None:
        step, skip, epoch_state = restored.step, restored.extras["in_epoch"], restored.extras["epoch_gen"]
        print(f"resume_train.py: restored update {step}", file=sys.stderr)
    while step < args.steps:
        if skip:
            loader_gen.set_state(epoch_state)  # replay this epoch's shuffle, then skip what was consumed
        else:
            epoch_state = loader_gen.get_state()
        batches = iter(loader)
        for _ in range(skip):
            next(batches)
        in_epoch, skip = skip, 0
        for xb, yb in batches:
            jitter = 1e-3 * random.random() + 1e-3 * float(np.random.rand())
            with traceml.trace_step(model):
                optimizer.zero_grad(set_to_none=True)
                loss = nn.functional.mse_loss(model(xb) + jitter, yb)
                loss.backward()
                optimizer.step()
                traceml.log(loss=loss, lr=scheduler.get_last_lr()[0], grad_norm="auto", batch_size=BATCH)
            scheduler.step()
            step += 1
            in_epoch += 1
            traceml.save_recovery(model=model, optimizer=optimizer, scheduler=scheduler,
                                  extras={"epoch_gen": epoch_state, "in_epoch": in_epoch})
            if args.sleep:
                time.sleep(args.sleep)
            if step >= args.steps:
                break
    if args.final:
        torch.save(model.state_dict(), args.final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
