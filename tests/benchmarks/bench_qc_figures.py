"""Benchmark: an exemplar gallery's cost, and what its health measures add, against the batch grid.

    python tests/benchmarks/bench_qc_figures.py

Prints seconds per save for a batch grid of 56 members (the baseline, measured in
the same run), a gallery of the same 56 examples in 3 groups (40, 16, 0: 3 pages),
and a gallery of 3 x 256 examples (16 pages each of 3 columns), each with its ratio
to the baseline; then the measures alone for 56 and 768 examples (the pixel-space
diversity is pairwise, capped at 256 examples) as a share of their figure's save.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from traceml_tui.hygiene import batch_grid, gallery


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    rng = np.random.default_rng(0)
    images = rng.random((768, 3, 32, 32))
    small = {"high": [(f"h{i}", images[i]) for i in range(40)], "mid": [(f"m{i}", images[40 + i]) for i in range(16)],
             "none": []}
    large = {g: [(f"{g}{i}", images[k * 256 + i]) for i in range(256)] for k, g in enumerate(("a", "b", "c"))}
    batch_grid.save_batch_grid(Path(tempfile.mkdtemp()), images[:4], step=0)  # warm imports

    base = _best(lambda: batch_grid.save_batch_grid(Path(tempfile.mkdtemp()), images[:56], step=0))
    print(f"batch grid, 56 members:            {base:6.3f} s  (baseline)")
    g56 = _best(lambda: gallery.save_gallery(Path(tempfile.mkdtemp()), small, step=0))
    print(f"gallery 40/16/0 (3 pages):         {g56:6.3f} s  ({g56 / base:4.1f}x the batch grid)")
    g768 = _best(lambda: gallery.save_gallery(Path(tempfile.mkdtemp()), large, step=0), repeat=1)
    print(f"gallery 3 x 256 (16 pages):        {g768:6.3f} s  ({g768 / base:4.1f}x the batch grid)")

    def measures(groups):
        examples, available = gallery.normalize_groups(groups)
        return lambda: gallery.gallery_measures(examples, available)

    m56 = _best(measures(small))
    m768 = _best(measures(large))
    print(f"measures, 56 examples:             {m56:6.3f} s  ({m56 / g56:5.1%} of that gallery's save)")
    print(f"measures, 768 examples:            {m768:6.3f} s  ({m768 / g768:5.1%} of that gallery's save)")


if __name__ == "__main__":
    main()
