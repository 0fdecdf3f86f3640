"""Live aggregates kept at ingest time, so that a reader's cost depends on what it shows.

* :func:`step_rows` turns decoded step records into row tuples for ``steps``.
* :class:`RankWindow` keeps the last few steps of one (run, rank, attempt) and
  yields the rolling figures written to ``rank_live``: the step time and its
  parts, split and averaged by :mod:`traceml_tui.core.steptime` (the one
  definition), medians, and the rates by the rate rule (:mod:`daemon.rates`:
  over the last seconds of records, not over the window's 64 steps).
* :func:`whole_step_ms` is the step time of many rows at once (numpy), equal to
  ``steptime.split_step(...).whole`` row by row; the ``step_ms`` /
  ``gpu_step_ms`` series hold it.
* :func:`bucket_aggregates` downsamples a batch into per-bucket min/max/sum/n
  (numpy, no per-record Python work); :func:`series_width` picks the bucket
  width that keeps every series at most :data:`SERIES_POINTS` points.
* :func:`run_median_interval` is the one per-run figure the index stores from
  the handful of rank rows (the run's rates and straggler are the reader's).
"""

from __future__ import annotations

import statistics
from collections import deque
from operator import attrgetter, itemgetter
from typing import Any, Iterable, Optional, Sequence

import msgspec
import numpy as np

from traceml_tui.core import records, steptime

from . import rates

WINDOW = 64  # steps in the rolling window
#: Marks a window keeps for the rate rule (daemon/rates.py ``MARK_S``): every mark of the rate's seconds and a few
MARKS = int(rates.RATE_WINDOW_S / rates.MARK_S) + 8
SERIES_POINTS = 512  # buckets per (run, rank, metric): more than a terminal chart has columns, within the ≤ 2,000 asked

_extra_encoder = msgspec.json.Encoder()

# Positions inside a step row tuple (the steps table without run_id: index.STEP_COLUMNS[1:]).
COL_STEP, COL_TS, COL_STEP_MS, COL_INPUT_WAIT = 2, 3, 4, 5
COL_H2D, COL_FORWARD, COL_BACKWARD, COL_OPTIMIZER = 6, 7, 8, 9
COL_GPU_STEP, COL_GPU_INPUT_WAIT = 10, 11
COL_GPU_H2D, COL_GPU_FORWARD, COL_GPU_BACKWARD, COL_GPU_OPTIMIZER = 12, 13, 14, 15
COL_LOSS, COL_LR, COL_GRAD_NORM, COL_EXAMPLES = 16, 17, 18, 19
COL_DATA_WAIT, COL_DATA_IN_STEP = 22, 23
#: Row columns feeding the wide series table, in index.SERIES_METRICS order. ``step_ms`` and
#: ``gpu_step_ms`` are the step time (gap + traced step, :func:`whole_step_ms`) of those columns,
#: ``input_wait_ms`` the gap as the step time counts it (:func:`gap_ms`).
SERIES_COLS = (COL_STEP_MS, COL_INPUT_WAIT, COL_GPU_STEP, COL_LOSS, COL_GRAD_NORM, COL_LR)
#: The columns one step is split from, on each clock: traced, gap, h2d, forward, backward, optimizer.
_CPU_SPLIT = (COL_STEP_MS, COL_INPUT_WAIT, COL_H2D, COL_FORWARD, COL_BACKWARD, COL_OPTIMIZER)
_GPU_SPLIT = (COL_GPU_STEP, COL_GPU_INPUT_WAIT, COL_GPU_H2D, COL_GPU_FORWARD, COL_GPU_BACKWARD, COL_GPU_OPTIMIZER)


def step_rows(steps: Sequence[records.Step]) -> tuple[list[tuple], dict[str, list[tuple[int, float]]]]:
    """Row tuples for ``steps`` and, per loss component, its (step, ratio) pairs.

    Loss components live on as ``ratio/<name>`` series and the latest ratios
    (the JSONL stream stays the full record); ``extra`` keeps task metrics and
    CUDA memory peaks, only when a record has them. The loader waits
    (``data_wait``, ``data_in_step``) are stored once, from the CPU record: the
    SDK writes the same values on both clocks.
    """
    return row_tuples(steps), ratio_pairs(steps)


