"""Rolling figures of many ranks at once, on arrays (docs/daemon.md, "Live path": figures on columns).

A live daemon recomputes a rank's rolling figures (:meth:`daemon.live.RankWindow.figures`: the median step
time and gap, the median interval, the step parts averaged by :func:`traceml_tui.core.steptime.average_parts`)
every few seconds per rank; with a thousand ranks that is a hundred or more windows of 64 steps per pass,
and step by step in Python (a split per step, a sum of seven parts per step, two sorts) it cost ~20 µs of
the pass's CPU per record. :func:`figures_many` computes the same figures for every window of a pass in one
numpy pass over a (windows × steps) layout.

Same values, bit for bit, as the window's own :meth:`~daemon.live.RankWindow.figures` (which stays the
definition, and the path of ``--once`` and of a rebuilt rank): each step is split by the core's rules
(:mod:`traceml_tui.core.steptime`: a missing or non-finite timing is not measured, a negative one is 0, the
loader wait in the gap capped at the gap, phases longer than their envelope scaled down), every sum is taken
in the core's order (``np.cumsum`` along a row, which adds left to right as the core's loop does; missing
steps add an exact 0.0) and every median is the middle of a stable sort (``statistics.median``'s). A window
this module cannot hold to that (a record time that is not a finite float) is computed by the window itself.
``tests/test_live_figures.py`` holds the two equal over hypothesis-drawn windows.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Optional, Sequence

import numpy as np

from traceml_tui.core import steptime

from . import live

_PARTS = steptime.PART_NAMES  # data_wait, between_steps, h2d, forward, backward, optimizer, residual
# Positions in a window's kept timings (live._TIMINGS_OF_ROW): each clock's traced, gap, h2d, forward, backward,
# optimizer, then the loader waits (CPU-measured, used on both clocks).
_CPU, _GPU = slice(0, 6), slice(6, 12)
_DATA_WAIT, _DATA_IN_STEP = 12, 13
_COLS = 14  # a kept timings tuple's length


def _clean(x: np.ndarray) -> np.ndarray:
    """``steptime._clean`` on arrays (NaN = None): finite ≥ 0 kept (-0.0 too), finite < 0 → 0, else NaN."""
    return np.where(np.isfinite(x), np.where(x >= 0.0, x, 0.0), np.nan)


def _in_order(x: np.ndarray) -> np.ndarray:
    """Per row, ``0.0 + x[0] + x[1] + …`` added left to right, as the core's loop does (``accumulate`` is
    sequential by definition; a 0.0 column first makes the start the loop's)."""
    return np.cumsum(np.concatenate((np.zeros((len(x), 1)), x), axis=1), axis=1)[:, -1]


