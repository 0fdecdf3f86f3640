"""Latent field-collapse QC (seed 004, "Run Predeclared, Outcome-Blind Longitudinal QC").

A model that emits a latent or parameter field records, at the QC cadence, the
field's median, a low and a high percentile and its bound occupancy, computed in
the field's own space (log for a log-parameterized coordinate). Field collapse
is invisible in reconstruction error, so a field whose spread
(``p_high - p_low`` in its own space) falls below a predeclared factor of its
initial spread is reported as a failure.

Pure functions here; :func:`load_field_records` and :func:`summarize` are the
only ones that read files. numpy is imported lazily (only to compute statistics).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Optional

from traceml_tui.core import jsonl, records
from traceml_tui.core.rundir import RunDir

SPACES = ("linear", "log")
DEFAULT_FACTOR = 0.1
DEFAULT_QUANTILES = (5.0, 95.0)
#: A value counts as "at a bound" when it lies within this fraction of the bound range
#: (in the field's own space) of the bound, or beyond it.
BOUND_TOLERANCE = 0.01

OK, FAILED, NO_REFERENCE = "ok", "failed", "no_reference"


def _as_numpy(values: Any):
    import numpy as np

    if hasattr(values, "detach"):  # a torch tensor: copy to host without importing torch
        values = values.detach()
        if hasattr(values, "float"):
            values = values.float()
        values = values.cpu().numpy()
    return np.asarray(values, dtype=np.float64).ravel()


def _to_space(x: float, space: str) -> float:
    return math.log(x) if space == "log" else x


def compute_field_stats(
    values: Any,
    *,
    space: str = "linear",
    bounds: Optional[tuple[Optional[float], Optional[float]]] = None,
    quantiles: tuple[float, float] = DEFAULT_QUANTILES,
) -> dict[str, Any]:
    """Distribution statistics of one field, in the field's own space.

    ``values``: any array-like (numpy, CPU/GPU tensor, list). ``space="log"``
    takes the natural log first; non-positive values cannot live in log space
    and are left out like non-finite ones. ``bounds`` are in the field's natural
    units; occupancy is the fraction of values within :data:`BOUND_TOLERANCE`
    of the bound range from a bound (or beyond it). Returns a dict with
    ``median``, ``p_low``, ``p_high``, ``occupancy``, ``count`` (None where
    there is no finite value or no bound).
    """
    import numpy as np

    if space not in SPACES:
        raise ValueError(f"space must be one of {', '.join(SPACES)}, not {space!r}")
    q_low, q_high = float(quantiles[0]), float(quantiles[1])
    if not 0.0 <= q_low < q_high <= 100.0:
        raise ValueError("quantiles must satisfy 0 <= low < high <= 100")
    lower, upper = (bounds if bounds is not None else (None, None))
    if lower is not None and upper is not None and not float(lower) < float(upper):
        raise ValueError("bounds must satisfy lower < upper")
    if space == "log" and ((lower is not None and lower <= 0) or (upper is not None and upper <= 0)):
        raise ValueError("bounds of a log-space field must be positive")
    x = _as_numpy(values)
    if space == "log":
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.log(np.where(x > 0, x, np.nan))
    x = x[np.isfinite(x)]
    out: dict[str, Any] = {"median": None, "p_low": None, "p_high": None, "occupancy": None, "count": int(x.size),
                           "q_low": q_low, "q_high": q_high,
                           "lower": None if lower is None else float(lower),
                           "upper": None if upper is None else float(upper)}
    if x.size == 0:
        return out
    p_low, median, p_high = np.percentile(x, [q_low, 50.0, q_high])
    out.update(median=float(median), p_low=float(p_low), p_high=float(p_high))
    if lower is not None or upper is not None:
        lo = _to_space(float(lower), space) if lower is not None else None
        hi = _to_space(float(upper), space) if upper is not None else None
        # without both bounds there is no range: the tolerance falls back to the data's own range
        scale = (hi - lo) if (lo is not None and hi is not None) else float(x.max() - x.min())
        tol = BOUND_TOLERANCE * scale
        at = np.zeros(x.shape, dtype=bool)
        if lo is not None:
            at |= x <= lo + tol
        if hi is not None:
            at |= x >= hi - tol
        out["occupancy"] = float(at.mean())
    return out


def spread(record: records.FieldStats) -> Optional[float]:
    """``p_high - p_low`` in the field's own space (None when unknown)."""
    if record.p_low is None or record.p_high is None:
        return None
    return record.p_high - record.p_low


