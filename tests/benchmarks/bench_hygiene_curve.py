"""Benchmark: learning-curve render time vs history length, and the drainer's per-request overhead.

    python tests/benchmarks/bench_hygiene_curve.py

Prints seconds per render for 0 / 1,000 / 10,000 / 100,000 updates and the ratio
to the 0-update render measured in the same run (the fixed matplotlib cost), then
the drainer's cost per request with a trivial worker vs running that worker
directly.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from traceml_tui.core import records
from traceml_tui.hygiene.checkpoints import publish_checkpoint
from traceml_tui.hygiene.curve import render_learning_curve


def _history(run_dir: Path, n: int) -> None:
    path = run_dir / "ranks" / "rank_0" / "steps-0.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(records.encode(records.Header(v=1, run="bench", rank=0, attempt=0, uuid="u", ts=0.0)))
        for s in range(1, n + 1):
            v = 1.0 / (1 + s / 500)
            handle.write(records.encode(records.Step(v=1, run="bench", rank=0, attempt=0, step=s, ts=float(s), loss=v,
                                                     examples=s * 32, metrics={"r2": 1 - v},
                                                     components={"mse": records.Component(value=v, target_ms=1.0, ratio=v)})))


def main() -> None:
    render_learning_curve(Path(tempfile.mkdtemp()))  # warm imports
    base = None
    for n in (0, 1_000, 10_000, 100_000):
        run_dir = Path(tempfile.mkdtemp())
        _history(run_dir, n)
        t0 = time.perf_counter()
        render_learning_curve(run_dir)
        took = time.perf_counter() - t0
        base = base or took
        print(f"render {n:>7,} updates: {took:6.3f} s  ({took / base:4.1f}x the empty render)")

    run_dir = Path(tempfile.mkdtemp())
    weights = run_dir / "w"
    weights.write_bytes(b"w")
    n = 40
    for s in range(n):
        publish_checkpoint(run_dir, weights, step=s, config_digest="d")
    worker = ["sh", "-c", 'echo "{\\"m\\": 1}"', "sh", "{checkpoint}"]
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run(worker, capture_output=True, check=True)
    direct = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "traceml_tui", "validate", "drain", str(run_dir), "--no-curve", "--", *worker],
                   capture_output=True, check=True)
    drained = (time.perf_counter() - t0) / n
    print(f"worker run directly: {direct * 1000:6.1f} ms/request; through the drainer: {drained * 1000:6.1f} ms/request "
          f"({drained / direct:4.1f}x, includes one drainer start-up over {n} requests)")


if __name__ == "__main__":
    main()