def _median(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per row, ``statistics.median`` of the valid entries (NaN where there are none): the middle of a stable
    sort, or the mean of the two middle values computed as the core does."""
    s = np.sort(np.where(valid, x, np.nan), axis=1, kind="stable")  # NaN sorts last
    k = valid.sum(axis=1)
    rows = np.arange(len(x))
    hi = s[rows, np.minimum(k // 2, s.shape[1] - 1)] if s.shape[1] else np.full(len(x), np.nan)
    lo = s[rows, np.maximum(k // 2 - 1, 0)] if s.shape[1] else np.full(len(x), np.nan)
    return np.where(k == 0, np.nan, np.where(k % 2 == 1, hi, (lo + hi) / 2))


def _split(t_raw: np.ndarray, data_wait: np.ndarray, data_in_step: np.ndarray):
    """``steptime.split_step`` of every step on one clock (``t_raw``: windows × steps × 6 timings): whole,
    traced, the seven parts (in ``PART_NAMES`` order), which parts each step measured, its gap known, valid."""
    t = _clean(t_raw[..., 0])
    valid = ~np.isnan(t)
    gap = _clean(t_raw[..., 1])
    known = ~np.isnan(gap)
    dw = _clean(data_wait)
    dw_known = known & ~np.isnan(dw)
    data = np.where(dw_known, np.where(dw < gap, dw, gap), 0.0)
    between = np.where(known, gap - data, 0.0)
    whole = np.where(known, t + gap, t)
    inner = [_clean(data_in_step), _clean(t_raw[..., 2]), _clean(t_raw[..., 3]), _clean(t_raw[..., 4]),
             _clean(t_raw[..., 5])]  # data_in_step, h2d, forward, backward, optimizer: the core's order
    seen = [~np.isnan(v) for v in inner]
    vals = [np.where(s, v, 0.0) for v, s in zip(inner, seen)]
    total = np.zeros_like(t)
    for v in vals:
        total = total + v
    over = total > t
    scale = np.where(over, t / np.where(over, total, 1.0), 1.0)
    vals = [np.where(over, v * scale, v) for v in vals]
    residual = np.where(over, 0.0, t - total)
    ds, hd, fw, bw, op = vals
    parts = (data + ds, between, hd, fw, bw, op, residual)
    measured = (dw_known | seen[0], known, seen[1], seen[2], seen[3], seen[4], np.ones_like(valid))
    return whole, t, parts, measured, known, valid


def figures_many(windows: Sequence[live.RankWindow]) -> list[dict[str, Any]]:
    """:meth:`live.RankWindow.figures` of each of ``windows``, computed together (see the module docstring)."""
    out: list[Optional[dict[str, Any]]] = [None] * len(windows)
    fast = []
    for i, w in enumerate(windows):
        if w.timings:
            fast.append(i)
        else:
            out[i] = w.figures()
    if fast:
        for i, fig in zip(fast, _figures_arrays([windows[i] for i in fast])):
            out[i] = fig
    return out  # type: ignore[return-value]


_PLAIN_TS = {float, type(None)}


def _ts_odd(ts: Sequence) -> bool:
    """True when a window's record times hold anything but floats and None (their differences are then the
    window's own to take)."""
    return not _PLAIN_TS.issuperset(map(type, ts))


def _window_arrays(windows: Sequence[live.RankWindow]) -> list[np.ndarray]:
    """Each window's steps as one float array (``timings`` then ``ts`` per row, NaN for None), oldest first.

    Turning Python values into floats costs ~1 µs a step, more than the figures themselves: each window keeps
    its array (``RankWindow.arrays``) and only the steps that entered it since are converted, every window's
    together in one call."""
    new_rows, new_ts, counts = [], [], []
    for w in windows:
        k = min(w.fresh_rows, len(w.timings))
        if w.arrays is None:
            k = len(w.timings)
        start = len(w.timings) - k
        new_rows.extend(islice(w.timings, start, None))
        new_ts.extend(islice(w.ts, start, None))
        counts.append(k)
    fresh = np.empty((len(new_rows), _COLS + 1))
    if new_rows:
        fresh[:, :_COLS] = np.array(new_rows, dtype=np.float64)  # None → NaN
        fresh[:, _COLS] = np.array(new_ts, dtype=np.float64)
    out = []
    at = 0
    for w, k in zip(windows, counts):
        part = fresh[at:at + k]
        at += k
        n = len(w.timings)
        if w.arrays is None or k >= n:
            arr = part
        elif k:
            arr = np.concatenate((w.arrays, part))[-n:]
        else:
            arr = w.arrays
        w.arrays = arr
        w.fresh_rows = 0
        out.append(arr)
    return out


def _figures_arrays(windows: Sequence[live.RankWindow]) -> list[dict[str, Any]]:
    arrays = _window_arrays(windows)
    lens = np.array([len(a) for a in arrays], dtype=np.int64)
    n_w, width = len(windows), int(lens.max())
    both = np.full((n_w, width, _COLS + 1), np.nan)
    for i, a in enumerate(arrays):
        both[i, :len(a)] = a
    grid, ts = both[..., :_COLS], both[..., _COLS]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        dw, ds = grid[..., _DATA_WAIT], grid[..., _DATA_IN_STEP]
        in_window = np.arange(width)[None, :] < lens[:, None]
        # The summary's rule: the GPU clock when every step of the window has a GPU traced time.
        on_gpu = np.all(np.isfinite(grid[..., _GPU.start]) | ~in_window, axis=1)  # a finite traced time splits
        clock = grid[..., _CPU] if not on_gpu.any() else np.where(on_gpu[:, None, None], grid[..., _GPU],
                                                                   grid[..., _CPU])
        whole, traced, parts, measured, known, valid = _split(clock, dw, ds)
        n = valid.sum(axis=1)
        no_gap = (valid & ~known).sum(axis=1)
        whole_sum = _in_order(np.where(valid, whole, 0.0))
        traced_sum = _in_order(np.where(valid, traced, 0.0))
        part_sums = [_in_order(np.where(valid, p, 0.0)) for p in parts]
        part_seen = [np.any(valid & m, axis=1) for m in measured]
        med_whole = _median(whole, valid)
        med_wait = _median(whole - traced, valid)
        any_gap = np.any(valid & known, axis=1)
        gaps = ts[:, 1:] - ts[:, :-1]
        gap_ok = ~np.isnan(ts[:, 1:]) & ~np.isnan(ts[:, :-1])
        med_interval = _median(gaps, gap_ok)
    n_l, no_gap_l = n.tolist(), no_gap.tolist()
    whole_l, traced_l = whole_sum.tolist(), traced_sum.tolist()
    sums_l = [s.tolist() for s in part_sums]
    seen_l = [s.tolist() for s in part_seen]
    med_whole_l, med_wait_l, any_gap_l = med_whole.tolist(), med_wait.tolist(), any_gap.tolist()
    interval_l, gpu_l, lens_l = med_interval.tolist(), on_gpu.tolist(), lens.tolist()
    # A record time that is not finite (or not a float) would make the core's differences differ from these.
    odd = (np.isinf(ts).any(axis=1) | np.isinf(med_interval)).tolist()
    out = []
    for i, w in enumerate(windows):
        if odd[i] or _ts_odd(w.ts):
            out.append(w.figures())
            continue
        steps_per_s, examples_per_s = w.rates()
        count = n_l[i]
        parts_avg = None
        if count:
            avg: dict[str, Any] = {"whole": whole_l[i] / count}
            for j, name in enumerate(_PARTS):
                avg[name] = sums_l[j][i] / count if seen_l[j][i] else None
            avg.update(traced=traced_l[i] / count, steps=count, steps_without_gap=no_gap_l[i],
                       clock="gpu" if gpu_l[i] else "cpu")
            parts_avg = avg
        out.append({
            "median_step_ms": med_whole_l[i] if count else None,
            "median_input_wait_ms": med_wait_l[i] if count and any_gap_l[i] else None,
            "median_interval_s": interval_l[i] if lens_l[i] >= 2 and interval_l[i] == interval_l[i] else None,
            "steps_per_s": steps_per_s,
            "examples_per_s": examples_per_s,
            "step_parts": parts_avg,
        })
    return out
