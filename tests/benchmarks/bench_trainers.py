"""Per-step cost of the trainer integrations (docs/trainers.md) vs the same trainer without traceml.

A tiny Hugging Face ``Trainer`` (GPT-2 from a small config) and a tiny Lightning
fit. Each trains once, long, in this process, and a switch callback (first in
the trainer's list) changes what runs every ``--block`` updates, at an update
boundary: no traceml, traceml's callback, and an empty callback as a
reference (an empty Lightning ``Callback``, an empty ``TrainerCallback``: both
trainers call every hook of every callback, so that much is the price of any
callback at all). The modes rotate, so every
cycle measures each once, back to back, on the same warmed-up trainer, model,
allocator and caches; whole separate runs differ from each other by more than
the overhead measured here.

"Without traceml" is without all of it: the callback is out of the list, its
wrappers (on the LightningModule's methods and its epoch loop's ``update_lr_schedulers``; HF's ``training_step``,
``compute_loss``, and the Accelerator's ``backward`` and ``clip_grad_norm_``) are undone, the DataLoader's ``__next__`` is torch's own,
and the SDK's module and optimizer hooks are lifted. The first updates of
each block (``SETTLE``) are not counted: their batches were fetched before the
switch.

Clock: the CPU time of the training thread (``time.thread_time``; one torch
thread, no loader workers, so all of a step's work — the trainer's and
traceml's — runs there). On a shared machine wall-clock intervals mostly
measure the neighbours' load; the wall-clock figures are printed beside, and
the process's CPU time (``proc``: every thread, so the SDK's watchdog thread,
which writes a quiet rank's held step records, cannot hide work there). A
block's step time is the median interval between update ends; the overhead is
the median over cycles of (traced block − untraced block of the same cycle),
in µs and as a share of the step.

Budget (the design's "trainer integration overhead ≤ 2 % of a step"): at most
2 % of the step or 30 µs, whichever is larger. The SDK's own per-step cost,
without any trainer, is ``tests/benchmarks/bench_sdk_overhead.py``.

``--instructions`` counts CPU instructions per update instead, a figure a loaded
machine does not move: the benchmark runs again under valgrind's callgrind
(instrumentation switched on after start-up, the hang watchdog off, the SDK's
write window stretched 50× as callgrind slows the training, Python's garbage
collector paused), which dumps its counters at a mark before and after
each block's counted updates; per cycle, each mode's count per update minus the
untraced one's, the median over cycles. The SDK's once-a-second memory sample is
stretched by the same factor as the write window (else callgrind's slow clock
would make it a per-few-updates file read that the native run does not do).

The write window's share is the one part the load moves: callgrind's slowdown is not a fixed 50× (with
``--cache`` nearer 100×, and slower on a loaded machine), so the number of updates per write, and with it
the write's share of each update, changes from run to run (docs/trainers.md, "The second-level cache").
Compare runs made side by side, or run ``TRACEML_WRITE_WINDOW_MS=9000 ... --instructions``: a window set
in the environment is kept as it is (not stretched), and at 9 s every write lands in a switch's uncounted
update (the per-update path alone).

``--cache`` (with ``--instructions``) adds callgrind's cache simulation, its last
level sized as one core's second-level cache (:data:`L2_BYTES`), and prints
each mode's simulated second-level misses per update (code and data lines
fetched from further out) beside its instructions. That is the figure the clock
follows here: a line traceml touches once per update has been evicted by the
trainer's own working set (more than the second-level cache) since the last
update, and costs a fetch from the third level or memory; a hook dispatch the
trainer runs for every callback stays in it (docs/trainers.md, "Overhead").
Python's garbage collector stays paused: measured on the clock run, it collects
about once per hundred traced updates and costs them under 1 µs per update on
average (docs/trainers.md).

Defaults (``--cycles 400``, blocks of 12 updates): this machine's CPU speed
drifts by about ±25 % within seconds (a pure-Python loop's block medians swing
between 1.1 and 1.7 ms), so a block's median update interval moves by up to
±500 µs from one block to the next, and 30 cycles of 40-update blocks cannot
resolve the 30 µs the Lightning budget is about. Many short blocks, each
compared with its neighbours in the same cycle, can: 400 cycles of 12-update
Lightning blocks (9 counted each) repeat within ±3 µs from run to run on a
quiet machine. The Hugging Face run uses the same shape (docs/trainers.md,
"Overhead"). Under ``--instructions`` pass a few cycles (``--cycles 3``):
callgrind runs the training about 50× slower.

    python tests/benchmarks/bench_trainers.py [--cycles 400] [--only hf|lightning] [--instructions [--cache]]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

SETTLE = 3
BUDGET_SHARE, BUDGET_US = 0.02, 30.0
#: Set in the benchmark's own process when it runs under callgrind (``--instructions``).
CALLGRIND_ENV = "TRACEML_BENCH_CALLGRIND"
#: About how much slower callgrind runs the training; the SDK's write window is stretched by it.
CALLGRIND_SLOWDOWN = 50
WINDOW_ENV = "TRACEML_WRITE_WINDOW_MS"  # sdk/window.py (not imported here: the base of a comparison may lack it)
#: Under ``--cache``: callgrind's simulated last-level cache, as one core's second-level cache here (1 MiB,
#: 8-way, 64-byte lines): its misses are the lines fetched from the third level or memory.
L2_BYTES = 1 << 20


class Modes:
    """What each block runs, and the per-update clock readings taken in each block."""

    def __init__(self, names: tuple[str, ...], cycles: int, block: int) -> None:
        self.names = names
        self.block = block
        # a first block with traceml installs what it installs lazily (not counted); then the cycles, the
        # order rotated each cycle so that no mode always follows the same one
        self.plan = ["traced"] + [names[(c + i) % len(names)] for c in range(cycles) for i in range(len(names))]
        self.ends: list[tuple[float, float, float]] = []
        self.current = "traced"

    def mode_at(self, update: int) -> str | None:
        """The mode of the block starting at ``update`` (None: not a new block)."""
        if update % self.block or update == 0:
            return None
        index = update // self.block
        return self.plan[index] if index < len(self.plan) else "none"

    def note_end(self) -> None:
        self.ends.append((time.thread_time(), time.perf_counter(), time.process_time()))

    def mark(self, update: int) -> None:
        """Under callgrind: dump its counters before a block's first counted update and at the block's end."""
        if not os.environ.get(CALLGRIND_ENV) or update < self.block:
            return
        if update == self.block:  # the first block (start-up, lazy installs) is not counted
            subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], capture_output=True, check=False)
        if update % self.block in (0, SETTLE) and update <= len(self.plan) * self.block:
            os.getppid()  # callgrind runs with --dump-before=getppid
    def figures(self) -> dict[str, list[tuple[float, float, float]]]:
        """mode -> per-block (CPU, wall, process CPU) median update interval, in plan order."""
        out: dict[str, list[tuple[float, float, float]]] = {name: [] for name in self.names}
        for index, mode in enumerate(self.plan):
            if index == 0:
                continue
            first, last = index * self.block + SETTLE, (index + 1) * self.block
            pairs = [(self.ends[i - 1], self.ends[i]) for i in range(max(first, 1), min(last, len(self.ends)))]
            if len(pairs) < 3:
                continue
            out[mode].append(tuple(statistics.median(b[k] - a[k] for a, b in pairs) for k in range(3)))
        return out


class DataLoaderTiming:
    """The SDK's DataLoader ``__next__`` timing (sdk/loader.py), switched in and out."""

    def __init__(self) -> None:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        self.cls = _BaseDataLoaderIter
        self.timed = _BaseDataLoaderIter.__next__
        assert getattr(self.timed, "_traceml_timed", False), "the DataLoader timing is not installed"

    def set(self, on: bool) -> None:
        self.cls.__next__ = self.timed if on else self.timed.__wrapped__


