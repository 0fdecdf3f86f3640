"""The CI rule of seed 000: eligibility, common-clock Step Time, result.

Only Step Time decides the CI result; everything else a comparison shows is
context. The rules here reproduce the published traceml-ai results exactly
(same clock choice, same percentage formula, same boundary tolerance, same
legacy field for old schemas) so that either tool gives the same verdict on
the same pair of summaries. Pure functions; no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Optional

WITHIN = "WITHIN_THRESHOLD_IN_THIS_PAIR"
FASTER = "FASTER_IN_THIS_PAIR"
SLOWER = "SLOWER_IN_THIS_PAIR"
INCONCLUSIVE = "INCONCLUSIVE"

#: Process exit code for each CI result (seed 000, "Compare the results").
EXIT_CODES: dict[str, int] = {WITHIN: 0, FASTER: 0, SLOWER: 4, INCONCLUSIVE: 3}
EXIT_BAD_INPUT = 1  # a usage error is core.cliargs.EXIT_USAGE (2), as for every command

#: Stable reason codes for an INCONCLUSIVE result, in the order they are checked.
REASON_CODES: tuple[str, ...] = (
    "declaration_invalid",
    "declaration_mismatch",
    "topology_invalid",
    "topology_mismatch",
    "run_not_completed",
    "launcher_not_completed",
    "step_time_unavailable",
    "step_time_change_unavailable",
)

ROLES = ("reference", "candidate")


class ThresholdError(ValueError):
    """A threshold that is not a finite, non-negative number."""


def parse_threshold(text: Any) -> float:
    """Parse ``--max-step-time-regression-pct``: a finite number ≥ 0, else ThresholdError."""
    if isinstance(text, bool):
        raise ThresholdError("the threshold must be a number")
    try:
        value = float(text)
    except (TypeError, ValueError, OverflowError):
        raise ThresholdError(f"the threshold {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ThresholdError(f"the threshold {text!r} is not finite")
    if value < 0:
        raise ThresholdError(f"the threshold {text!r} is negative")
    # -0 passes the check above; adding 0.0 makes it 0.0 so no report says "-0%".
    return value + 0.0


def parse_optional_threshold(text: Any) -> Optional[float]:
    """A threshold where none may be set (``traceml watch``'s flag, its Compare screen): ``none`` or nothing
    is None (an exploratory comparison, docs/watch.md), anything else :func:`parse_threshold`'s."""
    if text is None or str(text).strip().lower() in ("none", ""):
        return None
    return parse_threshold(str(text).strip())


def classify(pct_change: float, threshold_pct: float) -> str:
    """CI result for a finite Step Time change against a threshold ≥ 0.

    A change equal to ±threshold is within. Percentages computed from
    decimal inputs carry binary rounding noise (0.3 → 0.315 gives
    5.000000000000004 %, not 5 %), so values within ``math.isclose``'s
    default relative tolerance of ±threshold count as on the boundary.
    """
    if math.isclose(pct_change, threshold_pct) or math.isclose(pct_change, -threshold_pct):
        return WITHIN
    if pct_change > threshold_pct:
        return SLOWER
    if pct_change < -threshold_pct:
        return FASTER
    return WITHIN


# --- reading the fields the rule needs -------------------------------------------


def nested(value: Any, *keys: str) -> Any:
    """``value[k1][k2]…`` or None when any level is missing or not an object."""
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def nested_dict(value: Any, *keys: str) -> dict[str, Any]:
    found = nested(value, *keys)
    return found if isinstance(found, dict) else {}


def as_number(value: Any) -> Optional[float]:
    """Lenient numeric reading used for Step Time presence.

    Mirrors the published reader: anything ``float()`` accepts counts as a
    measured value (so a measured 0 or a NaN still selects its clock and
    then fails the positivity check), ``null``/missing/objects do not.
    A JSON ``true``/``false`` is not a measurement: Python's ``float(True)``
    would turn it into a 1 ms Step Time, so a boolean counts as missing.
    """
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def schema_number(summary: dict[str, Any]) -> Optional[float]:
    return as_number(summary.get("schema_version"))


def clock_step_times(summary: dict[str, Any]) -> dict[str, Optional[float]]:
    """Per-clock average Step Time of one summary: ``{"gpu": ms|None, "cpu": ms|None}``.

    Schema ≥ 1.7 publishes ``step_time_gpu_ms``/``step_time_cpu_ms``; older
    summaries only have ``total_step_ms``, which is CPU time (never GPU).
    """
    average = nested_dict(summary, "step_time", "global", "average")
    schema = schema_number(summary)
    if schema is None or schema < 1.7:
        return {"gpu": None, "cpu": as_number(average.get("total_step_ms"))}
    return {"gpu": as_number(average.get("step_time_gpu_ms")), "cpu": as_number(average.get("step_time_cpu_ms"))}


def steps_analyzed(summary: dict[str, Any]) -> Optional[int]:
    value = nested(summary, "step_time", "global", "window", "steps_analyzed")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def pct_change(reference: Optional[float], candidate: Optional[float]) -> Optional[float]:
    """(candidate − reference) / reference × 100, None when undefined.

    The operation order matches the published tool bit for bit, which
    matters at the ±threshold boundary.
    """
    if reference is None or candidate is None:
        return None
    if abs(reference) <= 1e-12:
        return None
    return 100.0 * (candidate - reference) / reference


def step_time_evidence(reference: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    """Step Time on a common clock: GPU when both have it, else CPU when both have it."""
    ref_clocks = clock_step_times(reference)
    cand_clocks = clock_step_times(candidate)
    clock = ref_ms = cand_ms = None
    for name in ("gpu", "cpu"):
        if ref_clocks[name] is not None and cand_clocks[name] is not None:
            clock, ref_ms, cand_ms = name, ref_clocks[name], cand_clocks[name]
            break
    change = pct_change(ref_ms, cand_ms)
    return {
        "clock": clock,
        "reference_step_time_ms": _finite_or_none(ref_ms),
        "candidate_step_time_ms": _finite_or_none(cand_ms),
        "pct_change": _finite_or_none(change),
        "reference_steps_analyzed": steps_analyzed(reference),
        "candidate_steps_analyzed": steps_analyzed(candidate),
        # Raw values stay private: they may be NaN/inf, which JSON cannot hold.
        "_raw": (ref_ms, cand_ms, change),
        "_clocks": {"reference": ref_clocks, "candidate": cand_clocks},
    }


def _finite_or_none(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


def _positive_finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value) and value > 0.0


# --- eligibility -----------------------------------------------------------------


def declaration_digest(summary: dict[str, Any]) -> tuple[Optional[str], Optional[dict], Optional[str]]:
    """(digest, normalized declaration, problem) for ``run_context.declaration``.

    The declaration is re-validated with the same rules ``traceml run``
    applies, so a summary edited by hand cannot pass with a declaration the
    launcher would have refused.
    """
    from traceml_tui.guard.contract import ContractError, contract_digest, parse_guard_contract

    raw = nested(summary, "run_context", "declaration")
    if raw is None:
        return None, None, "has no guard declaration"
    try:
        normalized = parse_guard_contract(raw)
        return contract_digest(normalized), normalized, None
    except ContractError as exc:
        return None, None, f"has an invalid guard declaration ({exc})"
    except (RecursionError, ValueError, TypeError) as exc:
        return None, None, f"has an invalid guard declaration ({exc})"


def _typed(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 40 else text[:39] + "…"
    return f"{text} ({type(value).__name__})"


def declaration_difference(reference: dict, candidate: dict) -> str:
    """Where two normalized declarations differ, in words (first two differences)."""
    diffs = []
    ref_w, cand_w = reference["workload"], candidate["workload"]
    if ref_w["name"] != cand_w["name"]:
        diffs.append(f"workload name {_typed(ref_w['name'])} vs {_typed(cand_w['name'])}")
    ref_p, cand_p = ref_w["parameters"], cand_w["parameters"]
    for key in sorted(set(ref_p) | set(cand_p)):
        if key not in cand_p:
            diffs.append(f"parameter {key!r} only in the reference")
        elif key not in ref_p:
            diffs.append(f"parameter {key!r} only in the candidate")
        elif type(ref_p[key]) is not type(cand_p[key]) or ref_p[key] != cand_p[key]:
            diffs.append(f"parameter {key!r} is {_typed(ref_p[key])} vs {_typed(cand_p[key])}")
    for key in ("start_step", "completed_steps"):
        if reference["measurement"][key] != candidate["measurement"][key]:
            diffs.append(f"measurement {key} {reference['measurement'][key]} vs {candidate['measurement'][key]}")
    if not diffs:
        return "their canonical forms differ"
    more = f", and {len(diffs) - 2} more" if len(diffs) > 2 else ""
    return "; ".join(diffs[:2]) + more + ", reference vs candidate"


def expected_topology(summary: dict[str, Any]) -> Optional[tuple[int, int, int]]:
    """(nodes, processes per node, world size) when valid, else None."""
    execution = nested_dict(summary, "run_context", "execution")
    values = tuple(execution.get(key) for key in ("expected_nodes", "processes_per_node", "expected_world_size"))
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        return None
    nodes, per_node, world = values
    if world != nodes * per_node:
        return None
    return nodes, per_node, world


def run_status(summary: dict[str, Any]) -> Any:
    return nested(summary, "run_context", "run", "status")


def launcher_status(summary: dict[str, Any]) -> Any:
    return nested(summary, "run_context", "execution", "launcher_completion", "status")


def _which(flags: tuple[bool, bool]) -> str:
    """'the reference summary' / 'the candidate summary' / 'both summaries' for failing sides."""
    if all(flags):
        return "both summaries"
    return f"the {ROLES[flags.index(True)]} summary"


def eligibility(reference: dict[str, Any], candidate: dict[str, Any], evidence: dict[str, Any]) -> Optional[tuple[str, str]]:
    """First reason this pair cannot get a CI result, as (code, sentence); None if eligible."""
    pair = (reference, candidate)

    digests = [declaration_digest(s) for s in pair]
    bad = tuple(d[0] is None for d in digests)
    if any(bad):
        problems = [f"the {role} summary {d[2]}" for role, d in zip(ROLES, digests) if d[0] is None]
        return (
            "declaration_invalid",
            _cap("; ".join(problems))
            + ". Produce both runs with a guarded `traceml run` (a `guard` block in traceml.yaml).",
        )
    if digests[0][0] != digests[1][0]:
        return (
            "declaration_mismatch",
            f"The guard declarations differ ({declaration_difference(digests[0][1], digests[1][1])}); "
            "use the same guard block for both runs, including value types.",
        )

    topologies = [expected_topology(s) for s in pair]
    bad = tuple(t is None for t in topologies)
    if any(bad):
        return (
            "topology_invalid",
            f"{_cap(_which(bad))} lack a valid expected topology (nodes, processes per node, "
            "and a world size equal to their product)."
            if all(bad)
            else f"{_cap(_which(bad))} lacks a valid expected topology (nodes, processes per node, "
            "and a world size equal to their product).",
        )
    if topologies[0] != topologies[1]:
        (rn, rp, _), (cn, cp, _) = topologies
        return (
            "topology_mismatch",
            f"The expected topologies differ: reference {rn} node(s) × {rp} process(es), "
            f"candidate {cn} node(s) × {cp} process(es).",
        )

    bad = tuple(run_status(s) != "completed" for s in pair)
    if any(bad):
        return (
            "run_not_completed",
            f"Training did not complete in {_which(bad)} (run status: "
            f"{_status_text(run_status(reference))} → {_status_text(run_status(candidate))}).",
        )

    bad = tuple(launcher_status(s) != "completed" for s in pair)
    if any(bad):
        return (
            "launcher_not_completed",
            f"Launcher completion is not recorded as completed in {_which(bad)} (status: "
            f"{_status_text(launcher_status(reference))} → {_status_text(launcher_status(candidate))}).",
        )

    ref_ms, cand_ms, change = evidence["_raw"]
    if evidence["clock"] is None:
        return (
            "step_time_unavailable",
            "The summaries share no measured Step Time clock (both GPU or both CPU).",
        )
    if not (_positive_finite(ref_ms) and _positive_finite(cand_ms)):
        return (
            "step_time_unavailable",
            f"{evidence['clock'].upper()} Step Time must be a positive finite number in both summaries "
            f"(got {_ms_text(ref_ms)} → {_ms_text(cand_ms)}).",
        )
    if change is None or not math.isfinite(change):
        return (
            "step_time_change_unavailable",
            "The Step Time change cannot be computed as a finite percentage.",
        )
    return None


def summary_problem(summary: dict[str, Any]) -> Optional[tuple[str, str]]:
    """First reason one summary could take part in no CI comparison, as (code, sentence); None if usable.

    The checks of :func:`eligibility` that need only one summary, in the
    same order and with the same codes, worded about that summary alone:
    calibration must name the run at fault, not call it "the reference".
    """
    _digest, _declaration, problem = declaration_digest(summary)
    if problem is not None:
        return "declaration_invalid", f"The summary {problem}."
    if expected_topology(summary) is None:
        return (
            "topology_invalid",
            "The summary lacks a valid expected topology (nodes, processes per node, "
            "and a world size equal to their product).",
        )
    if run_status(summary) != "completed":
        return "run_not_completed", f"Training did not complete (run status: {_status_text(run_status(summary))})."
    if launcher_status(summary) != "completed":
        return (
            "launcher_not_completed",
            f"Launcher completion is not recorded as completed (status: {_status_text(launcher_status(summary))}).",
        )
    clocks = clock_step_times(summary)
    # The clock a pair with itself would use: a measured GPU value wins even when it is not positive.
    clock = "gpu" if clocks["gpu"] is not None else "cpu"
    if clocks[clock] is None:
        return "step_time_unavailable", "The summary has no measured Step Time (GPU or CPU)."
    if not _positive_finite(clocks[clock]):
        return (
            "step_time_unavailable",
            f"{clock.upper()} Step Time must be a positive finite number (got {_ms_text(clocks[clock])}).",
        )
    return None


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _status_text(value: Any) -> str:
    if value is None:
        return "missing"
    text = str(value)
    return text if len(text) <= 40 and text.isprintable() else ascii(text[:40])


def _ms_text(value: Optional[float]) -> str:
    return "missing" if value is None else f"{value:g} ms"


def ci_block(evidence: dict[str, Any], threshold_pct: float, reason: Optional[tuple[str, str]]) -> dict[str, Any]:
    """The CI block of a comparison: result, exit code and the evidence behind it."""
    block: dict[str, Any] = {
        "result": None,
        "exit_code": None,
        "threshold_pct": threshold_pct,
        "clock": evidence["clock"],
        "reference_step_time_ms": evidence["reference_step_time_ms"],
        "candidate_step_time_ms": evidence["candidate_step_time_ms"],
        "pct_change": evidence["pct_change"],
        "reference_steps_analyzed": evidence["reference_steps_analyzed"],
        "candidate_steps_analyzed": evidence["candidate_steps_analyzed"],
        "reason_code": None,
        "reason": None,
    }
    if reason is not None:
        result = INCONCLUSIVE
        block["reason_code"], block["reason"] = reason
    else:
        result = classify(evidence["pct_change"], threshold_pct)
        block["reason"] = verdict_sentence(result, evidence, threshold_pct)
    block["result"] = result
    block["exit_code"] = EXIT_CODES[result]
    return block


def verdict_sentence(result: str, evidence: dict[str, Any], threshold_pct: float) -> str:
    """One plain sentence saying why an eligible pair got its result."""
    clock = evidence["clock"].upper()
    ref = evidence["reference_step_time_ms"]
    cand = evidence["candidate_step_time_ms"]
    pct = evidence["pct_change"]
    change = f"{clock} Step Time went from {ref:.4g} ms to {cand:.4g} ms ({pct:+.2f}%)"
    if result == SLOWER:
        return f"{change}, more than the allowed {threshold_pct:g}% regression."
    if result == FASTER:
        return f"{change}, faster by more than the {threshold_pct:g}% threshold."
    return f"{change}, within ±{threshold_pct:g}%."
