"""The comparison model: two summary dicts in, one :class:`CompareResult` out.

Used by ``traceml compare`` and by the Compare screen of ``traceml watch``,
so both show the same verdict. Pure: no files, no printing. The CI result
follows :mod:`traceml_tui.compare.policy`; everything else here (phase
deltas, memory, system, diagnoses, declarations) is context for a person.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from traceml_tui.compare import policy
from traceml_tui.compare.policy import as_number, nested, nested_dict
from traceml_tui.core import steptime

REPORT_FORMAT = "traceml-compare"
REPORT_VERSION = 1

#: Selected-clock step time and its parts, shown as per-phase deltas (summary metric names).
#: The parts and their labels are the core's (``core/steptime.py``): the summary card and the
#: Run screen show the same ones.
PHASES: tuple[tuple[str, str], ...] = (("step_time_ms", steptime.STEP_LABEL),) + tuple(
    (steptime.metric_name(name), label) for name, label in steptime.PARTS
)
#: Summaries written before the data-wait / between-steps split (and traceml-ai's) publish only
#: the undivided gap; it is shown as its own row when either summary lacks the split.
LEGACY_INPUT_WAIT = ("input_wait_ms", "Input wait (older summary)")
_SPLIT_METRICS = (steptime.metric_name("data_wait"), steptime.metric_name("between_steps"))

#: (section, metric, label, unit) context rows for memory and system.
MEMORY_ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("step_memory", "peak_allocated_bytes", "Peak allocated / step", "bytes"),
    ("step_memory", "peak_reserved_bytes", "Peak reserved / step", "bytes"),
    ("process", "ram_bytes", "Process RSS", "bytes"),
    ("process", "gpu_mem_reserved_bytes", "Process GPU reserved", "bytes"),
)
SYSTEM_ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("system", "cpu_percent", "Node CPU", "%"),
    ("system", "ram_bytes", "Node RAM used", "bytes"),
    ("system", "gpu_util_percent", "GPU utilization", "%"),
    ("system", "gpu_mem_bytes", "GPU memory used", "bytes"),
    ("process", "cpu_percent", "Process CPU", "%"),
)
DIAGNOSIS_SOURCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("primary", ("primary_diagnosis",)),
    ("step_time", ("step_time", "diagnosis")),
    ("step_memory", ("step_memory", "diagnosis")),
    ("process", ("process", "diagnosis")),
    ("system", ("system", "diagnosis")),
)


@dataclass(frozen=True)
class CompareResult:
    """One comparison of a reference and a candidate summary.

    ``result`` is the CI result (None for an exploratory comparison, i.e.
    without a threshold) and ``exit_code`` what ``traceml compare`` returns
    for valid input. ``reason_code``/``reason`` explain an INCONCLUSIVE
    result, or would-be ineligibility in exploratory mode. ``report`` is the
    full JSON-ready report (the ``BASE.json`` artifact).
    """

    result: Optional[str]
    exit_code: int
    reason_code: Optional[str]
    reason: Optional[str]
    report: dict[str, Any] = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        return self.report

    def with_section(self, name: str, value: Any) -> "CompareResult":
        """A copy whose report carries one more section (e.g. ``noise``)."""
        report = dict(self.report)
        report[name] = value
        return replace(self, report=report)


def _finite(value: Any) -> Optional[float]:
    number = as_number(value)
    if number is None or not math.isfinite(number):
        return None
    return number


def metric_row(ref: Any, cand: Any) -> dict[str, Optional[float]]:
    """Reference, candidate, delta and percentage change of one metric."""
    r, c = _finite(ref), _finite(cand)
    delta = _finite(c - r) if r is not None and c is not None else None  # 1e308 - -1e308 overflows
    pct = policy.pct_change(r, c)
    return {"reference": r, "candidate": c, "delta": delta, "pct_change": pct if pct is None or math.isfinite(pct) else None}


def _diagnosis_clock(summary: dict[str, Any]) -> Optional[str]:
    clock = nested(summary, "step_time", "global", "window", "diagnosis_clock")
    clock = str(clock).lower() if isinstance(clock, str) else None
    return clock if clock in ("cpu", "gpu") else None


def _phases(reference: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    ref_clock, cand_clock = _diagnosis_clock(reference), _diagnosis_clock(candidate)
    # Phase values are on each summary's own selected clock; mixing a CPU
    # forward time with a GPU one would be a meaningless delta.
    same = ref_clock is not None and ref_clock == cand_clock
    ref_average = nested_dict(reference, "step_time", "global", "average")
    cand_average = nested_dict(candidate, "step_time", "global", "average")
    phases = PHASES
    if not all(any(metric in average for metric in _SPLIT_METRICS) for average in (ref_average, cand_average)):
        phases = PHASES[:1] + (LEGACY_INPUT_WAIT,) + PHASES[1:]
    rows = {}
    for name, label in phases:
        ref_avg = ref_average.get(name) if same else None
        cand_avg = cand_average.get(name) if same else None
        row = {"label": label, **metric_row(ref_avg, cand_avg)}
        if name != "step_time_ms":
            row["reference_share_pct"] = _share(row["reference"], ref_average.get("step_time_ms") if same else None)
            row["candidate_share_pct"] = _share(row["candidate"], cand_average.get("step_time_ms") if same else None)
        rows[name] = row
    note = None
    if not same:
        note = (
            f"Per-phase deltas are not shown: the summaries' phase clocks differ or are missing "
            f"(reference {ref_clock or 'n/a'}, candidate {cand_clock or 'n/a'})."
        )
    return {"clock": ref_clock if same else None, "rows": rows, "note": note}


def _share(part: Optional[float], whole: Any) -> Optional[float]:
    """A part's percentage of its summary's step time (None when either is missing or the whole is not positive)."""
    total = _finite(whole)
    if part is None or total is None or total <= 0:
        return None
    return min(100.0, max(0.0, part / total * 100.0))


def _context_rows(reference: dict[str, Any], candidate: dict[str, Any], spec) -> dict[str, Any]:
    rows = {}
    for section, metric, label, unit in spec:
        key = f"{section}.{metric}"
        rows[key] = {
            "label": label,
            "unit": unit,
            **metric_row(
                nested(reference, section, "global", "average", metric),
                nested(candidate, section, "global", "average", metric),
            ),
        }
    return rows


def _short_text(value: Any, limit: int = 200) -> Optional[str]:
    if not isinstance(value, str) or not value.strip():
        return None
    text = " ".join(value.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _diagnoses(reference: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, keys in DIAGNOSIS_SOURCES:
        ref, cand = nested_dict(reference, *keys), nested_dict(candidate, *keys)
        out[name] = {
            "reference": _short_text(ref.get("status"), 60),
            "candidate": _short_text(cand.get("status"), 60),
            "reference_summary": _short_text(ref.get("summary")),
            "candidate_summary": _short_text(cand.get("summary")),
        }
    return out


def _run_info(summary: dict[str, Any], label: Optional[str]) -> dict[str, Any]:
    _digest, declaration, problem = policy.declaration_digest(summary)
    topology = policy.expected_topology(summary)
    run_name = nested(summary, "meta", "run_name")
    schema = summary.get("schema_version")
    return {
        "label": label,
        "run_name": _short_text(run_name, 128),
        "schema_version": (
            _short_text(schema, 20) if isinstance(schema, str) else _finite(schema) if isinstance(schema, (int, float)) else None
        ),
        "duration_s": _finite(summary.get("duration_s")),
        "steps_analyzed": policy.steps_analyzed(summary),
        "run_status": _short_text(policy.run_status(summary), 40),
        "launcher_status": _short_text(policy.launcher_status(summary), 40),
        # Only a validated declaration is echoed: it is bounded and holds
        # nothing but what the user declared.
        "declaration": declaration,
        "declaration_problem": problem,
        "topology": (
            {"nodes": topology[0], "processes_per_node": topology[1], "world_size": topology[2]}
            if topology
            else None
        ),
    }


def _warnings(reference: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
    warnings = []
    ref_v, cand_v = reference.get("schema_version"), candidate.get("schema_version")
    if ref_v != cand_v:
        warnings.append(
            f"The summaries use different schema versions ({_short_text(str(ref_v), 20)} and "
            f"{_short_text(str(cand_v), 20)}); Step Time is read on a common clock from each "
            "version's own fields (total_step_ms before 1.7)."
        )
    ref_n, cand_n = policy.steps_analyzed(reference), policy.steps_analyzed(candidate)
    if ref_n is not None and cand_n is not None and ref_n != cand_n:
        warnings.append(
            f"The analyzed step counts differ ({ref_n} and {cand_n}); this is allowed, but the averages "
            "cover different amounts of training."
        )
    return warnings


def compare_summaries(
    reference: dict[str, Any],
    candidate: dict[str, Any],
    threshold_pct: Optional[float] = None,
    *,
    labels: tuple[Optional[str], Optional[str]] = (None, None),
) -> CompareResult:
    """Compare a reference summary with a candidate summary.

    ``threshold_pct`` is the maximum allowed Step Time regression in percent
    (already validated: finite, ≥ 0); None makes the comparison exploratory,
    with no CI result and exit code 0. ``labels`` are display names.
    """
    if threshold_pct is not None:
        threshold_pct = policy.parse_threshold(threshold_pct)
    evidence = policy.step_time_evidence(reference, candidate)
    reason = policy.eligibility(reference, candidate, evidence)

    ci = policy.ci_block(evidence, threshold_pct, reason) if threshold_pct is not None else None
    clocks = evidence["_clocks"]
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "mode": "ci" if ci is not None else "exploratory",
        "ci": ci,
        "eligibility": {
            "eligible": reason is None,
            "reason_code": reason[0] if reason else None,
            "reason": reason[1] if reason else None,
        },
        "reference": _run_info(reference, labels[0]),
        "candidate": _run_info(candidate, labels[1]),
        "step_time": {
            "clock": evidence["clock"],
            "available_clocks": {
                role: [name for name in ("gpu", "cpu") if clocks[role][name] is not None] for role in policy.ROLES
            },
            **metric_row(evidence["reference_step_time_ms"], evidence["candidate_step_time_ms"]),
            "reference_steps_analyzed": evidence["reference_steps_analyzed"],
            "candidate_steps_analyzed": evidence["candidate_steps_analyzed"],
        },
        "phases": _phases(reference, candidate),
        "memory": _context_rows(reference, candidate, MEMORY_ROWS),
        "system": _context_rows(reference, candidate, SYSTEM_ROWS),
        "diagnoses": _diagnoses(reference, candidate),
        "noise": None,
        "warnings": _warnings(reference, candidate),
    }
    if ci is not None:
        return CompareResult(ci["result"], ci["exit_code"], ci["reason_code"], ci["reason"], report)
    return CompareResult(
        None,
        0,
        reason[0] if reason else None,
        reason[1] if reason else None,
        report,
    )
