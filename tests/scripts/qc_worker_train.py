"""Tiny 2-rank gloo DDP training that publishes checkpoints for validation and heavy QC (docs/qc.md).

Run with `traceml run --nproc-per-node 2` next to a traceml.yaml whose `hygiene.qc` requires
`worker_qc`: at initialization (update 0) and every `hygiene.validation.cadence` updates rank 0
publishes the model state with `traceml.publish_checkpoint`; the launcher writes the QC requests
of the QC points and drains both backlogs (tests/test_qc_worker_run.py).
"""

from __future__ import annotations

import argparse
import gc
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import traceml_tui as traceml
from traceml_tui.hygiene.dispatch import load_effective_hygiene


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    torch.set_num_threads(1)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    net = DDP(model) if distributed else model
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    true_w = torch.randn(8, 1, generator=torch.Generator().manual_seed(3))

    session = traceml.init()
    cadence = load_effective_hygiene(Path(session.run_dir))["validation"]["cadence"]
    traceml.publish_checkpoint(model.state_dict(), step=0)  # initialization: a QC point
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 8)
        y = x @ true_w
        with traceml.trace_step(net):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            optimizer.step()
            traceml.log(loss=loss, lr=0.05, batch_size=16)
        if step % cadence == 0:
            traceml.publish_checkpoint(model.state_dict(), step=step)
    if distributed:
        del net, model, optimizer
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
