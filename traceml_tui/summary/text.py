"""The human-readable card stored in ``final_summary.json`` ``text`` and ``final_summary.txt``.

A presentation of stored values only: nothing here is recomputed.
"""

from __future__ import annotations

from typing import Any, Optional

from traceml_tui.core import coverage, forensics, steptime


def _ms(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.2f} ms"


def _pct(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.1f}%"


def render_text(summary: dict[str, Any]) -> str:
    """Render the compact card: verdict, why, next, then the step-time table."""
    meta = summary.get("meta", {})
    context = summary.get("run_context", {})
    step_time = summary.get("step_time", {})
    glob = step_time.get("global", {})
    window = glob.get("window", {})
    average = glob.get("average", {})
    diagnosis = step_time.get("diagnosis", {})
    status = context.get("run", {}).get("status", "unknown")
    lines = [
        f"TraceML summary · run {meta.get('run_name')} · {status}",
        f"Verdict: {diagnosis.get('status', 'NO DATA')} — {diagnosis.get('summary', '')}",
        f"Next:    {diagnosis.get('action', '')}",
    ]
    failure = summary.get("failure")
    if isinstance(failure, dict):  # who failed first, where and why (core/forensics.py)
        first, *rest = forensics.section_lines(failure)
        lines.insert(1, f"Failure: {first}")
        lines[2:2] = [f"         {line}" for line in rest]
    declaration = context.get("declaration")
    execution = context.get("execution", {})
    if declaration:
        m = declaration["measurement"]
        lines.append(
            f"Guard:   workload {declaration['workload']['name']}, declared steps "
            f"{m['start_step']}-{m['start_step'] + m['completed_steps'] - 1}; launcher completion "
            f"{execution.get('launcher_completion', {}).get('status', 'not recorded')}"
        )
    if execution:
        lines.append(
            f"Topology: {execution.get('expected_nodes', '?')} node(s) × {execution.get('processes_per_node', '?')} "
            f"process(es) = world size {execution.get('expected_world_size', '?')}"
        )
    steps = window.get("steps_analyzed") or 0
    if steps:
        lines.append(
            f"Window:  steps {window.get('start_step')}-{window.get('end_step')} ({steps} common steps, "
            f"{window.get('diagnosis_clock', 'cpu').upper()} clock, {meta.get('world_size')} rank(s))"
        )
        lines.append("")
        lines.append(f"  {'part':<15}{'average':>12}{'share':>8}{'median rank':>16}{'worst rank':>16}")
        parts = (step_time.get("breakdown") or {}).get("parts") or []
        shares = {row.get("metric"): row.get("share_pct") for row in parts if isinstance(row, dict)}
        shares["step_time_ms"] = 100.0 if average.get("step_time_ms") else None
        table = [(steptime.STEP_LABEL, "step_time_ms")]
        table += [(label, steptime.metric_name(name)) for name, label in steptime.PARTS]
        for label, name in table:
            value = average.get(name)
            share = shares.get(name)
            med = glob.get("median", {}).get(name, {})
            worst = glob.get("worst", {}).get(name, {})
            lines.append(
                f"  {label:<15}{_ms(value):>12}{_pct(share):>8}"
                f"{_ms(med.get('value')) + (' r' + str(med.get('idx')) if med.get('idx') is not None else ''):>16}"
                f"{_ms(worst.get('value')) + (' r' + str(worst.get('idx')) if worst.get('idx') is not None else ''):>16}"
            )
        lines.append("  step time = time from the previous step's end to this step's end = the sum of the parts")
        no_gap = (step_time.get("breakdown") or {}).get("steps_without_gap") or 0
        if no_gap:
            lines.append(f"  {no_gap} of {steps} steps began an attempt (no previous step end): they count their traced time only")
        if average.get("data_wait_ms") is None:
            lines.append("  data wait not measured: no DataLoader or traceml.wrap_loader(...) fed the traced steps,")
            lines.append("  so the whole gap between steps counts as between steps")
        cpu, gpu = average.get("step_time_cpu_ms"), average.get("step_time_gpu_ms")
        lines.append(f"  step time by clock: CPU {_ms(cpu)} · GPU {_ms(gpu)}")
    else:
        lines.append("Window:  no step completed on every rank")
    integration = summary.get("integration") or {}
    for line in coverage.unmeasured_lines(integration.get("unmeasured") or []):
        lines.append(f"Unmeasured: {line}")
    training = summary.get("training") or {}
    comps = training.get("components") or {}
    for name, comp in sorted(comps.items()):
        flag = "learning" if comp.get("learning") else "NOT below the no-skill line (1.0)"
        lines.append(f"Loss {name}: scale-free ratio {comp['ratio_first']:.3f} → {comp['ratio_last']:.3f} ({flag})")
    for name, field in sorted(((summary.get("qc") or {}).get("fields") or {}).items()):
        if field.get("status") == "failed":
            lines.append(f"QC FAILED: field {name} collapsed at step {field.get('failed_at_step')} "
                         f"(spread below {field.get('factor')} x its initial spread)")
    from traceml_tui.hygiene.qc_block import report_lines as qc_lines  # required QC items of a bound block

    lines.extend(qc_lines(summary.get("qc")))
    from traceml_tui.hygiene.report import report_lines  # validation: backlog counts, best, stop, curve

    lines.extend(report_lines(summary.get("validation")))
    lines.extend(f"Warning: {line}" for line in summary.get("hygiene_warnings") or [])
    return "\n".join(lines)
