"""Benchmark: reading a rank file's complete lines and records through core/jsonl.py, against the loop it replaced.

    python tests/benchmarks/bench_jsonl.py [UPDATES]

Writes one rank file of UPDATES step records (default 200,000; the real shape: loss, examples, a loss
component, a task metric) and prints, best of 3, seconds and records/s for

* baseline — the loop the readers had: ``read_bytes``, cut at the last newline, ``split``, decode each line;
* ``complete_lines`` — the same bytes through the fast path, decoded by ``iter_records``;
* ``file_records`` — the chunked reader (memory bounded by one chunk, not the file), decoded;

each with its ratio to the baseline measured in the same run (1.00 = as fast).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from traceml_tui.core import jsonl, records


def _write(path: Path, n: int) -> None:
    with open(path, "wb") as handle:
        handle.write(records.encode(records.Header(v=1, run="bench", rank=0, attempt=0, uuid="u", ts=0.0)))
        for s in range(1, n + 1):
            v = 1.0 / (1 + s / 500)
            handle.write(records.encode(records.Step(
                v=1, run="bench", rank=0, attempt=0, step=s, ts=float(s), loss=v, examples=s * 32,
                metrics={"r2": 1 - v}, components={"mse": records.Component(value=v, target_ms=1.0, ratio=v)})))
        handle.write(b'{"v":1,"kind":"step","run":"bench","ra')  # a record still being written


def _baseline(path: Path) -> int:
    data = path.read_bytes()
    end = data.rfind(b"\n")
    count = 0
    for line in data[:end].split(b"\n"):
        if not line.strip():
            continue
        try:
            records.decode(line)
        except (records.RecordError, RecursionError):
            continue
        count += 1
    return count


def _fast(path: Path) -> int:
    return sum(1 for _ in jsonl.iter_records(jsonl.complete_lines(path.read_bytes())))


def _chunked(path: Path) -> int:
    return sum(1 for _ in jsonl.file_records(path))


def _best(fn, path: Path) -> tuple[float, int]:
    best, count = float("inf"), 0
    for _ in range(3):
        t0 = time.perf_counter()
        count = fn(path)
        best = min(best, time.perf_counter() - t0)
    return best, count


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    path = Path(tempfile.mkdtemp()) / "steps-0.jsonl"
    _write(path, n)
    print(f"rank file: {n:,} step records, {path.stat().st_size / 1e6:.1f} MB")
    base, expected = _best(_baseline, path)
    print(f"{'reader':<16} {'seconds':>8} {'records/s':>12} {'vs baseline':>12}")
    for name, fn in (("baseline", _baseline), ("complete_lines", _fast), ("file_records", _chunked)):
        seconds, count = _best(fn, path) if fn is not _baseline else (base, expected)
        assert count == expected == n + 1, (name, count, expected)  # the same records, the partial one left out
        print(f"{name:<16} {seconds:>8.3f} {count / seconds:>12,.0f} {base / seconds:>11.2f}x")


if __name__ == "__main__":
    main()