class TorchHooks:
    """The SDK's module hooks (phase timing, sdk/phases.py) and global optimizer hooks, lifted and restored."""

    def __init__(self, model: Any) -> None:
        import torch.optim.optimizer as opt

        self.dicts = [model._forward_pre_hooks, model._forward_hooks,
                      opt._global_optimizer_pre_hooks, opt._global_optimizer_post_hooks]
        self.saved = [dict(d) for d in self.dicts]

    def set(self, on: bool) -> None:
        for live, saved in zip(self.dicts, self.saved):
            live.clear()
            if on:
                live.update(saved)


def report(name: str, modes: Modes, reference: str | None = None) -> bool:
    """Print the overhead of ``traced`` (and of ``reference``) against ``none``; True within budget."""
    figures = modes.figures()
    ok = True
    for arm in ("traced", reference):
        if arm is None:
            continue
        label = name if arm == "traced" else f"{name}, {reference} (reference)"
        for clock, index in (("CPU", 0), ("wall", 1), ("proc", 2)):
            bare = [t[index] for t in figures["none"]]
            other = [t[index] for t in figures[arm]]
            base = statistics.median(bare)
            overhead = statistics.median([t - b for b, t in zip(bare, other)])
            budget_us = max(BUDGET_SHARE * base * 1e6, BUDGET_US)
            verdict = "ok" if overhead * 1e6 <= budget_us else "OVER"
            if clock == "CPU" and arm == "traced":
                ok = verdict == "ok"
            print(f"{label} {clock:>4}: step without traceml {base * 1e3:7.3f} ms · with "
                  f"{statistics.median(other) * 1e3:7.3f} ms · overhead {overhead * 1e6:7.1f} µs/step = "
                  f"{overhead / base * 100:5.2f} % of the step (budget {budget_us:.0f} µs: {verdict})")
    cycles = min(len(v) for v in figures.values())
    print(f"  {cycles} cycles × {modes.block} updates per mode ({SETTLE} settling updates not counted); "
          f"the budget is judged on the CPU clock")
    return ok


