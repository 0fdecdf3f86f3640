"""Benchmark: one backlog entry, assembled on both sides (core/backlog.py), and the outstanding count's fast path.

    python tests/benchmarks/bench_backlog.py

On the committed real hygiene run (tests/fixtures/runs, indexed by the real ingester) prints, best of 300,
microseconds for

* ``reader.backlog.entries`` — the index side: the stored bytes through ``core.backlog.backlog_entries``;
* ``backlog_status`` — the file side (``traceml validate status``): the files through the same function;
* ``reader.backlog.outstanding`` — the Runs table's one-query count, against counting ``reader.backlog.entries``'s
  outstanding entries for every run (its slow path, measured in the same run: the ratio is the fast path's gain).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fixture_runs as fr  # noqa: E402

from daemon.reader import Reader  # noqa: E402
from traceml_tui.hygiene.backlog import backlog_status  # noqa: E402


def _best_us(fn, repeat: int = 300) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def main() -> None:
    root, index = fr.build_real_index(Path(tempfile.mkdtemp()))
    with Reader(index) as reader:
        runs = reader.list_runs()
        rid = next(r.run_id for r in runs if r.name == fr.name_of("hygiene"))

        def slow_outstanding() -> dict[int, int]:
            counts = {r.run_id: sum(e.outstanding for e in reader.backlog.entries(r.run_id, now=fr.SHOWN_AT))
                      for r in runs}
            return {k: v for k, v in counts.items() if v}

        assert slow_outstanding() == reader.backlog.outstanding()
        index_us = _best_us(lambda: reader.backlog.entries(rid, now=fr.SHOWN_AT))
        files_us = _best_us(lambda: backlog_status(root / fr.name_of("hygiene"), now=fr.SHOWN_AT))
        slow_us = _best_us(slow_outstanding)
        fast_us = _best_us(reader.backlog.outstanding)
    print(f"{'reader':<42} {'us':>8}")
    print(f"{'backlog.entries (one run, index side)':<42} {index_us:>8.0f}")
    print(f"{'backlog_status (one run, file side)':<42} {files_us:>8.0f}  {files_us / index_us:.2f}x the index side")
    print(f"{f'outstanding, entries of {len(runs)} runs (slow path)':<42} {slow_us:>8.0f}")
    print(f"{'backlog.outstanding (fast path)':<42} {fast_us:>8.0f}  {slow_us / fast_us:.1f}x faster")


if __name__ == "__main__":
    main()