def ratio_pairs(steps: Sequence[records.Step]) -> dict[str, list[tuple[int, float]]]:
    """Per loss component of ``steps`` (one rank's records, file order), its (step, ratio) pairs in file order
    (ratios that are null left out).

    A step repeated in ``steps`` gives the pairs of its first record only, whatever components the later
    copies carry: the first line is the row the index keeps (docs/daemon.md rule 2), and every series and
    every live row's ratios fold that row's ratios, never a later copy's (a component only the later copy
    has, or a ratio it gives where the first copy's was null).
    """
    with_components = [s for s in steps if s.components]
    ratios: dict[str, list[tuple[int, float]]] = {}
    if with_components:
        with_components = _first_copies(steps, with_components)
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
    return ratios


_step_of = attrgetter("step")


def _first_copies(steps: Sequence[records.Step], subset: list) -> list:
    """``subset`` (records of ``steps``, in order) without the records that repeat a step an earlier record of
    ``steps`` holds (the common case, no step repeated, costs one set of the steps)."""
    numbers = list(map(_step_of, steps))
    if len(set(numbers)) == len(numbers):
        return subset
    first: dict[int, object] = {}
    for s in steps:
        first.setdefault(s.step, s)
    return [s for s in subset if first[s.step] is s]


def row_tuples(steps: Sequence[records.Step]) -> list[tuple]:
    """The row tuple of each of ``steps`` (the ``steps`` table's columns without ``run_id``, in order), one
    loop for them all: a live pass builds every rank's rows at once (``daemon/columns.py``)."""
    encode = _extra_encoder.encode
    rows = []
    append = rows.append
    for s in steps:
        c = s.cpu_ms
        g = s.gpu_ms
        m = s.mem
        extra = None
        if s.metrics or (m is not None and (m.cuda_peak_allocated is not None or m.cuda_peak_reserved is not None)):
            extra = encode({"metrics": s.metrics,
                            "cuda_peak_allocated": m.cuda_peak_allocated if m else None,
                            "cuda_peak_reserved": m.cuda_peak_reserved if m else None}).decode()
        if g is None:
            append((s.rank, s.attempt, s.step, s.ts, c.step, c.input_wait, c.h2d, c.forward, c.backward, c.optimizer,
                    None, None, None, None, None, None,
                    s.loss, s.lr, s.grad_norm, s.examples, m.rss if m is not None else None, extra,
                    c.data_wait, c.data_in_step))
        else:
            append((s.rank, s.attempt, s.step, s.ts, c.step, c.input_wait, c.h2d, c.forward, c.backward, c.optimizer,
                    g.step, g.input_wait, g.h2d, g.forward, g.backward, g.optimizer,
                    s.loss, s.lr, s.grad_norm, s.examples, m.rss if m is not None else None, extra,
                    c.data_wait, c.data_in_step))
    return rows


#: ``steps`` table columns a window is reloaded from (the window's own column layout, see :meth:`RankWindow.add_stored`).
WINDOW_COLUMNS: tuple[str, ...] = (
    "step", "ts", "examples", "step_ms", "input_wait_ms", "h2d_ms", "forward_ms", "backward_ms", "optimizer_ms",
    "gpu_step_ms", "gpu_input_wait_ms", "gpu_h2d_ms", "gpu_forward_ms", "gpu_backward_ms", "gpu_optimizer_ms",
    "data_wait_ms", "data_in_step_ms",
)


def split_row(r: Sequence, clock: tuple[int, ...], data_wait: int = COL_DATA_WAIT,
              data_in_step: int = COL_DATA_IN_STEP) -> Optional[steptime.StepParts]:
    """One step row split on one clock by :func:`steptime.split_step` (None: no traced time on that clock).

    ``clock`` holds the positions of traced, gap, h2d, forward, backward and
    optimizer in ``r``; the loader waits are the CPU-measured ones on both
    clocks, as the SDK writes them.
    """
    traced, gap, h2d, forward, backward, optimizer = (r[c] for c in clock)
    if traced is None:
        return None
    return steptime.split_step(traced, gap, data_wait=r[data_wait], data_in_step=r[data_in_step], h2d=h2d,
                               forward=forward, backward=backward, optimizer=optimizer)


