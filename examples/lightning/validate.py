"""Validation worker for the Lightning example: loads a published checkpoint file, prints metrics.

`traceml validate drain` runs it with `--checkpoint <file>`; the last stdout line is a JSON object of metrics.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from train import Regressor, data

parser = argparse.ArgumentParser()
parser.add_argument("--checkpoint", required=True)
args = parser.parse_args()
model = Regressor.load_from_checkpoint(args.checkpoint, map_location="cpu").eval()
x, y = data(256, 3)[:]
with torch.no_grad():
    mse = float(nn.functional.mse_loss(model.net(x), y))
print(json.dumps({"loss": mse}))