def hf(cycles: int, block: int) -> bool:
    import torch
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    import traceml_tui as traceml
    from traceml_tui.integrations.hf import TraceMLCallback

    class Tokens(Dataset):
        def __init__(self, count: int) -> None:
            self.ids = torch.randint(0, 128, (count, 16), generator=torch.Generator().manual_seed(1))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    modes = Modes(("none", "traced", "empty"), cycles, block)
    tracer, empty = TraceMLCallback(), TrainerCallback()
    state: dict[str, Any] = {}

    class Switch(TrainerCallback):
        def on_step_begin(self, args, state_, control, model=None, **kwargs):  # noqa: ANN001
            modes.mark(len(modes.ends))
            mode = modes.mode_at(len(modes.ends))
            if mode is None or mode == modes.current:
                return
            trainer = state["trainer"]
            if "loader" not in state:  # installed during the first (traced) block
                state["loader"], state["hooks"] = DataLoaderTiming(), TorchHooks(state["model"])
            handlers = trainer.callback_handler.callbacks
            for extra in (tracer, empty):
                if any(cb is extra for cb in handlers):
                    handlers.remove(extra)
            tracer._unbind()
            on = mode == "traced"
            _write_held(traceml)  # the traced block's held records, written in this uncounted update
            if mode != "none":  # right after this one: its on_step_begin runs next
                handlers.insert(handlers.index(self) + 1, tracer if on else empty)
            if on:
                tracer._bind(trainer)
            state["loader"].set(on)
            state["hooks"].set(on)
            modes.current = mode

        def on_step_end(self, args, state_, control, **kwargs):  # noqa: ANN001
            modes.note_end()

    config = GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    updates = len(modes.plan) * block + 1  # + 1: the last block's end mark
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to="none", disable_tqdm=True,
                             per_device_train_batch_size=8, gradient_accumulation_steps=2, max_steps=updates,
                             save_strategy="no", logging_strategy="no", eval_strategy="no")
    switch = Switch()
    model = GPT2LMHeadModel(config)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(updates * 16), callbacks=[switch, tracer])
    state["trainer"], state["model"] = trainer, model
    _fit(trainer.train)
    traceml.finish()
    state["loader"].set(True)  # as the SDK left it (the next run's traceml times its loader again)
    state["hooks"].set(True)
    return _done("HF Trainer", modes, reference="empty")