_STORED_CPU = (3, 4, 5, 6, 7, 8)  # positions in a WINDOW_COLUMNS row
_STORED_GPU = (9, 10, 11, 12, 13, 14)
# What a window keeps of a step until it is split: both clocks' six timings and the loader waits, taken from
# a step row or a WINDOW_COLUMNS row into one layout (the rest of the row is let go at once).
_TIMINGS_OF_ROW = itemgetter(*_CPU_SPLIT, *_GPU_SPLIT, COL_DATA_WAIT, COL_DATA_IN_STEP)
_TIMINGS_OF_STORED = itemgetter(*_STORED_CPU, *_STORED_GPU, 15, 16)
_KEPT_CPU, _KEPT_GPU = (0, 1, 2, 3, 4, 5), (6, 7, 8, 9, 10, 11)


class RankWindow:
    """The last :data:`WINDOW` steps of one (run, rank, attempt) and its running totals.

    Each step is kept split into its parts on the CPU clock and, when the
    record has one, on the GPU clock (``steptime.StepParts``), split once, when
    the figures are next asked for: a live daemon asks every few seconds, and
    a step that left the window by then is never split.
    """

    __slots__ = ("records", "first_step", "last_step", "last_ts", "loss", "ratios", "steps", "ts", "_cpu", "_gpu",
                 "_unsplit", "timings", "arrays", "fresh_rows", "examples", "marks", "ended", "exit_code", "end_ts", "node", "seen", "fresh")

    def __init__(self) -> None:
        self.records = 0
        self.first_step: Optional[int] = None
        self.last_step: Optional[int] = None
        self.last_ts: Optional[float] = None
        self.loss: Optional[float] = None
        self.ratios: Optional[dict[str, float]] = None
        self.steps: deque = deque(maxlen=WINDOW)
        self.ts: deque = deque(maxlen=WINDOW)
        self._cpu: deque = deque(maxlen=WINDOW)  # Optional[StepParts] per step, CPU clock (see cpu)
        self._gpu: deque = deque(maxlen=WINDOW)  # Optional[StepParts] per step, GPU clock (see gpu)
        self._unsplit: deque = deque(maxlen=WINDOW)  # timings (_TIMINGS_OF_ROW layout) of steps not split yet
        #: every window step's timings (_TIMINGS_OF_ROW layout), split or not: what daemon/figures.py reads
        self.timings: deque = deque(maxlen=WINDOW)
        #: daemon/figures.py's copy of ``timings`` and ``ts`` as one float array (one row per window step, NaN for
        #: None), and how many steps entered the window since it was made (only those are converted next time)
        self.arrays: Optional[np.ndarray] = None
        self.fresh_rows = 0
        self.examples: deque = deque(maxlen=WINDOW)
        #: (ts, step, examples, bucket) of the first step of each rates.MARK_S of record time: the rate rule's
        #: seconds of records where the window's steps span less (a fast rank)
        self.marks: deque = deque(maxlen=MARKS)
        self.ended: Optional[str] = None  # the rank_end record's status, once it came
        self.exit_code: Optional[int] = None
        self.end_ts: Optional[float] = None  # the rank_end record's ts
        self.node: Optional[int] = None  # node_rank of the rank's stream header
        # When the ingester last took in a record of this rank (``rank_live.last_seen``), and whether one came
        # since the row was last written: a row rewritten only for its figures keeps the time records last came
        # (the stall rule and the rate rule measure the rank's silence by it).
        self.seen: Optional[float] = None
        self.fresh = False

    def took_records(self) -> None:
        """A record of this rank came in (a step, or its end): its row's ``last_seen`` is the write's time."""
        self.fresh = True

    def seen_at(self, now: float) -> float:
        """The row's ``last_seen`` for a write at ``now``: ``now`` when records came since the last write (or it
        was never written), else the time they last came."""
        if self.fresh or self.seen is None:
            self.seen = now
        self.fresh = False
        return self.seen

    def _append(self, step: int, ts: Optional[float], examples: Optional[int], timings: tuple) -> None:
        self.steps.append(step)
        self.ts.append(ts)
        self.examples.append(examples)
        if ts is not None:
            self._mark(step, ts, examples)
        self._unsplit.append(timings)  # one that leaves the window before the next split is never split
        self.timings.append(timings)
        self.fresh_rows += 1

    def _mark(self, step: int, ts: float, examples: Optional[int]) -> None:
        """Keep ``step`` as a mark when it is the first of a later ``rates.MARK_S`` of record time than the last
        mark's: marks only go forward in time (after a wall clock stepped back, none until it passes the last
        one), so that they stay in time order for the rate's binary search."""
        bucket = ts // rates.MARK_S
        marks = self.marks
        if not marks or bucket > marks[-1][3]:
            marks.append((ts, step, examples, bucket))

    def add_marks(self, rows: Iterable[Sequence]) -> None:
        """Mark older steps (``(step, ts, examples)`` rows, ascending step) that will not enter the window: those
        the rate's seconds reach back to, read from the index for a reloaded window (``Aggregates._load_tail``;
        a batch marks its own first rows in :meth:`_mark_before_tail`)."""
        for step, ts, examples in rows:
            if ts is not None:
                self._mark(step, ts, examples)

    def _split(self) -> None:
        """Split the steps that entered the window since the last call (the newest WINDOW of them)."""
        unsplit = self._unsplit
        if not unsplit:
            return
        cpu, gpu = self._cpu, self._gpu
        for t in unsplit:
            cpu.append(split_row(t, _KEPT_CPU, 12, 13))
            gpu.append(split_row(t, _KEPT_GPU, 12, 13))
        unsplit.clear()

    @property
    def cpu(self) -> deque:
        """The window's steps split on the CPU clock (``Optional[StepParts]`` per step, oldest first)."""
        self._split()
        return self._cpu

    @property
    def gpu(self) -> deque:
        """The window's steps split on the GPU clock (None for a step without a GPU traced time)."""
        self._split()
        return self._gpu

    def add_stored(self, rows: Sequence[Sequence]) -> None:
        """Append steps read back from the index (:data:`WINDOW_COLUMNS` rows, ascending step)."""
        for r in rows:
            self._append(r[0], r[1], r[2], _TIMINGS_OF_STORED(r))

    def add_rows(self, rows: Sequence[tuple], inserted: int) -> None:
        """Fold a batch of row tuples (file order) into the window."""
        self.add_columns(list(zip(*rows)), inserted)

    def add_columns(self, cols: Sequence[Sequence], inserted: int) -> None:
        """Fold a batch given as row columns (``zip(*rows)``, file order) into the window."""
        if cols and len(cols[COL_STEP]) == 1:  # the live case: one row per rank per pass
            self.add_row(tuple(c[0] for c in cols), inserted)
            return
        self.fresh = True
        self.records += inserted
        if not cols or not cols[COL_STEP]:
            return
        if len(cols[COL_STEP]) > WINDOW:  # the rows before the batch's newest WINDOW: marks for the rate only
            self._mark_before_tail(cols)
        tail = sorted(zip(*(c[-WINDOW:] for c in cols)), key=lambda r: r[COL_STEP])
        for r in tail:
            if self.steps and r[COL_STEP] <= self.steps[-1]:
                continue  # a duplicate or an older step must not disturb the window
            self._append(r[COL_STEP], r[COL_TS], r[COL_EXAMPLES], _TIMINGS_OF_ROW(r))
        steps = cols[COL_STEP]
        first = min(steps)
        self.first_step = first if self.first_step is None else min(self.first_step, first)
        top = max(steps)
        i = steps.index(top)  # the first row holding the largest step, as max(rows, key=step) picks
        if self.last_step is None or top > self.last_step:  # a repeat of the newest step keeps its first copy's
            self.last_step = top
            self.last_ts = cols[COL_TS][i]
            if cols[COL_LOSS][i] is not None:
                self.loss = cols[COL_LOSS][i]

    def _mark_before_tail(self, cols: Sequence[Sequence]) -> None:
        """Mark the batch's rows before its newest WINDOW (file order) as :meth:`add_row` would, one by one:
        a row new to the window (a step past every earlier one) whose time is in a later ``rates.MARK_S`` than
        every earlier marked row's (:meth:`_mark`'s rule, written as running maxima over the batch's columns;
        numpy's ``floor_divide`` is Python's ``//`` on floats)."""
        head = len(cols[COL_STEP]) - WINDOW
        steps = np.asarray(cols[COL_STEP][:head], dtype=np.int64)
        ts = np.asarray(cols[COL_TS][:head], dtype=np.float64)  # None -> NaN
        before = self.steps[-1] if self.steps else np.iinfo(np.int64).min
        new = steps > np.maximum.accumulate(np.concatenate(([before], steps[:-1])))
        idx = np.flatnonzero(new & ~np.isnan(ts))
        if not len(idx):
            return
        buckets = np.floor_divide(ts[idx], rates.MARK_S)
        last = self.marks[-1][3] if self.marks else -np.inf
        later = buckets > np.maximum.accumulate(np.concatenate(([last], buckets[:-1])))
        examples = cols[COL_EXAMPLES]
        for i, bucket in zip(idx[later][-MARKS:].tolist(), buckets[later][-MARKS:].tolist()):
            self.marks.append((cols[COL_TS][i], cols[COL_STEP][i], examples[i], bucket))

    def add_row(self, r: Sequence, inserted: int) -> None:
        """Fold one row tuple into the window (what :meth:`add_columns` does with a one-row batch)."""
        self.fresh = True
        self.records += inserted
        step = r[COL_STEP]
        if not self.steps or step > self.steps[-1]:  # a duplicate or an older step must not disturb the window
            self._append(step, r[COL_TS], r[COL_EXAMPLES], _TIMINGS_OF_ROW(r))
        if self.first_step is None or step < self.first_step:
            self.first_step = step
        if self.last_step is None or step > self.last_step:  # a repeat of the newest step keeps its first copy's
            self.last_step = step
            self.last_ts = r[COL_TS]
            if r[COL_LOSS] is not None:
                self.loss = r[COL_LOSS]

    def take_ratios(self, latest: Optional[tuple[int, dict[str, float]]], before: Optional[int]) -> None:
        """Take a block's newest ratios (:func:`latest_ratios`) when their step is past ``before``, the rank's
        newest stored step before the block (None: take them): ratios of a step stored already are a later
        copy's, never the kept row's (docs/daemon.md rule 2)."""
        if latest is not None and (before is None or latest[0] > before):
            self.ratios = latest[1]

    def clock(self) -> str:
        """``gpu`` when every step in the window has a GPU traced time, else ``cpu`` (the summary's rule)."""
        return "gpu" if self.gpu and all(p is not None for p in self.gpu) else "cpu"

    def step_parts(self) -> Optional[dict[str, Any]]:
        """The window's step time and parts, averaged over the same steps by :func:`steptime.average_parts`.

        ``{"whole": ms, <part>: ms or None (not measured) for each of steptime.PART_NAMES, "traced": ms,
        "steps": n, "steps_without_gap": n, "clock": "cpu" | "gpu"}``; None when no step has a traced time.
        """
        clock = self.clock()
        avg = steptime.average_parts(self.gpu if clock == "gpu" else self.cpu)
        if avg is None:
            return None
        return {"whole": avg.whole, **avg.parts, "traced": avg.traced, "steps": avg.steps,
                "steps_without_gap": avg.steps_without_gap, "clock": clock}

    def rates(self) -> tuple[Optional[float], Optional[float]]:
        """(steps/s, examples/s) over the window's last seconds of records: the rate rule (:mod:`daemon.rates`).

        Cheap (a walk back over the last few seconds of steps), so the live daemon writes it on every write,
        not only when the medians are recomputed.
        """
        found = rates.window_rate(self.steps, self.ts, self.examples, marks=self.marks)
        return (None, None) if found is None else (found.steps_per_s, found.examples_per_s)

    def figures(self) -> dict[str, Any]:
        """Rolling figures over the window.

        ``median_step_ms`` is the median step time (gap + traced step) and
        ``median_input_wait_ms`` the median gap over the same steps (an
        attempt's first step counts its unknown gap as 0, as the averages do;
        None when no step's gap is known), both on the clock of ``step_parts``.
        """
        interval = None
        if len(self.steps) >= 2:
            gaps = [b - a for a, b in zip(self.ts, list(self.ts)[1:]) if a is not None and b is not None]
            interval = statistics.median(gaps) if gaps else None
        steps_per_s, examples_per_s = self.rates()
        parts = [p for p in (self.gpu if self.clock() == "gpu" else self.cpu) if p is not None]
        return {
            "median_step_ms": statistics.median(p.whole for p in parts) if parts else None,
            "median_input_wait_ms": (statistics.median(p.input_wait for p in parts)
                                     if any(p.gap_known for p in parts) else None),
            "median_interval_s": interval,
            "steps_per_s": steps_per_s,
            "examples_per_s": examples_per_s,
            "step_parts": self.step_parts(),
        }


