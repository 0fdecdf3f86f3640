"""The SDK's own cost per step, layer by layer, against a bare loop measured in the same run.

Each row is a loop of ``N`` steps timed against the same loop without traceml, in
interleaved rounds (the best round of each side: on a shared machine the best
is the least disturbed). The step itself does nothing, so the difference is
traceml's work alone, with warm caches (inside a real trainer the same code
runs colder; ``tests/benchmarks/bench_trainers.py`` measures that):

* ``trace_step``: the step clock and one step record (held by the write
  window, ``sdk/window.py``: these steps are short, so records are built,
  encoded and written together, one ``os.write`` per 20 ms);
* ``+ log(floats)``: loss, lr and batch size as Python numbers;
* ``+ log(tensor loss)``: the loss a trainer hands over (one ``.item()`` when
  the record is written);
* ``Lightning callback``: what traceml runs in one Lightning update — the
  wrappers the callback puts on the LightningModule's ``on_train_batch_start``,
  ``training_step``, ``backward``, ``on_before_optimizer_step`` and
  ``optimizer_step`` and on the epoch loop's ``update_lr_schedulers`` (which
  closes the update and writes its record), called in Lightning's order against
  the same calls on an unwrapped module, without Lightning's own work around
  them (skipped when Lightning is not installed).

The budget of the first three is the design's ≤ 10 µs per step.

    python tests/benchmarks/bench_sdk_step.py [--steps 20000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any, Callable

BUDGET_US = 10.0


def best(fn: Callable[[], None], steps: int) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / steps * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    os.environ["TRACEML_RUN_DIR"] = os.path.join(tempfile.mkdtemp(prefix="traceml-bench-"), "run")
    os.environ["TRACEML_HANG_WATCHDOG"] = "0"  # its cost is bench_sdk_overhead.py's last line; nothing per step
    import torch

    import traceml_tui as traceml

    torch.set_num_threads(1)
    traceml.init()
    n = args.steps
    loss = torch.tensor(0.5)
    batch = [torch.zeros(64, 32), torch.zeros(64, 1)]

    def bare() -> None:
        for _ in range(n):
            pass

    def trace_only() -> None:
        for _ in range(n):
            with traceml.trace_step():
                pass

    def floats() -> None:
        for _ in range(n):
            with traceml.trace_step():
                traceml.log(loss=0.5, lr=0.1, batch_size=64)

    def tensor_loss() -> None:
        for _ in range(n):
            with traceml.trace_step():
                traceml.log(loss=loss, lr=0.1, batch_size=64)

    rows: list[tuple[str, Callable[[], None], Callable[[], None], bool]] = [
        ("trace_step", bare, trace_only, True),
        ("trace_step + log(floats)", bare, floats, True),
        ("trace_step + log(tensor loss)", bare, tensor_loss, True),
    ]
    if importlib.util.find_spec("lightning") is not None:
        rows.append(("Lightning callback, per update", *lightning_rows(n, loss, batch), False))
    got: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name, *_ in rows}
    for _ in range(args.rounds):
        for name, base, traced, _ in rows:
            got[name][0].append(best(base, n))
            got[name][1].append(best(traced, n))
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {n} steps × {args.rounds} interleaved rounds")
    ok = True
    for name, _, _, budgeted in rows:
        base, traced = min(got[name][0]), min(got[name][1])
        overhead = traced - base
        verdict = ""
        if budgeted:
            verdict = f" (budget {BUDGET_US:g} µs: {'ok' if overhead <= BUDGET_US else 'OVER'})"
            ok &= overhead <= BUDGET_US
        print(f"{name:34s} bare {base:7.2f} µs/step · traced {traced:7.2f} µs/step · overhead {overhead:6.2f} µs{verdict}")
    traceml.finish()
    return 0 if ok else 1


def lightning_rows(n: int, loss: Any, batch: Any) -> tuple[Callable[[], None], Callable[[], None]]:
    """(bare, traced) loops of one Lightning update's calls into traceml, without Lightning.

    The callback times an automatic-optimization update through wrappers on the
    LightningModule's own methods and on the epoch loop's scheduler step
    (traceml_tui/integrations/lightning.py); its batch hooks are then switched
    off. Both loops call the same methods, in Lightning's order, on a stand-in
    module with a stand-in epoch loop: the bare one on a module the callback
    never saw, the traced one on the module its ``setup`` wrapped.
    """
    import torch

    from traceml_tui import sdk
    from traceml_tui.integrations import lightning as integration

    callback = integration.TraceMLCallback()
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)

    class EpochLoop:
        def update_lr_schedulers(self, interval: str, update_plateau_schedulers: bool) -> None:
            return None

    class Module:
        automatic_optimization = True

        def __init__(self) -> None:
            self._trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=EpochLoop()))

        def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
            return None

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return loss

        def backward(self, tensor: Any) -> None:
            return None

        def on_before_optimizer_step(self, optimizer: Any) -> None:
            return None

        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, closure: Any = None) -> None:
            return None

        def parameters(self) -> Any:
            return iter([torch.zeros(1)])

    module, plain = Module(), Module()
    trainer = SimpleNamespace(callbacks=[callback], world_size=1, is_global_zero=True, checkpoint_callbacks=[],
                              strategy=None, sanity_checking=False, callback_metrics={}, accumulate_grad_batches=1)
    callback.setup(trainer, module, "fit")  # wraps the module's methods and its epoch loop's scheduler step
    wrapped = [name for name in integration._WRAPPERS if name in module.__dict__]
    loop = module._trainer.fit_loop.epoch_loop
    if len(wrapped) != len(integration._WRAPPERS) or integration._SCHEDULER_STEP not in loop.__dict__:
        raise SystemExit(f"the Lightning callback no longer wraps what this benchmark drives: {wrapped}")

    def update(m: Any, epoch_loop: Any, i: int) -> None:
        m.on_train_batch_start(batch, i)
        m.training_step(batch, i)  # (Lightning runs these two inside optimizer.step(closure))
        m.backward(loss)
        m.on_before_optimizer_step(optimizer)
        m.optimizer_step(0, i, optimizer, None)
        epoch_loop.update_lr_schedulers("step", update_plateau_schedulers=False)

    plain_loop = plain._trainer.fit_loop.epoch_loop
    session = sdk.current_run()
    before = session.last_step
    update(module, loop, 0)
    if session.last_step != before + 1:  # one update, one step record: else the row would time nothing
        raise SystemExit("the Lightning callback's wrappers recorded no step: the benchmark drives them wrongly")

    def bare() -> None:
        for i in range(n):
            update(plain, plain_loop, i)

    def traced() -> None:
        assert callback is not None  # held here, as Lightning's trainer holds it: its wrappers hold it weakly
        for i in range(n):
            update(module, loop, i)

    return bare, traced


if __name__ == "__main__":
    sys.exit(main())
