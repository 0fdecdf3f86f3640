"""records → ``final_summary.json`` (TraceML final-summary layout, schema 1.9).

Every field that ``traceml compare`` reads follows the published TraceML
layout so that summaries are interchangeable with the ``traceml-ai`` package
in both directions. Our own sections (``training``, ``environment``) sit
beside them.

Step Time model: :mod:`traceml_tui.core.steptime` (per rank, per step, on one clock)::

    step_time = input_wait + traced_step_time           (previous step's end → this step's end)
              = data_wait + between_steps + h2d + forward + backward + optimizer + residual

Every part is ≥ 0 and the parts sum to the step time for every step; parts and
whole are averaged over the same steps (the analysis window). The first step of
an attempt has no previous step end, so its input wait is not measured (null)
and its step time is its traced time. A part that no step measured stays null;
it is never reported as 0. ``step_time_ms`` — the figure ``traceml compare``
judges — keeps its meaning; ``input_wait_ms`` is the average gap over the same
steps (``step_time_ms - traced_step_time_ms``); ``data_wait_ms`` and
``between_steps_ms`` split it (``data_wait_ms`` also counts loader waits inside
the traced step); ``dataloader_fetch_cpu_ms`` is the CPU data wait, as
traceml-ai publishes it. INPUT-BOUND is decided on data wait alone.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Optional

from traceml_tui.core import backlog as core_backlog
from traceml_tui.core import coverage, freshness, records, steptime, straggler
from traceml_tui.summary.load import RankSteps, load_ranks, load_system

SCHEMA_VERSION = 1.9
DEFAULT_RETENTION_S = 1800.0

STEP_TIME_METRICS = (
    "input_wait_ms",
    "step_time_ms",
    "traced_step_time_ms",
    "step_time_cpu_ms",
    "step_time_gpu_ms",
    "traced_step_time_cpu_ms",
    "traced_step_time_gpu_ms",
    "dataloader_fetch_cpu_ms",
    "h2d_ms",
    "compute_ms",
    "residual_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    # beside the published 1.9 names: the loader / between-steps split of input_wait_ms
    "data_wait_ms",
    "between_steps_ms",
)
#: Share of step time at which a part is named as the bottleneck.
BOUND_SHARE_PCT = 25.0
COMPUTE_BOUND_SHARE_PCT = 60.0
STEP_MEMORY_METRICS = ("peak_allocated_bytes", "peak_reserved_bytes")
SYSTEM_METRICS = (
    "cpu_percent", "ram_bytes", "ram_percent", "gpu_util_percent", "gpu_mem_bytes",
    "gpu_mem_percent", "gpu_temp_c", "gpu_power_w", "gpu_headroom_bytes",
)
PROCESS_METRICS = (
    "cpu_percent", "cpu_capacity_percent", "ram_bytes", "ram_percent", "gpu_mem_used_bytes",
    "gpu_mem_reserved_bytes", "gpu_mem_reserved_percent", "gpu_mem_headroom_bytes",
)
_RUN_STATUSES = ("starting", "running", "completed", "failed", "interrupted")


def _mean(values: Iterable[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


# -- analysis window --------------------------------------------------------------------------
def common_window(ranks: dict[int, RankSteps], retention_s: float) -> list[int]:
    """Steps completed on every rank, limited to the retention span before the newest one."""
    if not ranks:
        return []
    step_sets = [set(series.steps) for series in ranks.values() if series.steps]
    if len(step_sets) != len(ranks) or not step_sets:
        step_sets = [s for s in step_sets if s]
    if not step_sets:
        return []
    common = sorted(set.intersection(*step_sets))
    if not common:
        return []

    def done_ts(step: int) -> float:
        return max(series.steps[step].ts for series in ranks.values() if step in series.steps)

    anchor = done_ts(common[-1])
    return [step for step in common if done_ts(step) >= anchor - retention_s]


def rank_step_metrics(series: RankSteps, window: list[int], clock: str) -> dict[str, Optional[float]]:
    """Averages over the window for one rank, in the published metric names.

    Every figure comes from :func:`steptime.step_parts` of the same steps, so the
    part averages sum to ``step_time_ms``.
    """
    steps = [series.steps[s] for s in window]
    cpu = steptime.average_parts(steptime.step_parts(s.cpu_ms) for s in steps)
    gpu_available = bool(steps) and all(s.gpu_ms is not None and s.gpu_ms.step is not None for s in steps)
    gpu = steptime.average_parts(steptime.step_parts(s.gpu_ms) for s in steps) if gpu_available else None
    selected = gpu if clock == "gpu" else cpu
    parts = selected.parts if selected is not None else dict.fromkeys(steptime.PART_NAMES)
    gap_known = parts["between_steps"] is not None
    return {
        "input_wait_ms": selected.input_wait if selected is not None and gap_known else None,
        "step_time_ms": selected.whole if selected is not None else None,
        "traced_step_time_ms": selected.traced if selected is not None else None,
        "step_time_cpu_ms": cpu.whole if cpu is not None else None,
        "step_time_gpu_ms": gpu.whole if gpu is not None else None,
        "traced_step_time_cpu_ms": cpu.traced if cpu is not None else None,
        "traced_step_time_gpu_ms": gpu.traced if gpu is not None else None,
        "dataloader_fetch_cpu_ms": cpu.parts["data_wait"] if cpu is not None else None,
        "h2d_ms": parts["h2d"],
        "compute_ms": selected.compute if selected is not None else None,
        "residual_ms": parts["residual"],
        "forward_ms": parts["forward"],
        "backward_ms": parts["backward"],
        "optimizer_ms": parts["optimizer"],
        "data_wait_ms": parts["data_wait"],
        "between_steps_ms": parts["between_steps"],
    }


def breakdown(average: dict[str, Optional[float]], clock: str, steps_without_gap: int = 0) -> dict[str, Any]:
    """The step-time parts of the global averages: each part's average and share of step time.

    The averages are over the same steps and ranks, so the measured parts sum to
    ``step_time_ms`` and every share is within 0-100 %. ``steps_without_gap``:
    window steps that were an attempt's first (no previous step end: traced time only).
    """
    whole = average.get("step_time_ms")
    rows = []
    for name, label in steptime.PARTS:
        metric = steptime.metric_name(name)
        value = average.get(metric)
        share = min(100.0, max(0.0, value / whole * 100.0)) if value is not None and whole else None
        rows.append({"name": name, "label": label, "metric": metric, "average_ms": value, "share_pct": share})
    return {
        "clock": clock,
        "definition": "step time = time from the previous step's end to this step's end = "
                      + " + ".join(label.lower() for _, label in steptime.PARTS),
        "label": steptime.STEP_LABEL,
        "step_time_ms": whole,
        "data_wait_measured": average.get("data_wait_ms") is not None,
        "steps_without_gap": steps_without_gap,
        "parts": rows,
    }


def _points(rows: dict[str, dict[str, Optional[float]]], metrics: tuple[str, ...]) -> tuple[dict, dict, dict]:
    average: dict[str, Optional[float]] = {}
    median: dict[str, dict[str, Any]] = {}
    worst: dict[str, dict[str, Any]] = {}
    for name in metrics:
        # the median and worst rank by the one straggler rule (core/straggler.py), for every metric alike: the
        # function the index calls on these rows once they are written (an ended run's figures, docs/contracts.md)
        found = straggler.rows_spread(rows, name)
        if found is None:
            average[name] = None
            median[name] = {"value": None, "idx": None}
            worst[name] = {"value": None, "idx": None}
            continue
        values = sorted(row["metrics"][name] for row in rows.values() if row["metrics"].get(name) is not None)
        average[name] = sum(values) / len(values)  # summed in value order, as before
        median[name] = {"value": found.median, "idx": found.median_key}
        worst[name] = {"value": found.worst, "idx": found.worst_key}
    return average, median, worst


def _issue(kind: str, status: str, severity: str, summary: str, action: str, **extra: Any) -> dict:
    issue = {
        "kind": kind, "status": status, "severity": severity, "summary": summary, "action": action,
        "metric": None, "phase": None, "score": None, "share_pct": None, "skew_pct": None,
        "ranks": [], "evidence": {},
    }
    issue.update(extra)
    return issue


def _ms_text(value: float) -> str:
    return f"{value:.3g} ms" if value < 100 else f"{value:.0f} ms"


def _no_step_issue() -> dict:
    """NO DATA because no rank recorded any step: the words of ``core/coverage.py`` (``traceml run`` prints them)."""
    sentence = coverage.NO_STEP_LINE[0].upper() + coverage.NO_STEP_LINE[1:]
    return _issue("NO_DATA", "NO DATA", "info", sentence + ".", coverage.NO_STEP_ACTION, evidence={"steps_recorded": 0})


def diagnose_step_time(average: dict, median: dict, worst: dict, steps: int, clock: str = "cpu",
                       traced: bool = True) -> list[dict]:
    """Plain rules over the aggregates; the first issue is the section's diagnosis.

    ``traced=False``: no rank recorded any step at all (not merely none in common), said in
    :data:`traceml_tui.core.coverage.NO_STEP_LINE`'s words.

    INPUT-BOUND is decided on data wait (time in an instrumented loader's
    ``next()``) alone; time between steps outside the loader is BETWEEN-STEPS.
    Every issue carries each part's share of step time in ``evidence``.
    """
    if not traced:
        return [_no_step_issue()]
    if not steps or average.get("step_time_ms") is None:
        return [_issue("NO_DATA", "NO DATA", "info", "No step was completed on every rank.",
                       "Wrap each optimizer step in traceml.trace_step(model) and launch with traceml run.")]
    parts = breakdown(average, clock)
    shares = {row["name"]: row["share_pct"] for row in parts["parts"]}
    evidence = {
        "clock": clock,
        "step_time_ms": average["step_time_ms"],
        "parts_ms": {row["name"]: row["average_ms"] for row in parts["parts"]},
        "shares_pct": shares,
        "data_wait_measured": parts["data_wait_measured"],
    }
    issues = []
    step_med, step_worst = median["step_time_ms"], worst["step_time_ms"]
    if step_med["value"] is not None and step_worst["value"] is not None:
        found = straggler.Spread(step_med["idx"], step_med["value"], step_worst["idx"], step_worst["value"])
        if found.straggler:  # the one rule (core/straggler.py): the index's score and Δ use it too
            skew, rank = found.skew_pct, found.worst_key
            issues.append(_issue(
                "STRAGGLER", "STRAGGLER", "warn",
                f"Rank {rank} is {skew:.0f}% slower than the median rank.",
                "Inspect that rank's input pipeline, host load and device health.",
                metric="step_time_ms", skew_pct=skew, ranks=[int(rank)], evidence=evidence,
            ))
    bound = []
    data_share, data_ms = shares.get("data_wait"), average.get("data_wait_ms")
    if data_share is not None and data_ms is not None and data_share >= BOUND_SHARE_PCT:
        bound.append(_issue(
            "INPUT_BOUND", "INPUT-BOUND", "warn",
            f"Data wait is {data_share:.0f}% of step time ({_ms_text(data_ms)} per step in the data loader's next()).",
            "Add DataLoader workers (num_workers), prefetching (prefetch_factor, pin_memory) or faster storage.",
            metric="data_wait_ms", phase="data_wait", share_pct=data_share, evidence=evidence,
        ))
    between_share, between_ms = shares.get("between_steps"), average.get("between_steps_ms")
    if between_share is not None and between_ms is not None and between_share >= BOUND_SHARE_PCT:
        untimed = "" if parts["data_wait_measured"] else ", or a data source traceml does not time"
        hint = "" if parts["data_wait_measured"] else " If it is data loading, wrap the loader with traceml.wrap_loader(...)."
        bound.append(_issue(
            "BETWEEN_STEPS", "BETWEEN-STEPS", "warn",
            f"{between_share:.0f}% of step time ({_ms_text(between_ms)} per step) is spent between traced steps, "
            f"outside the data loader: work outside the traced step such as checkpointing, logging or evaluation{untimed}.",
            "Move that work off the step path (less often, asynchronously or in another process), or trace it." + hint,
            metric="between_steps_ms", phase="between_steps", share_pct=between_share, evidence=evidence,
        ))
    issues.extend(sorted(bound, key=lambda issue: -issue["share_pct"]))
    compute = average.get("compute_ms")
    step_avg = average["step_time_ms"]
    if not issues and compute is not None and step_avg > 0 and compute / step_avg * 100.0 >= COMPUTE_BOUND_SHARE_PCT:
        share = min(100.0, compute / step_avg * 100.0)
        issues.append(_issue(
            "COMPUTE_BOUND", "COMPUTE-BOUND", "info",
            f"Forward, backward and optimizer take {share:.0f}% of step time.",
            "Optimize the model's compute (precision, fusion, batch size) to go faster.",
            metric="compute_ms", phase="compute", share_pct=share, evidence=evidence,
        ))
    if not issues:
        issues.append(_issue("BALANCED", "BALANCED", "info", "No dominant bottleneck in step time.", "No action needed.",
                             evidence=evidence))
    return issues


def _metadata(*, ranks_seen: list[int], ranks_used: list[int], metric_names: tuple[str, ...], window: dict,
              nodes_expected: Optional[int], nodes_observed: Optional[int], samples: Optional[int],
              latest_step: Optional[int]) -> dict:
    return {
        "mode": "no_data" if not ranks_used and not samples else ("multi_node" if (nodes_observed or 1) > 1 else "single_node"),
        "duration_s": window.get("duration_s"),
        "samples": samples,
        "nodes_expected": nodes_expected,
        "nodes_observed": nodes_observed,
        "nodes_coverage": (nodes_observed / nodes_expected) if nodes_expected and nodes_observed is not None else None,
        "nodes_partial": (nodes_observed < nodes_expected) if nodes_expected and nodes_observed is not None else None,
        "gpus_observed": None,
        "global_ranks_seen": len(ranks_seen),
        "global_ranks_used": len(ranks_used),
        "training_total_steps": latest_step,
        "training_latest_step": latest_step,
        "section_metric_names": list(metric_names),
        "analysis_start_ts_s": window.get("start_ts_s"),
        "analysis_end_ts_s": window.get("end_ts_s"),
        "analysis_start_step": window.get("start_step"),
        "analysis_end_step": window.get("end_step"),
    }


def _identity(series: RankSteps, world_size: Optional[int], nproc: Optional[int]) -> dict:
    rank = series.rank
    return {
        "global_rank": rank,
        "local_rank": rank % nproc if nproc else None,
        "node_rank": rank // nproc if nproc else None,
        "hostname": None,  # never stored: summaries carry no host names
        "local_world_size": nproc,
        "world_size": world_size,
    }


def _steps_without_gap(ranks: dict[int, RankSteps], used: list[int], window: list[int]) -> int:
    """Window steps with no previous step end (an attempt's first), most on any rank."""
    return max((sum(1 for s in window if ranks[r].steps[s].cpu_ms.input_wait is None) for r in used), default=0)


def step_sections(ranks: dict[int, RankSteps], window: list[int], topology: dict, analysis: dict) -> tuple[dict, dict]:
    """Build the ``step_time`` and ``step_memory`` sections."""
    nproc = topology.get("processes_per_node")
    world = topology.get("expected_world_size")
    used = [r for r in sorted(ranks) if window and all(s in ranks[r].steps for s in window)]
    clock = "gpu" if used and all(
        ranks[r].steps[s].gpu_ms is not None and ranks[r].steps[s].gpu_ms.step is not None for r in used for s in window
    ) else "cpu"
    rows = {str(r): {"identity": _identity(ranks[r], world, nproc), "metrics": rank_step_metrics(ranks[r], window, clock)} for r in used}
    # A part measured on some ranks counts 0 on the others (as within a rank across steps), so the
    # averages over ranks of the parts still sum to the average step time.
    for metric in [steptime.metric_name(p) for p in steptime.PART_NAMES] + ["compute_ms"]:
        if any(row["metrics"][metric] is not None for row in rows.values()):
            for row in rows.values():
                if row["metrics"][metric] is None:
                    row["metrics"][metric] = 0.0
    average, median, worst = _points(rows, STEP_TIME_METRICS)
    latest = max((max(s.steps) for s in ranks.values() if s.steps), default=None)
    issues = diagnose_step_time(average, median, worst, len(window), clock, traced=latest is not None)
    step_window = {
        "kind": "step_window",
        "alignment": "common_steps",
        "samples": len(window) * len(used) if window else 0,
        "steps_analyzed": len(window),
        "start_step": window[0] if window else None,
        "end_step": window[-1] if window else None,
        "completed_step": window[-1] if window else None,
        "diagnosis_clock": clock,
    }
    nodes_expected = topology.get("expected_nodes")
    nodes_obs = len({r // nproc for r in used}) if nproc else None
    meta = _metadata(ranks_seen=sorted(ranks), ranks_used=used, metric_names=STEP_TIME_METRICS, window=analysis,
                     nodes_expected=nodes_expected, nodes_observed=nodes_obs, samples=step_window["samples"], latest_step=latest)
    step_time = {
        "metadata": meta,
        "diagnosis": issues[0],
        "issues": issues,
        "global": {"index_by": "global_rank", "window": step_window, "average": average, "median": median, "worst": worst},
        "groups": {"by": "global_rank", "rows": rows},
        "units": {name: "ms" for name in STEP_TIME_METRICS},
        "breakdown": breakdown(average, clock, _steps_without_gap(ranks, used, window)),
        "card": "",
    }
    # Step memory: averages of per-step peaks over the same window.
    mem_rows = {}
    for r in used:
        steps = [ranks[r].steps[s] for s in window]
        mem_rows[str(r)] = {
            "identity": _identity(ranks[r], world, nproc),
            "metrics": {
                "peak_allocated_bytes": _mean(s.mem.cuda_peak_allocated if s.mem else None for s in steps),
                "peak_reserved_bytes": _mean(s.mem.cuda_peak_reserved if s.mem else None for s in steps),
            },
        }
    m_avg, m_med, m_worst = _points(mem_rows, STEP_MEMORY_METRICS)
    has_mem = m_avg["peak_reserved_bytes"] is not None or m_avg["peak_allocated_bytes"] is not None
    mem_issue = _issue("BALANCED", "BALANCED", "info", "Device memory peaks are balanced across ranks.", "No action needed.") if has_mem \
        else _issue("NO_DATA", "NO DATA", "info", "No device memory was measured (CPU run).", "Run on a GPU to see device memory peaks.")
    step_memory = {
        "metadata": dict(meta, section_metric_names=list(STEP_MEMORY_METRICS)),
        "diagnosis": mem_issue,
        "issues": [mem_issue],
        "global": {"index_by": "global_rank", "window": dict(step_window), "average": m_avg, "median": m_med, "worst": m_worst},
        "groups": {"by": "global_rank", "rows": mem_rows},
        "units": {name: "bytes" for name in STEP_MEMORY_METRICS},
        "card": "",
    }
    return step_time, step_memory


def system_section(samples: dict[int, list[records.SystemSample]], analysis: dict, topology: dict) -> dict:
    """Node system metrics averaged over the analysis window's timestamps."""
    start, end = analysis.get("start_ts_s"), analysis.get("end_ts_s")
    rows = {}
    total = 0
    for node, node_samples in sorted(samples.items()):
        chosen = [s for s in node_samples if (start is None or s.ts >= start - 1.0) and (end is None or s.ts <= end + 1.0)] or node_samples
        total += len(chosen)
        gpus = [g for s in chosen for g in s.gpus]
        rows[str(node)] = {
            "identity": {"node_rank": node, "hostname": None},
            "metrics": {
                "cpu_percent": _mean(s.cpu_pct for s in chosen),
                "ram_bytes": _mean(s.ram_used for s in chosen),
                "ram_percent": _mean((s.ram_used / s.ram_total * 100.0) if s.ram_used is not None and s.ram_total else None for s in chosen),
                "gpu_util_percent": _mean(g.util_pct for g in gpus),
                "gpu_mem_bytes": _mean(g.mem_used for g in gpus),
                "gpu_mem_percent": _mean((g.mem_used / g.mem_total * 100.0) if g.mem_used is not None and g.mem_total else None for g in gpus),
                "gpu_temp_c": _mean(g.temp_c for g in gpus),
                "gpu_power_w": _mean(g.power_w for g in gpus),
                "gpu_headroom_bytes": _mean((g.mem_total - g.mem_used) if g.mem_used is not None and g.mem_total else None for g in gpus),
            },
        }
    average, median, worst = _points(rows, SYSTEM_METRICS)
    gpus_observed = max((len(s.gpus) for node_samples in samples.values() for s in node_samples), default=0) * max(len(samples), 1) if samples else None
    issue = _issue("NORMAL", "NORMAL", "info", "System resources look normal.", "No action needed.") if rows \
        else _issue("NO_DATA", "NO DATA", "info", "No system samples were recorded.", "Launch with traceml run to sample nodes.")
    meta = _metadata(ranks_seen=[], ranks_used=[], metric_names=SYSTEM_METRICS, window=analysis,
                     nodes_expected=topology.get("expected_nodes"), nodes_observed=len(rows) or None, samples=total, latest_step=None)
    meta["mode"] = "no_data" if not rows else ("multi_node" if len(rows) > 1 else "single_node")
    meta["gpus_observed"] = gpus_observed
    return {
        "metadata": meta, "diagnosis": issue, "issues": [issue],
        "global": {"index_by": "node_rank", "window": {"kind": "sample_window", "alignment": "none", "samples": total,
                   "steps_analyzed": None, "start_step": None, "end_step": None, "completed_step": None, "diagnosis_clock": "cpu"},
                   "average": average, "median": median, "worst": worst},
        "groups": {"by": "node_rank", "rows": rows},
        "units": {}, "card": "",
    }


def process_section(ranks: dict[int, RankSteps], window: list[int], analysis: dict, topology: dict) -> dict:
    """Per-rank process memory (RSS) over the window; other process metrics are not sampled."""
    nproc, world = topology.get("processes_per_node"), topology.get("expected_world_size")
    rows = {}
    for r in sorted(ranks):
        steps = [ranks[r].steps[s] for s in window if s in ranks[r].steps]
        metrics = {name: None for name in PROCESS_METRICS}
        metrics["ram_bytes"] = _mean(s.mem.rss if s.mem else None for s in steps)
        metrics["gpu_mem_reserved_bytes"] = _mean(s.mem.cuda_peak_reserved if s.mem else None for s in steps)
        metrics["gpu_mem_used_bytes"] = _mean(s.mem.cuda_peak_allocated if s.mem else None for s in steps)
        rows[str(r)] = {"identity": _identity(ranks[r], world, nproc), "metrics": metrics}
    average, median, worst = _points(rows, PROCESS_METRICS)
    issue = _issue("NORMAL", "NORMAL", "info", "Process memory looks normal.", "No action needed.") if rows \
        else _issue("NO_DATA", "NO DATA", "info", "No rank reported.", "Launch with traceml run.")
    meta = _metadata(ranks_seen=sorted(ranks), ranks_used=sorted(ranks), metric_names=PROCESS_METRICS, window=analysis,
                     nodes_expected=topology.get("expected_nodes"), nodes_observed=None, samples=len(rows), latest_step=None)
    return {
        "metadata": meta, "diagnosis": issue, "issues": [issue],
        "global": {"index_by": "global_rank", "window": {"kind": "step_window", "alignment": "common_steps", "samples": len(rows),
                   "steps_analyzed": len(window), "start_step": window[0] if window else None, "end_step": window[-1] if window else None,
                   "completed_step": window[-1] if window else None, "diagnosis_clock": "cpu"},
                   "average": average, "median": median, "worst": worst},
        "groups": {"by": "global_rank", "rows": rows},
        "units": {}, "card": "",
    }


# -- run context (allow-listed manifest facts) --------------------------------------------------
def run_context(manifest: Optional[dict]) -> dict:
    """Portable run facts from the manifest; ``{}`` when there is no readable manifest."""
    if not isinstance(manifest, dict) or not manifest:
        return {}
    context: dict[str, Any] = {}
    status = manifest.get("status")
    if status in _RUN_STATUSES:
        context["run"] = {"status": status, "profile": "run"}
    guard = manifest.get("guard") if isinstance(manifest.get("guard"), dict) else {}
    if "contract" in guard:
        from traceml_tui.guard.contract import ContractError, parse_guard_contract

        try:
            context["declaration"] = parse_guard_contract(guard["contract"])
        except ContractError:
            pass
    topology = manifest.get("topology") if isinstance(manifest.get("topology"), dict) else {}
    execution: dict[str, Any] = {}
    for ours, theirs in (("nnodes", "expected_nodes"), ("nproc_per_node", "processes_per_node"), ("world_size", "expected_world_size")):
        value = topology.get(ours)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            execution[theirs] = value
    training = guard.get("training")
    if isinstance(training, dict):
        from traceml_tui.guard.outcome import launcher_completion

        completion = launcher_completion(training)
        if completion:
            execution["launcher_completion"] = completion
    if execution:
        context["execution"] = execution
    return context


# -- our own sections ---------------------------------------------------------------------------
def training_section(ranks: dict[int, RankSteps], run_dir: Path) -> dict:
    """Loss, scale-free ratios and evaluation freshness (rank 0's view)."""
    series = ranks.get(0) or (ranks[min(ranks)] if ranks else None)
    out: dict[str, Any] = {"steps_completed": None, "examples": None, "loss": None, "components": {}, "eval": None}
    if series is None or not series.steps:
        return out
    steps = [series.steps[s] for s in sorted(series.steps)]
    out["steps_completed"] = steps[-1].step
    out["examples"] = steps[-1].examples
    losses = [s.loss for s in steps if s.loss is not None]
    if losses:
        out["loss"] = {"first": losses[0], "last": losses[-1], "min": min(losses)}
    names = sorted({n for s in steps if s.components for n in s.components})
    for name in names:
        ratios = [s.components[name].ratio for s in steps if s.components and name in s.components and s.components[name].ratio is not None]
        if ratios:
            tail = ratios[-max(1, len(ratios) // 10):]
            out["components"][name] = {
                "ratio_first": ratios[0], "ratio_last": ratios[-1], "ratio_min": min(ratios),
                "ratio_recent_median": statistics.median(tail),
                "learning": statistics.median(tail) < 1.0,
            }
    evals = [e for e in series.evals if e.status == "completed"]
    pending = [e for e in series.evals if e.status == "pending"]
    evaluated = [freshness.Evaluated(e.step, e.checkpoint) for e in evals]
    from traceml_tui.core.rundir import RunDir

    entries = None
    if RunDir(run_dir).backlog_dir("requests").is_dir():
        from traceml_tui.hygiene.backlog import backlog_entries  # imported here: `traceml compare` loads this module

        entries = backlog_entries(run_dir)
        reported = {e.checkpoint for e in evals if e.checkpoint}
        # a receipt is a completed evaluation too (core/freshness.py), counted once beside its eval record
        evaluated += [freshness.Evaluated(e.step, e.checkpoint) for e in entries
                      if e.receipt is not None and e.step is not None and e.checkpoint not in reported]
    fresh = freshness.eval_freshness(steps[-1].step, evaluated)
    out["eval"] = {
        "completed": len(evaluated),
        "pending": len(pending),
        "newest_checkpoint": fresh.newest_checkpoint,
        "newest_step": fresh.newest_step,
        "lag_steps": fresh.lag_steps,
    }
    if entries is not None:
        # outstanding = every request without a receipt (core/backlog.py is_outstanding)
        out["eval"]["backlog"] = len(core_backlog.outstanding(entries))
    return out


def integration_section(loaded: dict[int, RankSteps]) -> dict:
    """What the run's integration measured (docs/run.md, "Unmeasured streams").

    ``steps_traced``: whether any rank recorded a step; ``unmeasured``: ``{rank, stream, reason}`` per
    stream a rank reported dark (``traceml.report_unmeasured``), folded by ``core/coverage.py`` — the
    rule ``traceml status`` applies to the same records in the index.
    """
    found = [(rank, u.stream, u.reason) for rank in sorted(loaded) for u in loaded[rank].unmeasured]
    return {
        "steps_traced": any(series.steps for series in loaded.values()),
        "unmeasured": coverage.unmeasured_entries(found),
    }


def environment_section() -> dict:
    """Software fingerprint of the finalizing node (no host names, no paths)."""
    from importlib import metadata

    def version(name: str) -> Optional[str]:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": f"{platform.system()}-{platform.machine()}",
        "torch": version("torch"),
        "traceml": version("traceml-tui"),
    }


def _qc_section(ranks: dict[int, RankSteps], run_dir: Path, manifest: dict) -> dict:
    """QC (seed 004): each latent field's collapse verdict and, for a bound ``hygiene.qc`` block, each
    required item's row; a collapsed field or a required item never produced is a failure."""
    from traceml_tui.hygiene import field_qc, qc_block  # imported here: `traceml compare` loads this module

    fields = field_qc.summarize_records(rec for series in ranks.values() for rec in series.fields)
    hygiene = manifest.get("hygiene") if isinstance(manifest.get("hygiene"), dict) else {}
    return qc_block.qc_report(run_dir, hygiene.get("qc"), fields)


def validation_section(run_dir: Path, manifest: dict) -> Optional[dict]:
    """What the validation backlog delivered (seed 004), from the backlog and early-stopping files.

    The one builder of the summary's ``validation`` section: at the end of a run and when a drainer
    refreshes an ended run's record (``summary/store.py``).
    """
    from traceml_tui.hygiene.report import validation_report  # imported here: `traceml compare` loads this module

    hygiene = manifest.get("hygiene") if isinstance(manifest.get("hygiene"), dict) else None
    return validation_report(run_dir, hygiene)


def hygiene_warnings_section(ranks: dict[int, RankSteps], manifest: dict, validation: Optional[dict]) -> list[str]:
    """The end-of-run warnings of seed 004's rules (``hygiene/warnings.py`` words them), from rank 0's records."""
    from traceml_tui.hygiene.warnings import hygiene_warnings, step_facts  # `traceml compare` loads this module

    series = ranks.get(0) or (ranks[min(ranks)] if ranks else None)
    facts = step_facts(series.steps.values() if series is not None else ())
    hygiene = manifest.get("hygiene") if isinstance(manifest.get("hygiene"), dict) else None
    return hygiene_warnings(hygiene, validation, facts)


def build_summary(run_dir: Path, manifest: Optional[dict], *, now: Optional[float] = None) -> dict:
    """Build the complete summary payload for a run directory (``text`` left empty)."""
    manifest = manifest if isinstance(manifest, dict) else {}
    retention = manifest.get("history_retention_s")
    retention_s = float(retention) if isinstance(retention, (int, float)) and not isinstance(retention, bool) and retention > 0 else DEFAULT_RETENTION_S
    loaded = load_ranks(run_dir)
    # a rank that only recorded QC fields (killed before its first step) counts for QC alone
    ranks = {rank: series for rank, series in loaded.items() if series.steps or series.ended is not None}
    window = common_window(ranks, retention_s)
    context = run_context(manifest)
    topology = dict(context.get("execution", {}))
    used = [r for r in ranks if window and all(s in ranks[r].steps for s in window)]
    if window and used:
        start_ts = min(ranks[r].steps[window[0]].ts - (ranks[r].steps[window[0]].cpu_ms.step or 0.0) / 1000.0 for r in used)
        end_ts = max(ranks[r].steps[window[-1]].ts for r in used)
        analysis = {"anchor": "step_time", "retention_s": retention_s, "start_ts_s": start_ts, "end_ts_s": end_ts,
                    "duration_s": end_ts - start_ts, "start_step": window[0], "end_step": window[-1]}
    else:
        analysis = {"anchor": None, "retention_s": retention_s, "start_ts_s": None, "end_ts_s": None,
                    "duration_s": None, "start_step": None, "end_step": None}
    samples = load_system(run_dir)
    step_time, step_memory = step_sections(ranks, window, topology, analysis)
    system = system_section(samples, analysis, topology)
    process = process_section(ranks, window, analysis, topology)
    sys_samples = [s for node in samples.values() for s in node]
    analysis["sections"] = {"system": {
        "samples": system["metadata"]["samples"] or 0,
        "observed_start_ts_s": min((s.ts for s in sys_samples), default=None),
        "observed_end_ts_s": max((s.ts for s in sys_samples), default=None),
    }}
    started, ended = manifest.get("started_at"), manifest.get("ended_at")
    duration = (ended - started) if isinstance(started, (int, float)) and isinstance(ended, (int, float)) and ended >= started else None
    world_seen = len(ranks) or None
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": _iso(time.time() if now is None else now),
        "duration_s": duration,
        "analysis_window": analysis,
        "meta": {
            "run_name": manifest.get("run_name") or run_dir.name,
            "mode": step_time["metadata"]["mode"],
            "world_size": world_seen,
            "nodes_observed": len(samples) or step_time["metadata"]["nodes_observed"],
            "gpus_observed": system["metadata"]["gpus_observed"],
        },
        "run_context": context,
        "primary_diagnosis": dict(step_time["diagnosis"]),
        "system": system,
        "process": process,
        "step_time": step_time,
        "step_memory": step_memory,
        "training": training_section(ranks, run_dir),
        "integration": integration_section(loaded),
        "qc": _qc_section(loaded, run_dir, manifest),
        "validation": (validation := validation_section(run_dir, manifest)),
        "hygiene_warnings": hygiene_warnings_section(ranks, manifest, validation),
        "environment": environment_section(),
        "text": "",
    }
