"""Two one-process Hugging Face Trainers with traceml's explicit callback, for tests/test_hf_phases.py.

1. ``Recording``: the stock ``training_step`` (it calls ``compute_loss`` and ``Accelerator.backward``), each
   micro-batch's output kept; a probe callback notes, at every update's end, how many forward hooks the model
   carries (traceml times the phases through the two methods: none).
2. ``OwnLoop``: a subclass whose ``training_step`` runs the model and ``loss.backward()`` itself, calling neither
   method: traceml times its phases through the model's hooks from its second update on (docs/trainers.md).

Prints one JSON line: the micro-batch outputs and the hook counts per update of each trainer.
"""

from __future__ import annotations

import json
import sys
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import traceml_tui as traceml
from traceml_tui.integrations.hf import TraceMLCallback

UPDATES, GRAD_ACCUM, BATCH = 4, 2, 4


class Tokens(Dataset):
    def __init__(self, count: int) -> None:
        self.ids = torch.randint(0, 128, (count, 16), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class Recording(Trainer):
    """The stock training_step; its outputs kept."""

    outputs: list[float]

    def training_step(self, model, inputs, num_items_in_batch=None):  # noqa: ANN001, ANN201
        out = super().training_step(model, inputs, num_items_in_batch)
        self.outputs.append(out.item())
        return out


class OwnLoop(Recording):
    """A training_step of its own: neither compute_loss nor Accelerator.backward."""

    def training_step(self, model, inputs, num_items_in_batch=None):  # noqa: ANN001, ANN201
        model.train()
        loss = model(**inputs).loss / self.args.gradient_accumulation_steps
        loss.backward()
        self.outputs.append(loss.item())
        return loss.detach()


class HookProbe(TrainerCallback):
    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):  # noqa: ANN001
        self.counts.append(len(model._forward_hooks) + len(model._forward_pre_hooks))


def train(cls: type) -> dict:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to="none", disable_tqdm=True,
                             per_device_train_batch_size=BATCH, gradient_accumulation_steps=GRAD_ACCUM,
                             max_steps=UPDATES, save_strategy="no", logging_strategy="no", eval_strategy="no")
    probe = HookProbe()
    trainer = cls(model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens(UPDATES * GRAD_ACCUM * BATCH),
                  callbacks=[TraceMLCallback(), probe])
    trainer.outputs = []
    trainer.train()
    return {"outputs": trainer.outputs, "hooks": probe.counts}


if __name__ == "__main__":
    traceml.init(sys.argv[1])
    json.dump({"stock": train(Recording), "own": train(OwnLoop)}, sys.stdout)
    print()
