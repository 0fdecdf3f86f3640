"""What telemetry a run delivered: ``manifest.json`` ``telemetry`` (seed 000), written by node 0 at the end.

Seed 000 keeps three statuses apart: the run's (``status``), the launchers'
(``guard.training``: did every training command exit 0) and this one: did
every expected rank write step records, and — for a guarded run — every step
of the declared measurement window. ``complete``, ``incomplete`` (reasons
below) or ``none`` (no rank wrote a step). A rank's records are counted once
per step (a resume that repeats steps counts them once).

Reasons: ``rank_without_records`` (an expected rank wrote no step),
``measurement_window_incomplete`` (a rank misses a declared step).

It also tells whether the declared window outlived ``history_retention``
(``window_span_s`` > ``retention_s``): the summary then analyzes only the
newest ``history_retention`` seconds of it, so the launcher warns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

COMPLETE = "complete"
INCOMPLETE = "incomplete"
NONE = "none"


def telemetry_section(run_dir: Path, *, expected_ranks: Optional[int], window: Optional[tuple[int, int]] = None,
                      retention_s: Optional[float] = None) -> dict[str, Any]:
    """The ``telemetry`` record of a run directory (reads its step files; never raises on bad lines).

    ``window``: the declared measurement window ``(start_step, end_step)`` of a
    guarded run; ``retention_s``: the run's ``history_retention``.
    """
    from traceml_tui.summary.load import load_ranks  # the summary's reader of step files: one reading rule

    ranks = load_ranks(Path(run_dir))
    expected = list(range(expected_ranks)) if expected_ranks else sorted(ranks)
    counts = {str(rank): len(ranks[rank].steps) if rank in ranks else 0 for rank in sorted(set(expected) | set(ranks))}
    without = [rank for rank in expected if not counts.get(str(rank))]
    reasons = []
    if without:
        reasons.append("rank_without_records")
    window_missing: list[int] = []
    span: Optional[float] = None
    if window is not None:
        start, end = window
        for rank in expected:
            steps = ranks[rank].steps if rank in ranks else {}
            if any(step not in steps for step in range(start, end + 1)):
                window_missing.append(rank)
        if window_missing:
            reasons.append("measurement_window_incomplete")
        ends = [ranks[r].steps[end].ts for r in expected if r in ranks and end in ranks[r].steps]
        starts = [ranks[r].steps[start].ts - (ranks[r].steps[start].cpu_ms.step or 0.0) / 1000.0
                  for r in expected if r in ranks and start in ranks[r].steps]
        if ends and starts:
            span = max(ends) - min(starts)
    if expected and len(without) == len(expected):
        status = NONE
    else:
        status = INCOMPLETE if reasons else COMPLETE
    return {
        "status": status,
        "ranks_expected": len(expected),
        "records": counts,
        "ranks_without_records": without,
        "window": list(window) if window is not None else None,
        "window_incomplete_ranks": window_missing,
        "window_span_s": span,
        "window_exceeds_retention": (span > retention_s) if span is not None and retention_s else None,
        "reasons": reasons,
    }


def telemetry_warnings(section: dict[str, Any], retention_s: Optional[float]) -> list[str]:
    """The one-line warnings the launcher prints for a telemetry record (none when complete and within retention)."""
    out = []
    if section.get("ranks_without_records"):
        out.append("telemetry incomplete: no step records from rank(s) "
                   + ", ".join(str(r) for r in section["ranks_without_records"]))
    if section.get("window_incomplete_ranks"):
        start, end = section["window"]
        out.append(f"telemetry incomplete: rank(s) {', '.join(str(r) for r in section['window_incomplete_ranks'])} "
                   f"did not record every declared step {start}-{end}")
    if section.get("window_exceeds_retention"):
        out.append(f"the declared measurement window took {section['window_span_s']:.0f} s, longer than "
                   f"history_retention ({retention_s:.0f} s): the summary analyzes only its newest {retention_s:.0f} s")
    return out
