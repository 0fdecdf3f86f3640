"""A tiny Hugging Face Trainer run with no traceml code: GPT-2 from a small config, CPU, no downloads.

Under `traceml run` every rank is recorded automatically (docs/trainers.md):

    OMP_NUM_THREADS=1 traceml run train.py --nproc-per-node 2 --run-name hf-demo

One step record per optimizer update (gradient accumulation 2), eval records every 10 updates,
and with the `hygiene:` block of traceml.yaml every saved `checkpoint-N/` folder in the validation backlog.
"""

from __future__ import annotations

import argparse
import gc
from typing import Any, Optional

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(Dataset):
    """Random token sequences; the labels are the inputs (causal language modelling)."""

    def __init__(self, count: int, seed: int, length: int = 16, vocab: int = 128) -> None:
        self.ids = torch.randint(0, vocab, (count, length), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def build_trainer(argv: Optional[list[str]] = None, callbacks: Optional[list[Any]] = None) -> Trainer:
    """The Trainer of this example (``callbacks``: extra callbacks, e.g. traceml's explicit one)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=20, help="optimizer updates")
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4, help="per device, per micro-batch")
    parser.add_argument("--every", type=int, default=10, help="evaluate and save every N updates")
    parser.add_argument("--output-dir", default="hf-output")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    training = TrainingArguments(
        output_dir=args.output_dir,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=8,
        gradient_accumulation_steps=args.grad_accum,
        max_steps=args.max_steps,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        eval_strategy="steps",
        eval_steps=args.every,
        save_strategy="steps",
        save_steps=args.every,
        logging_steps=args.every,
        dataloader_num_workers=0,
        seed=0,
    )
    return Trainer(model=GPT2LMHeadModel(config), args=training, train_dataset=Tokens(4096, 1),
                   eval_dataset=Tokens(16, 2), callbacks=callbacks)


def main(argv: Optional[list[str]] = None, callbacks: Optional[list[Any]] = None) -> None:
    """Train, then take the process group down (``argv``, ``callbacks``: as :func:`build_trainer`)."""
    trainer = build_trainer(argv, callbacks)
    trainer.train()
    if torch.distributed.is_initialized():
        # Free the DDP model before its process group goes: a DDP model still alive when the group is
        # destroyed at interpreter exit can abort the rank in gloo's teardown (torch 2.13 CPU, now and then).
        del trainer
        gc.collect()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
