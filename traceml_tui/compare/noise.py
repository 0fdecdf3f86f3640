"""Noise evidence from per-step records beside the two summaries.

When both run directories still hold their rank streams
(:meth:`traceml_tui.core.rundir.RunDir.step_files`), a bootstrap over steps gives a
95% interval for the ratio of mean Step Time candidate/reference. It adds
evidence next to the CI result; it never changes it (the seed's rule
decides). Steps within one run are autocorrelated, so the interval is a
lower bound on the real run-to-run spread — it says "this pair is close to
the line", not "this difference is significant".

numpy and the record decoder are imported only when records exist, so a
plain ``traceml compare`` never pays for them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence

from traceml_tui.core.rundir import RunDir  # cheap (no msgspec): the record decoder stays lazy

SEED = 20240917
RESAMPLES = 2000
#: Steps kept per run (the latest ones in the analyzed window); bounds time and memory.
MAX_STEPS = 50_000
#: Bytes of step streams read per run before giving up on the rest.
MAX_STREAM_BYTES = 512 * 1024 * 1024


def step_files(run_dir: Path) -> list[Path]:
    """The rank step streams of one run directory (regular files only, no links)."""
    return [stream.path for stream in RunDir(run_dir).step_files()]


def read_step_times(run_dir: Path, clock: str, window: tuple[Optional[int], Optional[int]]) -> list[float]:
    """Per-step Step Time on ``clock`` (mean over ranks), in step order.

    Step Time is the summary's (:mod:`traceml_tui.core.steptime`: the gap since
    the previous step's end plus the traced step), so the interval is about the
    figure the CI result judges. A later attempt's record of the same (rank, step) replaces an earlier
    one (a resume re-runs steps). Malformed lines are skipped: noise is
    context, and the summary already passed strict reading.
    """
    from traceml_tui.core import jsonl, records, steptime

    start, end = window
    per_rank_step: dict[tuple[int, int], float] = {}
    budget = MAX_STREAM_BYTES
    # oldest attempt first, so a later attempt's record of a (rank, step) replaces an earlier one
    for path in [s.path for s in sorted(RunDir(run_dir).step_files(), key=lambda s: s.attempt)]:
        try:
            with open(path, "rb") as handle:
                for line in jsonl.stream_lines(handle):  # complete lines only (core/jsonl.py)
                    budget -= len(line) + 1
                    if budget < 0:
                        break
                    if b'"step"' not in line:
                        continue
                    record = next(jsonl.iter_records((line,), (records.Step,)), None)
                    if record is None:
                        continue
                    if start is not None and record.step < start or end is not None and record.step > end:
                        continue
                    parts = steptime.step_parts(record.gpu_ms if clock == "gpu" else record.cpu_ms)
                    value = parts.whole if parts is not None else None
                    if value is not None and value > 0:
                        per_rank_step[(record.rank, record.step)] = value
        except OSError:
            continue
        if budget < 0:
            break
    by_step: dict[int, list[float]] = {}
    for (_rank, step), value in per_rank_step.items():
        by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)[-MAX_STEPS:]
    return [sum(by_step[s]) / len(by_step[s]) for s in steps]


def bootstrap_ratio(
    reference: Sequence[float],
    candidate: Sequence[float],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float, float]:
    """(ratio of means, 2.5th percentile, 97.5th percentile) of candidate/reference.

    Each resample draws steps with replacement from each run independently.
    A fixed seed makes the interval reproducible for the same records.
    """
    import numpy as np

    ref = np.asarray(reference, dtype=float)
    cand = np.asarray(candidate, dtype=float)
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    # Chunk the resamples so that memory stays ~16 MB whatever the run length.
    chunk = max(1, 2_000_000 // max(len(ref), len(cand)))
    done = 0
    while done < resamples:
        n = min(chunk, resamples - done)
        ref_means = ref[rng.integers(0, len(ref), size=(n, len(ref)))].mean(axis=1)
        cand_means = cand[rng.integers(0, len(cand), size=(n, len(cand)))].mean(axis=1)
        ratios[done : done + n] = cand_means / ref_means
        done += n
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(cand.mean() / ref.mean()), float(low), float(high)


def _window(summary: dict[str, Any]) -> tuple[Optional[int], Optional[int]]:
    from traceml_tui.compare.policy import nested

    window = nested(summary, "step_time", "global", "window")
    bounds = []
    for key in ("start_step", "end_step"):
        value = window.get(key) if isinstance(window, dict) else None
        bounds.append(value if isinstance(value, int) and not isinstance(value, bool) else None)
    return bounds[0], bounds[1]


def noise_section(
    reference_summary: dict[str, Any],
    candidate_summary: dict[str, Any],
    reference_dir: Path,
    candidate_dir: Path,
    clock: Optional[str],
    threshold_pct: Optional[float],
) -> Optional[dict[str, Any]]:
    """The ``noise`` section of a report, or None when records are not beside both summaries."""
    if not step_files(reference_dir) or not step_files(candidate_dir):
        return None
    base = {"status": "unavailable", "clock": clock, "seed": SEED, "resamples": RESAMPLES}
    if clock is None:
        return {**base, "note": "No common Step Time clock, so no noise estimate."}
    ref = read_step_times(reference_dir, clock, _window(reference_summary))
    cand = read_step_times(candidate_dir, clock, _window(candidate_summary))
    if len(ref) < 2 or len(cand) < 2:
        return {
            **base,
            "reference_steps": len(ref),
            "candidate_steps": len(cand),
            "note": f"Too few step records on the {clock.upper()} clock for a noise estimate "
            f"({len(ref)} reference, {len(cand)} candidate; at least 2 each).",
        }
    ratio, low, high = bootstrap_ratio(ref, cand)
    pct_low, pct_high = (low - 1.0) * 100.0, (high - 1.0) * 100.0
    note = None
    if threshold_pct is not None:
        for edge in {threshold_pct, -threshold_pct}:
            if pct_low < edge < pct_high:
                note = (
                    f"The 95% interval ({pct_low:+.2f}% to {pct_high:+.2f}%) straddles the "
                    f"{edge:+g}% threshold: a rerun of this same pair could land on the other side."
                )
                break
    return {
        **base,
        "status": "ok",
        "reference_steps": len(ref),
        "candidate_steps": len(cand),
        "ratio": ratio if math.isfinite(ratio) else None,
        "ratio_interval_95": [low, high],
        "pct_interval_95": [pct_low, pct_high],
        "note": note,
    }