def lightning(cycles: int, block: int) -> bool:
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

    modes = Modes(("none", "traced", "empty"), cycles, block)
    tracer, empty = TraceMLCallback(), L.Callback()
    state: dict[str, Any] = {}

    class Switch(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # noqa: ANN001
            modes.mark(len(modes.ends))
            mode = modes.mode_at(len(modes.ends))
            if mode is None or mode == modes.current:
                return
            if "loader" not in state:  # installed during the first (traced) block
                state["loader"] = DataLoaderTiming()
            callbacks = trainer.callbacks
            _write_held(traceml)  # the traced block's held records, written in this uncounted update
            for extra in (tracer, empty):
                if any(cb is extra for cb in callbacks):
                    callbacks.remove(extra)
            tracer._unwrap()
            if mode != "none":
                callbacks.insert(callbacks.index(self) + 1, tracer if mode == "traced" else empty)  # runs next
            if mode == "traced":
                tracer._wrap(pl_module)
            state["loader"].set(mode == "traced")
            modes.current = mode

        def on_train_batch_end(self, *args: Any) -> None:
            modes.note_end()

    x = torch.randn((len(modes.plan) * block + 1) * 64, 32, generator=torch.Generator().manual_seed(1))  # one epoch
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=64)
    torch.manual_seed(0)
    trainer = L.Trainer(max_steps=len(modes.plan) * block + 1, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Switch(), tracer])
    _fit(lambda: trainer.fit(Net(), loader))
    traceml.finish()
    state["loader"].set(True)
    return _done("Lightning", modes, reference="empty")


def _write_held(traceml: Any) -> None:
    """Write the step records the SDK's write window holds (sdk/window.py), at a switch of mode.

    Left held, the watchdog thread would write them during the next block, where the training thread's clock
    would not count them (and the process clock would count them against the untraced block).
    """
    session = traceml.current_run()
    flush = getattr(session, "flush", None)  # (an SDK without the window writes each record at once)
    if flush is not None and not session.closed:
        flush()


def _fit(train: Callable[[], Any]) -> None:
    """Train; under callgrind with the garbage collector paused (a collection lands in one block, not all)."""
    import gc

    if os.environ.get(CALLGRIND_ENV):
        gc.disable()
        from traceml_tui.sdk import session

        if hasattr(session, "_RSS_PERIOD_S"):  # the memory sample as often per update as natively
            session._RSS_PERIOD_S *= CALLGRIND_SLOWDOWN
    try:
        train()
    finally:
        gc.enable()


def _done(name: str, modes: Modes, reference: str | None = None) -> bool:
    """Report the clock figures, or under callgrind leave the plan for the parent (``--instructions``)."""
    out = os.environ.get(CALLGRIND_ENV)
    if not out:
        return report(name, modes, reference)
    with open(out, "a") as handle:
        handle.write(json.dumps({"name": name, "plan": modes.plan[1:], "block": modes.block}) + "\n")
    return True


def instructions(argv: list[str], only: str | None, cache: bool = False) -> int:
    """Run this benchmark under callgrind; print instructions per update that traceml adds (and the reference).

    ``cache``: with callgrind's cache simulation (last level :data:`L2_BYTES`), also the simulated
    second-level misses per update.
    """
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("--instructions needs valgrind (callgrind) on PATH", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="traceml-bench-cg-")
    plans = os.path.join(work, "plans.jsonl")
    ok = True
    for name in ("hf", "lightning"):
        if only not in (None, name):
            continue
        out = os.path.join(work, f"{name}.%p")
        # callgrind runs the training about 50× slower: a write window 50× as long holds as many updates per
        # write as the native run (sdk/window.py), so the counts compare with the clock's figures
        # (a window set in the environment is kept: 9000 ms leaves every write to the switches' updates)
        env = dict(os.environ, **{CALLGRIND_ENV: plans, "TRACEML_HANG_WATCHDOG": "0",
                                  WINDOW_ENV: os.environ.get(WINDOW_ENV) or str(CALLGRIND_SLOWDOWN * 20)})
        sim = ["--cache-sim=yes", f"--LL={L2_BYTES},8,64"] if cache else []
        cmd = ["valgrind", "--tool=callgrind", *sim, "--instr-atstart=no", "--dump-before=getppid",
               f"--callgrind-out-file={out}", sys.executable, *argv, "--only", name]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        with open(plans) as handle:
            plan = json.loads(handle.readlines()[-1])
        dumps = sorted(glob.glob(os.path.join(work, f"{name}.*.*")), key=lambda f: int(f.rsplit(".", 1)[1]))
        counted = plan["block"] - SETTLE
        # dump 1: instrumentation on at the first block's end; then (settling, counted updates) per block
        totals = [_totals(dumps[2 * i + 2]) for i in range(len(plan["plan"]))]
        ok &= _report_instructions(plan["name"], plan["plan"], [t["Ir"] / counted for t in totals])
        if cache:
            _report_misses(plan["name"], plan["plan"],
                           [(t["ILmr"] + t["DLmr"] + t["DLmw"]) / counted for t in totals])
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def _totals(path: str) -> dict[str, int]:
    """A callgrind dump's event totals by event name (``Ir``; with the cache simulation ``ILmr``, ``DLmr``…)."""
    events: list[str] = []
    with open(path) as handle:
        for line in handle:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith(("summary:", "totals:")):
                return dict(zip(events, map(int, line.split()[1:])))
    raise ValueError(f"no totals in {path}")


