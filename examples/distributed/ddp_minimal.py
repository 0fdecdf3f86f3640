"""Minimal CPU DDP training for the guard trial (seed 000 "Try the complete CPU DDP workflow").

    OMP_NUM_THREADS=1 traceml run examples/distributed/ddp_minimal.py \
        --run-name guard-reference --nproc-per-node 2 --args --steps 20
"""

from __future__ import annotations

import argparse
import gc
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import traceml_tui as traceml


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--extra-step-ms", type=float, default=0.0,
                        help="sleep this long inside every step: a slower candidate, to see the guard fail")
    args = parser.parse_args()

    distributed = "WORLD_SIZE" in __import__("os").environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(1234 + rank)

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    if distributed:
        model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    true_w = torch.randn(64, 1, generator=torch.Generator().manual_seed(7))

    traceml.init()
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, 64)
        y = x @ true_w + 0.1 * torch.randn(args.batch_size, 1)
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            if args.extra_step_ms > 0:
                time.sleep(args.extra_step_ms / 1000)
            traceml.log(loss=loss, lr=0.05, batch_size=args.batch_size, components={"mse": (loss, y)})
    if distributed:
        # Free the DDP model (and its gloo buckets) before the group goes: a DDP model still alive when the
        # process group is destroyed can abort the rank at interpreter exit ("terminate called without an
        # active exception", torch 2.13 CPU, ~1 run in 10).
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
