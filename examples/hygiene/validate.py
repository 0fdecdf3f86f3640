"""Validation worker for the hygiene example: one checkpoint in, metrics JSON out.

    python validate.py --checkpoint PATH

Run by `traceml validate drain` (never inline in training). Its LAST stdout line
is the metrics object the drainer turns into a receipt.
"""

from __future__ import annotations

import argparse
import json

import torch
from data import make_model, make_split, r2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = make_model()
    model.load_state_dict(torch.load(args.checkpoint, map_location="cpu"))
    model.eval()
    _, _, x_val, y_val = make_split()
    with torch.no_grad():
        pred = model(x_val)
        mse = float(torch.mean((pred - y_val) ** 2))
    ratio = mse / float(torch.mean(y_val**2))
    print(json.dumps({"r2": r2(pred, y_val), "mse": mse, "mse_ratio": ratio}))


if __name__ == "__main__":
    main()
