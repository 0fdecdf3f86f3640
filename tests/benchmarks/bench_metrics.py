"""Cost of a Prometheus scrape of `traceml daemon --metrics` over 200 runs × 8 ranks.

The index is built like bench_tui's (one real run ingested by the real Ingester, cloned inside SQLite).
The scrape (``generate_latest`` over the daemon's collector) is printed with the daemon's CPU time per
scrape, beside the baseline that does the same reads without Prometheus: the reader calls the collector
makes (list_runs, rank_rows and backlog of every exported run), measured in the same run.

    python tests/benchmarks/bench_metrics.py [--runs 200] [--ranks 8] [--steps 2000] [--scrapes 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from bench_tui import build_index  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.registry import CollectorRegistry  # noqa: E402

from daemon.metrics import IndexCollector  # noqa: E402
from daemon.reader import Reader  # noqa: E402

from support import tui_data as d  # noqa: E402


def _cpu_ms(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.process_time()
        fn()
        out.append((time.process_time() - t) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--scrapes", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        index = build_index(Path(tmp), a.runs, a.ranks, a.steps)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(IndexCollector(str(index), retention_s=1e12, clock=lambda: d.FIXED_NOW))
        body = generate_latest(registry)
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))

        def baseline() -> None:
            with Reader(index) as r:
                for run in r.list_runs(now=d.FIXED_NOW):
                    r.rank_rows(run.run_id, now=d.FIXED_NOW)
                    r.backlog.entries(run.run_id, now=d.FIXED_NOW)
                r.list_runs(now=d.FIXED_NOW)

        base = statistics.median(_cpu_ms(baseline, a.scrapes))
        scrape = statistics.median(_cpu_ms(lambda: generate_latest(registry), a.scrapes))
        t = time.perf_counter()
        for _ in range(a.scrapes):
            generate_latest(registry)
        wall = (time.perf_counter() - t) / a.scrapes * 1000
        print(f"exposition: {series:,} series, {len(body) / 1024:.0f} KiB for {a.runs} runs × {a.ranks} ranks")
        print(f"scrape: {scrape:.1f} ms CPU (median of {a.scrapes}), {wall:.1f} ms wall")
        print(f"baseline (the same reader calls, no Prometheus): {base:.1f} ms CPU; ratio {scrape / base:.2f}")
        print(f"daemon CPU at a 15 s scrape interval: {scrape / 15000 * 100:.2f} % of a core")


if __name__ == "__main__":
    main()
