"""Validation worker for the Hugging Face example: loads a published `checkpoint-N/` folder, prints metrics.

`traceml validate drain` runs it with `--checkpoint <folder>`; the last stdout line is a JSON object of metrics.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from train import Tokens
from transformers import GPT2LMHeadModel

parser = argparse.ArgumentParser()
parser.add_argument("--checkpoint", required=True)
args = parser.parse_args()
model = GPT2LMHeadModel.from_pretrained(args.checkpoint).eval()
batch = Tokens(64, 3)[:]
with torch.no_grad():
    loss = float(model(input_ids=batch["input_ids"], labels=batch["labels"]).loss)
print(json.dumps({"loss": loss, "perplexity": math.exp(loss)}))
