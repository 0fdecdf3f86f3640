"""Tiny hygiene training for tests/support/realruns.py: publishes checkpoints, never validates inline.

Run with `traceml run` from a folder whose traceml.yaml has a `hygiene:` block:
every `hygiene.validation.cadence` updates (and at `first_evaluation` 0, the
initialization) it publishes the model state with `traceml.publish_checkpoint`.
No dispatcher: the harness drives `traceml validate drain` itself afterwards.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

import traceml_tui as traceml
from traceml_tui.hygiene.dispatch import load_effective_hygiene


def r2(pred: torch.Tensor, target: torch.Tensor) -> float:
    residual = torch.sum((pred - target) ** 2)
    total = torch.sum((target - target.mean()) ** 2)
    return float(1.0 - residual / total)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-publish", action="store_true", help="train without publishing any checkpoint")
    parser.add_argument("--early-stopping", action="store_true",
                        help="consult the declared early stopping after every update (never waits for validation)")
    args = parser.parse_args()

    session = traceml.init()
    hygiene = load_effective_hygiene(Path(session.run_dir))
    if hygiene is None:
        print("hygiene_train.py: run it with `traceml run` next to a traceml.yaml with a hygiene block", file=sys.stderr)
        return 2
    cadence = hygiene["validation"]["cadence"]
    first = hygiene["validation"]["first_evaluation"]

    torch.manual_seed(0)
    torch.set_num_threads(1)
    true_w = torch.randn(8, 1, generator=torch.Generator().manual_seed(3))
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    stopper = None
    if args.early_stopping:
        from traceml_tui.hygiene import EarlyStopping

        stopper = EarlyStopping.from_config(Path(session.run_dir), hygiene)
    if first == 0 and not args.no_publish:
        traceml.publish_checkpoint(model.state_dict(), step=0)
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 8)
        y = x @ true_w
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            pred = model(x)
            loss = nn.functional.mse_loss(pred, y)
            loss.backward()
            optimizer.step()
            traceml.log(loss=loss, lr=0.05, batch_size=32, components={"mse": (loss, y)},
                        metrics={"r2": r2(pred.detach(), y)})
        if step >= first and step % cadence == 0 and not args.no_publish:
            traceml.publish_checkpoint(model.state_dict(), step=step)
        if stopper is not None and stopper.should_stop(step):
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