def collapse_status(series: Iterable[records.FieldStats], factor: Optional[float] = None) -> dict[str, Any]:
    """Collapse verdict of one field from its QC records.

    The reference is the spread at the field's first QC point with a known
    spread (normally initialization). The field fails at the first QC point
    whose spread is below ``factor`` x reference, and stays failed (a collapse
    is a failure of the run even if the field later recovers). ``factor`` defaults
    to the factor declared in the records, else :data:`DEFAULT_FACTOR`.
    A zero initial spread gives ``no_reference``: there is nothing to collapse from.
    """
    points = sorted(series, key=lambda r: (r.step, r.attempt, r.ts))
    declared = next((r.factor for r in reversed(points) if r.factor is not None), None)
    factor = float(factor if factor is not None else declared if declared is not None else DEFAULT_FACTOR)
    reference: Optional[records.FieldStats] = None
    failed_at: Optional[int] = None
    last_ratio: Optional[float] = None
    for rec in points:
        width = spread(rec)
        if width is None:
            continue
        if reference is None:
            reference = rec
            continue
        ref_width = spread(reference) or 0.0
        if ref_width <= 0.0:
            continue
        last_ratio = width / ref_width
        if failed_at is None and last_ratio < factor:
            failed_at = rec.step
    latest = points[-1] if points else None
    if reference is None or (spread(reference) or 0.0) <= 0.0:
        status = NO_REFERENCE
    else:
        status = FAILED if failed_at is not None else OK
    return {
        "status": status,
        "space": latest.space if latest is not None else None,
        "factor": factor,
        "qc_points": len(points),
        "initial_step": reference.step if reference is not None else None,
        "initial_spread": spread(reference) if reference is not None else None,
        "latest_step": latest.step if latest is not None else None,
        "latest_spread": spread(latest) if latest is not None else None,
        "latest_spread_ratio": last_ratio,
        "failed_at_step": failed_at,
        "latest_median": latest.median if latest is not None else None,
        "latest_occupancy": latest.occupancy if latest is not None else None,
    }


def summarize_records(field_records: Iterable[records.FieldStats]) -> dict[str, Any]:
    """The summary's ``qc.fields`` section from field_stats records (all ranks, all attempts).

    Each field is judged from the lowest rank that recorded it (fields are
    normally recorded by rank 0; other ranks would repeat the same verdict).
    A resumed step keeps the newest attempt's record.
    """
    by_name: dict[str, dict[int, dict[int, records.FieldStats]]] = {}
    for rec in field_records:
        steps = by_name.setdefault(rec.name, {}).setdefault(rec.rank, {})
        old = steps.get(rec.step)
        if old is None or (rec.attempt, rec.ts) >= (old.attempt, old.ts):
            steps[rec.step] = rec
    fields: dict[str, Any] = {}
    for name in sorted(by_name):
        rank = min(by_name[name])
        verdict = collapse_status(by_name[name][rank].values())
        verdict["rank"] = rank
        fields[name] = verdict
    failed = sorted(n for n, v in fields.items() if v["status"] == FAILED)
    return {
        "status": (FAILED if failed else OK) if fields else "not_recorded",
        "failed_fields": failed,
        "fields": fields,
    }


def load_field_records(run_dir: Path) -> list[records.FieldStats]:
    """Every field_stats record of every rank's step streams (complete lines only)."""
    out: list[records.FieldStats] = []
    for stream in RunDir(run_dir).step_files():
        # cheap filter before decoding: most lines are step records
        lines = [line for line in jsonl.read_lines(stream.path) if b"field_stats" in line]
        out.extend(jsonl.iter_records(lines, (records.FieldStats,)))
    return out


def summarize(run_dir: Path) -> dict[str, Any]:
    """Field-collapse QC of a run directory, for ``final_summary.json`` (section ``qc``)."""
    return summarize_records(load_field_records(Path(run_dir)))
