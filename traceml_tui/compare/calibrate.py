"""``traceml compare --calibrate``: choose a threshold from repeated reference runs.

Seed 000 step 5 asks users to repeat the reference workload before choosing
a threshold. Given two or more summaries of the same declared workload, this
reports the spread of their Step Time and suggests a threshold that none of
the repeats would have failed against each other, with headroom.
Pure: summaries in, a dict out.
"""

from __future__ import annotations

import math
from typing import Any

from traceml_tui.compare import policy

#: Headroom multiplied onto the widest observed spread.
HEADROOM = 1.5
MIN_SUGGESTION_PCT = 1.0


def calibrate(runs: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Spread of Step Time over repeated runs and a suggested threshold.

    A run unusable on its own (no valid declaration or topology, not
    completed, no positive Step Time) is excluded with its own reason; every
    other run must be CI-eligible against the first usable one (same
    declaration and topology, a shared clock). Excluded runs are listed with
    their reason. ``result`` is ``"OK"`` or ``"INCONCLUSIVE"`` (fewer than
    two usable runs or no clock they all share).
    """
    included: list[tuple[str, dict[str, Any]]] = []
    excluded = []
    for label, summary in runs:
        reason = policy.summary_problem(summary)
        if reason is None and included:
            first = included[0][1]
            reason = policy.eligibility(first, summary, policy.step_time_evidence(first, summary))
        if reason is None:
            included.append((label, summary))
        else:
            excluded.append({"label": label, "reason_code": reason[0], "reason": reason[1]})

    clocks = [policy.clock_step_times(s) for _, s in included]
    clock = next(
        (
            name
            for name in ("gpu", "cpu")
            if all(c[name] is not None and math.isfinite(c[name]) and c[name] > 0 for c in clocks)
        ),
        None,
    )
    out: dict[str, Any] = {
        "result": "INCONCLUSIVE",
        "clock": clock,
        "runs": [],
        "excluded": excluded,
        "mean_ms": None,
        "min_ms": None,
        "max_ms": None,
        "stdev_ms": None,
        "cv_pct": None,
        "spread_pct": None,
        "suggested_threshold_pct": None,
        "note": None,
    }
    if len(included) < 2:
        out["note"] = "At least two runs of the same declared workload are needed; fewer were usable."
        return out
    if clock is None:
        out["note"] = "The usable runs share no positive Step Time clock (all GPU or all CPU)."
        return out
    values = [c[clock] for c in clocks]
    out["runs"] = [
        {"label": label, "step_time_ms": value, "steps_analyzed": policy.steps_analyzed(s)}
        for (label, s), value in zip(included, values)
    ]
    mean = sum(values) / len(values)
    stdev = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    low, high = min(values), max(values)
    # The widest pairwise change between repeats is max vs min with min as reference.
    spread = 100.0 * (high - low) / low
    out.update(
        result="OK",
        mean_ms=mean,
        min_ms=low,
        max_ms=high,
        stdev_ms=stdev,
        cv_pct=100.0 * stdev / mean,
        spread_pct=spread,
        suggested_threshold_pct=suggest_threshold(spread),
    )
    if len(values) < 3:
        out["note"] = "Two runs give only a rough idea of the spread; three to five repeats are better."
    return out


def suggest_threshold(spread_pct: float) -> float:
    """Widest observed spread × headroom, rounded up to a whole percent (≥ 1%)."""
    return max(MIN_SUGGESTION_PCT, float(math.ceil(spread_pct * HEADROOM - 1e-9)))


def render_calibration(report: dict[str, Any]) -> str:
    """Plain-text calibration report."""
    lines = [f"TraceML calibrate: {report['result']}"]
    if report["result"] == "OK":
        lines.append(
            f"Suggested --max-step-time-regression-pct {report['suggested_threshold_pct']:g} "
            f"(widest spread between repeats {report['spread_pct']:.2f}% x {HEADROOM:g} headroom, rounded up)."
        )
        lines.append("")
        lines.append(f"{report['clock'].upper()} Step Time of {len(report['runs'])} runs:")
        width = max(len(r["label"]) for r in report["runs"])
        for run in report["runs"]:
            steps = run["steps_analyzed"]
            lines.append(
                f"  {run['label'].ljust(width)}  {run['step_time_ms']:.4g} ms"
                + (f"  ({steps} steps)" if steps is not None else "")
            )
        lines.append(
            f"  mean {report['mean_ms']:.4g} ms, min {report['min_ms']:.4g} ms, max {report['max_ms']:.4g} ms, "
            f"stdev {report['stdev_ms']:.3g} ms (CV {report['cv_pct']:.2f}%)"
        )
    for item in report["excluded"]:
        lines.append(f"Excluded {item['label']}: [{item['reason_code']}] {item['reason']}")
    if report["note"]:
        lines.append(report["note"])
    return "\n".join(lines) + "\n"
