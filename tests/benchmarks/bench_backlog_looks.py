"""Benchmark: the looks at a run's validation backlog that run while it trains, as its checkpoints grow.

    python tests/benchmarks/bench_backlog_looks.py

For 10, 100 and 1,000 published checkpoints (every one evaluated but the newest, still pending: the steady
state of a run) prints the median µs of

* one early-stopping decision (``EarlyStopping.update``: rank 0, every update; under DDP every rank waits for
  it in ``should_stop``'s broadcast), against the same decision reading every request (before);
* the dispatcher's look (``dispatch.has_unreceipted``: the launcher, every second while no drainer runs; the
  drainer's scan is the same walk), against the same answer from every request's claimability (before).

Both baselines are measured in the same run, on the same folders.
"""

from __future__ import annotations

import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from traceml_tui.core.rundir import RunDir  # noqa: E402
from traceml_tui.hygiene import EarlyStopping, backlog, dispatch  # noqa: E402
from traceml_tui.hygiene.checkpoints import publish_checkpoint  # noqa: E402

DIGEST = "sha256:bench"


def _run_with(root: Path, checkpoints: int) -> Path:
    run_dir = root / f"run{checkpoints}"
    run_dir.mkdir(parents=True)
    weights = run_dir / "w.bin"
    weights.write_bytes(b"w")
    for i in range(1, checkpoints + 1):
        ckpt = publish_checkpoint(run_dir, weights, step=10 * i, config_digest=DIGEST)
        if i < checkpoints:
            request = backlog.read_json(RunDir(run_dir).request(ckpt))
            backlog.write_receipt(run_dir, request, {"val_loss": 1.0 / i})
    return run_dir


def _median_us(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _every_request_claimable(run_dir: Path) -> bool:
    """The dispatcher's answer as it was found before: every request read, then its claimability."""
    return any(backlog.claimable(run_dir, r["checkpoint"], max_attempts=3) for r in backlog.list_requests(run_dir))


def main() -> None:
    root = Path(tempfile.mkdtemp())
    print("| checkpoints | decision µs | reading every request (before) µs | ratio "
          "| dispatcher's look µs | every request's claimability (before) µs | ratio |")
    print("|---|---|---|---|---|---|---|")
    real_list = backlog.list_requests
    for n in (10, 100, 1000):
        run_dir = _run_with(root, n)
        es = EarlyStopping(run_dir, metric="val_loss", direction="min", patience=10**6)
        es.update(10 * n)  # consumes the evaluated ones
        repeat = 200 if n < 1000 else 40
        decide = functools.partial(es.update, 10 * n)
        now = _median_us(decide, repeat)
        backlog.list_requests = lambda run, errors=None, kind="validation", skip=(): real_list(run, errors, kind)
        try:
            before = _median_us(decide, repeat)
        finally:
            backlog.list_requests = real_list
        look = _median_us(functools.partial(dispatch.has_unreceipted, run_dir, 3), repeat)
        look_before = _median_us(functools.partial(_every_request_claimable, run_dir), max(5, repeat // 4))
        assert dispatch.has_unreceipted(run_dir, 3) == _every_request_claimable(run_dir)
        print(f"| {n:,} | {now:,.0f} | {before:,.0f} | {before / now:,.1f}× "
              f"| {look:,.0f} | {look_before:,.0f} | {look_before / look:,.1f}× |")


if __name__ == "__main__":
    main()