def latest_ratios(steps: Sequence[records.Step], tail: int = 0) -> Optional[tuple[int, dict[str, float]]]:
    """The newest component ratios among the last ``tail`` records of ``steps`` (one rank's, file order; all of
    them when ``tail`` is 0): ``(step, {name: ratio})`` of the newest step whose kept row, the first record of
    that step in ``steps`` (docs/daemon.md rule 2), has components (null ratios left out); None when none has.

    A later copy of a step never gives its components: where the kept copy has none, an older step's count.
    """
    found = [s for s in (steps[-tail:] if tail else steps) if s.components]
    if not found:
        return None
    numbers = None
    for s in sorted(found, key=_step_of, reverse=True):  # stable: of equal steps the earlier record first
        if numbers is None:
            numbers = list(map(_step_of, steps))
        kept = steps[numbers.index(s.step)]
        if kept.components:
            return kept.step, {name: c.ratio for name, c in kept.components.items() if c.ratio is not None}
    return None


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


def _clean(x: np.ndarray, missing: float) -> np.ndarray:
    """``steptime``'s rule for one timing, on arrays: finite ≥ 0 kept, finite < 0 → 0, NaN/±inf → ``missing``."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(x), np.where(x >= 0.0, x, 0.0), missing)


def gap_ms(gap: np.ndarray) -> np.ndarray:
    """The gap since the previous step's end as the step time counts it (NaN where unknown: a first step)."""
    return _clean(gap, np.nan)