def _extra_per_mode(plan: list[str], per: list[float]) -> tuple[float, dict[str, list[float]]]:
    """The untraced mode's median per update, and each other mode's per-cycle excess over it (plan order)."""
    modes = list(dict.fromkeys(plan))
    n = len(modes)
    cycles = [dict(zip(plan[c * n:(c + 1) * n], per[c * n:(c + 1) * n])) for c in range(len(plan) // n)]
    base = statistics.median(c["none"] for c in cycles)
    return base, {mode: [c[mode] - c["none"] for c in cycles] for mode in modes if mode != "none"}


def _label(mode: str) -> str:
    return "traceml" if mode == "traced" else f"{mode} (reference)"


def _report_misses(name: str, plan: list[str], per: list[float]) -> None:
    """Print each mode's simulated second-level misses per update beyond the untraced mode's (median over cycles)."""
    base, extras = _extra_per_mode(plan, per)
    print(f"{name}: {base / 1e3:.1f} k second-level misses per update without traceml (simulated {L2_BYTES >> 20} MiB)")
    for mode, extra in extras.items():
        print(f"  {_label(mode)}: {statistics.median(extra):+.0f} misses per update (cycles: "
              f"{', '.join(f'{e:+.0f}' for e in extra)})")


def _report_instructions(name: str, plan: list[str], per: list[float]) -> bool:
    base, extras = _extra_per_mode(plan, per)
    print(f"{name}: {base / 1e6:.2f} M instructions per update without traceml")
    for mode, extra in extras.items():
        print(f"  {_label(mode)}: {statistics.median(extra) / 1e3:+.1f} k instructions per update "
              f"({statistics.median(extra) / base * 100:.2f} % of the update; cycles: "
              f"{', '.join(f'{e / 1e3:+.0f}k' for e in extra)})")
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=400, help="cycles (each runs every mode once)")
    parser.add_argument("--hf-block", type=int, default=12, help="updates per Hugging Face block")
    parser.add_argument("--lightning-block", type=int, default=12, help="updates per Lightning block")
    parser.add_argument("--only", choices=("hf", "lightning"))
    parser.add_argument("--instructions", action="store_true",
                        help="count CPU instructions per update under callgrind (load-independent)")
    parser.add_argument("--cache", action="store_true",
                        help="with --instructions: also simulated second-level cache misses per update")
    args = parser.parse_args()
    if args.instructions and not os.environ.get(CALLGRIND_ENV):
        argv = [os.path.abspath(__file__), "--cycles", str(args.cycles), "--hf-block", str(args.hf_block),
                "--lightning-block", str(args.lightning_block)]
        return instructions(argv, args.only, args.cache)
    os.environ["TRACEML_RUN_DIR"] = os.path.join(tempfile.mkdtemp(prefix="traceml-bench-"), "run")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    runs: list[tuple[str, Callable[[int, int], bool], int]] = [("hf", hf, args.hf_block),
                                                               ("lightning", lightning, args.lightning_block)]
    ok = True
    for name, run, block in runs:
        if args.only in (None, name):
            ok &= run(args.cycles, block)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
