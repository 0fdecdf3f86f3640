"""Live aggregates kept at ingest time, so that a reader's cost depends on what it shows.

* :func:`step_rows` turns decoded step records into row tuples for ``steps``.
* :class:`RankWindow` keeps the last few steps of one (run, rank, attempt) and
  yields the rolling medians and rates written to ``rank_live``.
* :func:`bucket_aggregates` downsamples a batch into per-bucket min/max/sum/n
  (numpy, no per-record Python work); :func:`series_width` picks the bucket
  width that keeps every series at most :data:`SERIES_POINTS` points.
* :func:`run_rollup` derives per-run figures (slowest rank, straggler score,
  steps/s, examples/s) from the handful of rank rows.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any, Optional, Sequence

import msgspec
import numpy as np

from traceml_tui.core import records

WINDOW = 64  # steps in the rolling window
SERIES_POINTS = 512  # buckets per (run, rank, metric): more than a terminal chart has columns, within the ≤ 2,000 asked

_extra_encoder = msgspec.json.Encoder()

# Positions inside a step row tuple (the steps table without run_id).
COL_STEP, COL_TS, COL_STEP_MS, COL_INPUT_WAIT = 2, 3, 4, 5
COL_GPU_STEP, COL_LOSS, COL_LR, COL_GRAD_NORM, COL_EXAMPLES = 10, 16, 17, 18, 19
#: Row columns feeding the wide series table, in index.SERIES_METRICS order.
SERIES_COLS = (COL_STEP_MS, COL_INPUT_WAIT, COL_GPU_STEP, COL_LOSS, COL_GRAD_NORM, COL_LR)


def step_rows(steps: Sequence[records.Step]) -> tuple[list[tuple], dict[str, list[tuple[int, float]]]]:
    """Row tuples for ``steps`` and, per loss component, its (step, ratio) pairs.

    Loss components live on as ``ratio/<name>`` series and the latest ratios
    (the JSONL stream stays the full record); ``extra`` keeps task metrics and
    CUDA memory peaks, only when a record has them.
    """
    encode = _extra_encoder.encode
    rows = []
    append = rows.append
    with_components = []
    for s in steps:
        c = s.cpu_ms
        g = s.gpu_ms
        m = s.mem
        extra = None
        if s.metrics or (m is not None and (m.cuda_peak_allocated is not None or m.cuda_peak_reserved is not None)):
            extra = encode({"metrics": s.metrics,
                            "cuda_peak_allocated": m.cuda_peak_allocated if m else None,
                            "cuda_peak_reserved": m.cuda_peak_reserved if m else None}).decode()
        if s.components:
            with_components.append(s)
        if g is None:
            append((s.rank, s.attempt, s.step, s.ts, c.step, c.input_wait, c.h2d, c.forward, c.backward, c.optimizer,
                    None, None, None, None, None, None,
                    s.loss, s.lr, s.grad_norm, s.examples, m.rss if m is not None else None, extra))
        else:
            append((s.rank, s.attempt, s.step, s.ts, c.step, c.input_wait, c.h2d, c.forward, c.backward, c.optimizer,
                    g.step, g.input_wait, g.h2d, g.forward, g.backward, g.optimizer,
                    s.loss, s.lr, s.grad_norm, s.examples, m.rss if m is not None else None, extra))
    ratios: dict[str, list[tuple[int, float]]] = {}
    if with_components:
        names = set()
        for s in with_components[:: max(1, len(with_components) // 16)]:
            names.update(s.components)
        for s in with_components:
            if not names.issuperset(s.components):
                names.update(s.components)
        for name in names:
            pairs = []
            for s in with_components:
                comp = s.components.get(name)
                if comp is not None and comp.ratio is not None:
                    pairs.append((s.step, comp.ratio))
            if pairs:
                ratios[name] = pairs
    return rows, ratios


def _median(values) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


class RankWindow:
    """The last :data:`WINDOW` steps of one (run, rank, attempt) and its running totals."""

    __slots__ = ("records", "first_step", "last_step", "last_ts", "loss", "ratios", "steps", "ts", "step_ms",
                 "input_wait", "examples", "ended", "exit_code", "end_ts", "node")

    def __init__(self) -> None:
        self.records = 0
        self.first_step: Optional[int] = None
        self.last_step: Optional[int] = None
        self.last_ts: Optional[float] = None
        self.loss: Optional[float] = None
        self.ratios: Optional[dict[str, float]] = None
        self.steps: deque = deque(maxlen=WINDOW)
        self.ts: deque = deque(maxlen=WINDOW)
        self.step_ms: deque = deque(maxlen=WINDOW)
        self.input_wait: deque = deque(maxlen=WINDOW)
        self.examples: deque = deque(maxlen=WINDOW)
        self.ended: Optional[str] = None  # the rank_end record's status, once it came
        self.exit_code: Optional[int] = None
        self.end_ts: Optional[float] = None  # the rank_end record's ts
        self.node: Optional[int] = None  # node_rank of the rank's stream header

    def add_rows(self, rows: Sequence[tuple], inserted: int) -> None:
        """Fold a batch of row tuples (file order) into the window."""
        self.add_columns(list(zip(*rows)), inserted)

    def add_columns(self, cols: Sequence[Sequence], inserted: int) -> None:
        """Fold a batch given as row columns (``zip(*rows)``, file order) into the window."""
        self.records += inserted
        if not cols or not cols[COL_STEP]:
            return
        tail = sorted(zip(*(c[-WINDOW:] for c in cols)), key=lambda r: r[COL_STEP])
        for r in tail:
            if self.steps and r[COL_STEP] <= self.steps[-1]:
                continue  # a duplicate or an older step must not disturb the window
            self.steps.append(r[COL_STEP])
            self.ts.append(r[COL_TS])
            self.step_ms.append(r[COL_STEP_MS])
            self.input_wait.append(r[COL_INPUT_WAIT])
            self.examples.append(r[COL_EXAMPLES])
        steps = cols[COL_STEP]
        first = min(steps)
        self.first_step = first if self.first_step is None else min(self.first_step, first)
        top = max(steps)
        i = steps.index(top)  # the first row holding the largest step, as max(rows, key=step) picks
        if self.last_step is None or top >= self.last_step:
            self.last_step = top
            self.last_ts = cols[COL_TS][i]
            if cols[COL_LOSS][i] is not None:
                self.loss = cols[COL_LOSS][i]

    def figures(self) -> dict[str, Optional[float]]:
        """Rolling medians and rates over the window."""
        interval = steps_per_s = examples_per_s = None
        if len(self.steps) >= 2:
            gaps = [b - a for a, b in zip(self.ts, list(self.ts)[1:]) if a is not None and b is not None]
            interval = statistics.median(gaps) if gaps else None
            span = (self.ts[-1] or 0.0) - (self.ts[0] or 0.0)
            if span > 0:
                steps_per_s = (self.steps[-1] - self.steps[0]) / span
                if self.examples[-1] is not None and self.examples[0] is not None:
                    examples_per_s = (self.examples[-1] - self.examples[0]) / span
        return {
            "median_step_ms": _median(self.step_ms),
            "median_input_wait_ms": _median(self.input_wait),
            "median_interval_s": interval,
            "steps_per_s": steps_per_s,
            "examples_per_s": examples_per_s,
        }


def latest_ratios(steps: Sequence[records.Step]) -> Optional[dict[str, float]]:
    """Scale-free ratios of the newest step record that has components."""
    best = None
    for s in steps:
        if s.components and (best is None or s.step >= best.step):
            best = s
    if best is None:
        return None
    return {name: c.ratio for name, c in best.components.items() if c.ratio is not None}


def series_width(max_step: int, current: int) -> int:
    """Smallest power-of-two bucket width ≥ ``current`` that keeps ``max_step`` within SERIES_POINTS buckets."""
    width = max(1, current)
    while (max_step + width - 1) // width > SERIES_POINTS:
        width *= 2
    return width


def bucket_aggregates(steps: np.ndarray, values: np.ndarray, width: int):
    """Per-bucket aggregates of ``values`` (shape n × m, NaN = missing) bucketed by step.

    Returns ``(bucket, step_lo, step_hi, vmin, vmax, vsum, n)`` arrays; the
    value arrays have shape (buckets × m). Empty buckets never occur.
    """
    bucket = (steps.astype(np.int64) - 1) // width
    order = np.argsort(bucket, kind="stable")
    b = bucket[order]
    s = steps[order]
    v = values[order]
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    finite = ~np.isnan(v)
    vmin = np.fmin.reduceat(v, starts, axis=0)
    vmax = np.fmax.reduceat(v, starts, axis=0)
    vsum = np.add.reduceat(np.where(finite, v, 0.0), starts, axis=0)
    n = np.add.reduceat(finite.astype(np.int64), starts, axis=0)
    return b[starts], np.minimum.reduceat(s, starts), np.maximum.reduceat(s, starts), vmin, vmax, vsum, n


def series_values(rows: Sequence[tuple], cols: Optional[Sequence[Sequence]] = None) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) arrays for the wide series table from row tuples (or their columns, ``zip(*rows)``)."""
    if cols is None:
        cols = list(zip(*rows))  # transpose in C
    n = len(cols[COL_STEP]) if cols else 0
    steps = np.array(cols[COL_STEP], dtype=np.float64)
    values = np.empty((n, len(SERIES_COLS)), dtype=np.float64)
    for j, c in enumerate(SERIES_COLS):
        col = cols[c]
        if col[0] is None and col.count(None) == n:
            values[:, j] = np.nan
        else:
            values[:, j] = np.array(col, dtype=np.float64)  # None becomes NaN
    return steps, values


def run_rollup(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-run figures from the latest-attempt row of each rank.

    The straggler score is the slowest rank's median step time over the median
    of all ranks' medians: 1.0 means no straggler, 1.5 means the slowest rank is
    50% slower than a typical one.
    """
    timed = [(r["median_step_ms"], r["rank"]) for r in ranks if r.get("median_step_ms") is not None]
    slowest = score = None
    if timed:
        worst_ms, slowest = max(timed)
        typical = statistics.median(ms for ms, _ in timed)
        score = worst_ms / typical if typical and typical > 0 else None
    rates = [r["steps_per_s"] for r in ranks if r.get("steps_per_s") is not None]
    examples = [r["examples_per_s"] for r in ranks if r.get("examples_per_s") is not None]
    intervals = [r["median_interval_s"] for r in ranks if r.get("median_interval_s") is not None]
    return {
        "slowest_rank": slowest,
        "straggler_score": score,
        # Synchronous data parallelism runs at the pace of its slowest rank.
        "steps_per_s": min(rates) if rates else None,
        "examples_per_s": sum(examples) if examples else None,
        "median_interval_s": statistics.median(intervals) if intervals else None,
    }
