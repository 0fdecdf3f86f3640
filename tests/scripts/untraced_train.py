"""Tiny CPU training with no traceml code at all (tests/test_no_step.py): what a new user's script looks like.

Under `traceml run --nproc-per-node 2` it trains a 2-rank gloo DDP model (one
process without a process group otherwise) and never imports traceml.

    --steps N        optimizer steps (default 4)
    --exit-code C    exit with code C after training (default 0)
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    if distributed:
        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    if distributed:
        model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(8, 8)).pow(2).mean().backward()
        optimizer.step()
    if distributed:
        del model, optimizer  # free DDP's reducer before the group (see ddp_train.py)
        gc.collect()
        dist.destroy_process_group()
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
