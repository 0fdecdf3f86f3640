"""Single-process training traced by traceml (runs directly, no torch.distributed).

    traceml run examples/single/train_single.py --run-name single-demo --args --steps 50
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import traceml_tui as traceml


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    true_w = torch.randn(16, 1)
    for _ in range(args.steps):
        x = torch.randn(64, 16)
        y = torch.sin(x @ true_w)
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            traceml.log(loss=loss, lr=1e-2, batch_size=64, components={"mse": (loss, y)})


if __name__ == "__main__":
    main()
