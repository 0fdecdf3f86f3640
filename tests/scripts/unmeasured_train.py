"""Tiny CPU training that names the streams it does not measure (tests/test_unmeasured.py).

Under `traceml run --nproc-per-node 2` it trains a 2-rank gloo DDP model (one
process without a process group otherwise), as an integration that cannot
measure everything would: it calls ``traceml.report_unmeasured`` *before*
anything else of traceml (the call starts the session), traces each step
without its model (so forward, backward and optimizer really are unmeasured),
and reports every stream twice (the second report must add nothing).

    --steps N                   steps to train (default 6)
    --report STREAM REASON      report this stream as unmeasured on every rank (repeatable)
    --report-rank1 STREAM REASON   the same, on rank 1 only (repeatable)
"""

from __future__ import annotations

import argparse
import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import traceml_tui as traceml


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--report", nargs=2, action="append", default=[], metavar=("STREAM", "REASON"))
    parser.add_argument("--report-rank1", nargs=2, action="append", default=[], metavar=("STREAM", "REASON"))
    args = parser.parse_args()

    torch.set_num_threads(1)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank() if distributed else 0
    reports = list(args.report) + (list(args.report_rank1) if rank == 1 else [])
    for _ in range(2):
        for stream, reason in reports:
            traceml.report_unmeasured(stream, reason)

    torch.manual_seed(1234 + rank)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    if distributed:
        model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(args.steps):
        x = torch.randn(8, 8)
        with traceml.trace_step():  # no model: the phases are not split
            optimizer.zero_grad(set_to_none=True)
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            traceml.log(loss=loss, batch_size=8)
    if distributed:
        del model, optimizer  # free DDP's reducer before the group (see ddp_train.py)
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
