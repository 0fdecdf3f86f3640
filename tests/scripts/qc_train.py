"""Tiny 2-rank gloo DDP training that records QC but never its batch grid (tests/test_qc_required_run.py).

Run with `traceml run --nproc-per-node 2` next to a traceml.yaml whose `hygiene.qc`
block requires batch_grid, field_stats and galleries: at the declared QC cadence
(and at initialization) it records the hidden layer's activations as a latent
field and a two-group exemplar gallery of its inputs; it never calls
`traceml.log_batch_grid`, so the run's summary must name that item as missing.
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
    args = parser.parse_args()

    torch.set_num_threads(1)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(1234 + rank)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    net = DDP(model) if distributed else model
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    true_w = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
    # the fixed QC roster: 20 "high" and 16 "low" sources, each a 4 x 4 picture of its input
    roster = torch.randn(36, 16, generator=torch.Generator().manual_seed(11))

    traceml.init()
    for step in range(0, args.steps + 1):
        if step:
            x = torch.randn(16, 16)
            y = x @ true_w
            with traceml.trace_step(net):
                optimizer.zero_grad(set_to_none=True)
                loss = nn.functional.mse_loss(net(x), y)
                loss.backward()
                optimizer.step()
                traceml.log(loss=loss, lr=0.05, grad_norm="auto", batch_size=16, components={"mse": (loss, y)})
        with torch.no_grad():
            hidden = model[1](model[0](roster))
        traceml.log_field_stats("hidden", hidden, step=step)
        scores = hidden.mean(dim=1)
        groups = {"high": [(f"src-{i:02d}", roster[i].reshape(4, 4).numpy(), float(scores[i])) for i in range(20)],
                  "low": [(f"src-{i:02d}", roster[i].reshape(4, 4).numpy(), float(scores[i])) for i in range(20, 36)]}
        traceml.log_gallery(groups, name="roster", step=step, selection="the fixed roster, split by index")
    if distributed:
        del net, model, optimizer
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
