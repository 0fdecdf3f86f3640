"""Training-run hygiene example (seed 004) on a small CPU regression model.

    cd examples/hygiene && traceml run train_regression.py --run-name hygiene-demo

What it shows:
* every step logs the loss with its scale-free ``mse`` component (value / mean
  square of the target, 1.0 = predicting zero) and the train-split R²;
* every ``hygiene.validation.cadence`` updates (and at initialization) it
  publishes an immutable checkpoint + a durable validation request and keeps
  training; a dispatcher starts ``traceml validate drain`` processes that run
  ``validate.py`` on each checkpoint in order;
* early stopping consumes the validation receipts in checkpoint order, persists
  its state in ``early_stopping.json`` and stops at ``max_budget`` otherwise;
* ``traceml run`` refreshes ``learning_curve.png`` at ``hygiene.curve.cadence``
  and once at the end; the final backlog is drained after training stops;
* every ``hygiene.recovery.every`` updates it writes a recovery save (model,
  optimizer, RNG, counters; only ``keep`` stay). Interrupted (Ctrl-C), the
  same command with ``--resume`` restores the newest one and continues from its
  update: checkpoints keep their true update, early stopping its patience and best.

The effective hygiene config is read from the manifest ``traceml run`` wrote.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from data import make_model, make_split, r2
from torch import nn

import traceml_tui as traceml
from traceml_tui.hygiene import EarlyStopping, backlog, checkpoints
from traceml_tui.hygiene.dispatch import Dispatcher, load_effective_hygiene

BATCH = 64
LR = 0.05
#: The demo's validation (a fresh Python + torch process per checkpoint) costs far more
#: than its training steps; bound how far training may run ahead of completed
#: validation so early stopping acts within the demo. Real runs size the cadence instead.
MAX_EVAL_LAG_CHECKPOINTS = 4


def main() -> int:
    session = traceml.init()
    run_dir = Path(session.run_dir)
    hygiene = load_effective_hygiene(run_dir)
    if hygiene is None:
        print("train_regression.py: run it with `traceml run` from a folder whose traceml.yaml has a hygiene block",
              file=sys.stderr)
        return 2
    validation = hygiene["validation"]
    cadence, first = validation["cadence"], validation["first_evaluation"]
    stopper = EarlyStopping.from_config(run_dir, hygiene)
    dispatcher = Dispatcher.from_config(run_dir, hygiene, cwd=Path(__file__).resolve().parent)
    budget = hygiene["early_stopping"].get("max_budget") or 3000

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x_train, y_train, _, _ = make_split()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    published: list[str] = []

    def publish(step: int) -> None:
        published.append(traceml.publish_checkpoint(model.state_dict(), step=step))
        dispatcher.poke()

    restored = traceml.restore_recovery(model=model, optimizer=optimizer)
    if restored is not None:  # a resume: continue after the newest recovery save
        step = restored.step
        published.extend(request["checkpoint"] for request in backlog.list_requests(run_dir))
        print(f"train_regression.py: resumed at update {step}", file=sys.stderr)
    else:
        step = 0
        if first == 0:
            publish(0)  # the initialization is a checkpoint too (seed 004)
    while step < budget and not stopper.stopped:
        idx = torch.randint(0, len(x_train), (BATCH,))
        xb, yb = x_train[idx], y_train[idx]
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            pred = model(xb)
            loss = nn.functional.mse_loss(pred, yb)
            loss.backward()
            optimizer.step()
            traceml.log(loss=loss, lr=LR, batch_size=BATCH, components={"mse": (loss, yb)},
                        metrics={"r2": r2(pred.detach(), yb)})
        step += 1
        # the recovery save first: a resume then never re-reaches an update it published
        traceml.save_recovery(model=model, optimizer=optimizer)
        if step >= first and step % cadence == 0:
            publish(step)
            while dispatcher.running and _eval_lag(run_dir, published) > MAX_EVAL_LAG_CHECKPOINTS:
                time.sleep(0.1)
                dispatcher.poke()
        if stopper.should_stop(step) or step >= budget:
            break
        dispatcher.poke()  # restart draining if the previous drainer ran out of work

    last = checkpoints.last_published_step(run_dir)
    if last is None or last < step:
        publish(step)  # the final state is always a retained checkpoint
    dispatcher.drain_final(timeout=600)  # drain the backlog left after training stops
    stopper.update(step)  # the drained receipts counted: the summary's "early stopping" line says the outcome
    return 0


def _eval_lag(run_dir: Path, published: list[str]) -> int:
    return sum(1 for ckpt in published if not (run_dir / "validation" / "receipts" / f"{ckpt}.json").exists())


if __name__ == "__main__":
    sys.exit(main())
