"""Per-step cost of the trainer integrations (docs/trainers.md) vs the same trainer without traceml.

A tiny Hugging Face ``Trainer`` (GPT-2 from a small config) and a tiny Lightning
fit, each trained repeatedly in this process, alternating without and with
traceml's callback (the order flips every pair). A plain timing callback notes
the end of every update in both; a run's step time is the median interval
between update ends (the first few updates skipped). The overhead is the median
over pairs of (with − without), printed in µs and as a share of the step.

Clock: the CPU time of the training thread (``time.thread_time``; one torch
thread, no loader workers, so all of a step's work — the trainer's and
traceml's — runs there). On a shared machine wall-clock intervals mostly
measure the neighbours' load; the wall-clock figures are printed beside.
For Lightning an empty ``Callback`` is measured the same way, as a reference:
Lightning calls every hook of every callback, so that much is the price of any
callback at all.

Budget (the design's "trainer integration overhead ≤ 2 % of a step"): at most
2 % of the step or 30 µs, whichever is larger.

    python tests/benchmarks/bench_trainers.py [--pairs 6] [--only hf|lightning]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Callable

WARMUP = 5
BUDGET_SHARE, BUDGET_US = 0.02, 30.0


def step_time(ends: list[tuple[float, float]]) -> tuple[float, float]:
    """(CPU, wall) median seconds between update ends, the first WARMUP updates skipped."""
    cpu = [b[0] - a[0] for a, b in zip(ends, ends[1:])][WARMUP:]
    wall = [b[1] - a[1] for a, b in zip(ends, ends[1:])][WARMUP:]
    return statistics.median(cpu), statistics.median(wall)


def hf_run() -> Callable[[bool, int], tuple[float, float]]:
    import torch
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    import traceml_tui as traceml
    from traceml_tui.integrations.hf import TraceMLCallback

    class Tokens(Dataset):
        def __init__(self) -> None:
            self.ids = torch.randint(0, 128, (4096, 16), generator=torch.Generator().manual_seed(1))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[tuple[float, float]] = []

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            self.ends.append((time.thread_time(), time.perf_counter()))

    config = GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    data = Tokens()

    def run(traced: bool, steps: int) -> float:
        torch.manual_seed(0)
        clock = Clock()
        args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to="none", disable_tqdm=True,
                                 per_device_train_batch_size=8, gradient_accumulation_steps=2, max_steps=steps,
                                 save_strategy="no", logging_strategy="no", eval_strategy="no")
        callbacks = [clock, TraceMLCallback()] if traced else [clock]
        Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data, callbacks=callbacks).train()
        if traced:
            traceml.finish()  # the next untraced run finds no active session: loader timing passes through
        return step_time(clock.ends)

    return run


def lightning_run() -> Callable[[bool, int], tuple[float, float]]:
    import lightning.pytorch as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import traceml_tui as traceml
    from traceml_tui.integrations.lightning import TraceMLCallback

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 1))

        def training_step(self, batch, batch_idx):  # noqa: ANN001
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Clock(L.Callback):
        def __init__(self) -> None:
            self.ends: list[tuple[float, float]] = []

        def on_train_batch_end(self, *args):  # noqa: ANN002
            self.ends.append((time.thread_time(), time.perf_counter()))

    x = torch.randn(8192, 32, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=64)

    def run(traced: "bool | str", steps: int) -> tuple[float, float]:
        torch.manual_seed(0)
        clock = Clock()
        extra = {True: [TraceMLCallback()], "empty": [L.Callback()]}.get(traced, [])
        callbacks = [clock, *extra]
        trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
        trainer.fit(Net(), loader)
        if traced is True:
            traceml.finish()
        return step_time(clock.ends)

    return run


def measure(name: str, run: Callable[[bool, int], tuple[float, float]], pairs: int, steps: int) -> bool:
    run(False, steps)  # warm-up: imports, first-call costs
    got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for i in range(pairs):
        for flag in ((False, True) if i % 2 == 0 else (True, False)):
            got[flag].append(run(flag, steps))
    ok = True
    for clock, index in (("CPU", 0), ("wall", 1)):
        bare = [t[index] for t in got[False]]
        traced = [t[index] for t in got[True]]
        base = statistics.median(bare)
        overhead = statistics.median([t - b for b, t in zip(bare, traced)])
        budget_us = max(BUDGET_SHARE * base * 1e6, BUDGET_US)
        verdict = "ok" if overhead * 1e6 <= budget_us else "OVER"
        if clock == "CPU":
            ok = verdict == "ok"
        print(f"{name} {clock:>4}: step without traceml {base * 1e3:8.3f} ms · with "
              f"{statistics.median(traced) * 1e3:8.3f} ms · overhead {overhead * 1e6:8.1f} µs/step = "
              f"{overhead / base * 100:6.2f} % of the step (budget {budget_us:.0f} µs: {verdict})")
    print(f"  {pairs} pairs × {steps} updates; the budget is judged on the CPU clock")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--hf-steps", type=int, default=80, help="updates per Hugging Face run")
    parser.add_argument("--lightning-steps", type=int, default=400, help="updates per Lightning run")
    parser.add_argument("--only", choices=("hf", "lightning"))
    args = parser.parse_args()
    os.environ["TRACEML_RUN_DIR"] = os.path.join(tempfile.mkdtemp(prefix="traceml-bench-"), "run")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    ok = True
    if args.only in (None, "hf"):
        ok &= measure("HF Trainer", hf_run(), args.pairs, args.hf_steps)
    if args.only in (None, "lightning"):
        run = lightning_run()
        ok &= measure("Lightning", run, args.pairs, args.lightning_steps)
        # Reference: what any extra callback costs (Lightning dispatches every hook to every callback).
        measure("Lightning, an empty Callback (reference)", lambda flag, steps: run("empty" if flag else False, steps),
                args.pairs, args.lightning_steps)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