def whole_step_ms(traced: np.ndarray, gap: np.ndarray) -> np.ndarray:
    """Step time per row (ms): ``steptime.split_step(traced, gap, ...).whole`` on arrays (NaN = missing).

    Traced step + gap, the gap counting only where known (an attempt's first
    step is its traced time); a missing or non-finite traced time gives NaN.
    Bit-for-bit the core's value (same clean rule, same single addition); the
    property test in ``tests/test_daemon_steptime.py`` holds it to that.
    """
    t = _clean(traced, np.nan)
    known = np.isfinite(gap)
    with np.errstate(over="ignore"):  # two timings near 1e308 sum to inf, as the core's float addition gives
        return np.where(known, t + _clean(gap, 0.0), t)


def _column(col: Sequence, n: int) -> np.ndarray:
    if col[0] is None and col.count(None) == n:
        return np.full(n, np.nan)
    return np.array(col, dtype=np.float64)  # None becomes NaN


def series_values(rows: Sequence[tuple], cols: Optional[Sequence[Sequence]] = None) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) arrays for the wide series table from row tuples (or their columns, ``zip(*rows)``).

    ``step_ms`` / ``gpu_step_ms`` are the step time on each clock
    (:func:`whole_step_ms`), ``input_wait_ms`` the CPU gap (:func:`gap_ms`); the
    others are the record's values.
    """
    if cols is None:
        cols = list(zip(*rows))  # transpose in C
    n = len(cols[COL_STEP]) if cols else 0
    steps = np.array(cols[COL_STEP], dtype=np.float64)
    values = np.empty((n, len(SERIES_COLS)), dtype=np.float64)
    wait = _column(cols[COL_INPUT_WAIT], n)
    values[:, 0] = whole_step_ms(_column(cols[COL_STEP_MS], n), wait)
    values[:, 1] = gap_ms(wait)
    gpu = _column(cols[COL_GPU_STEP], n)
    values[:, 2] = gpu if np.isnan(gpu).all() else whole_step_ms(gpu, _column(cols[COL_GPU_INPUT_WAIT], n))
    for j, c in enumerate(SERIES_COLS[3:], start=3):
        values[:, j] = _column(cols[c], n)
    return steps, values


def run_median_interval(intervals: Iterable[Optional[float]]) -> Optional[float]:
    """The run's median step interval (``runs.median_interval_s``, read by the stall rule) from the newest
    attempt of each rank's; None when no rank has one.

    This is the only per-run figure the ingester rolls up: the run's steps/s, examples/s, slowest rank and
    straggler score are not stored, the reader computes them when read by the rate rule and the straggler
    rule (docs/daemon.md, "One set of figures").
    """
    known = [i for i in intervals if i is not None]
    return statistics.median(known) if known else None
