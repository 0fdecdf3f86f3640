"""Plain-text comparison report (``BASE.txt``, and stdout by default).

Leads with the verdict and the one sentence that explains it; the tables
after it are context. Pure: report dict in, string out.
"""

from __future__ import annotations

from typing import Any, Optional

EXPLORATORY_NOTE = "Exploratory comparison: no threshold was given, so there is no CI result (exit 0)."


def fmt_value(value: Optional[float], unit: str) -> str:
    """Human-readable value in its unit; '-' when missing."""
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:.4g} ms"
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "bytes":
        return fmt_bytes(value)
    return f"{value:g}"


def fmt_delta(value: Optional[float], unit: str) -> str:
    if value is None:
        return "-"
    sign = "+" if value >= 0 else "-"
    if unit == "%":
        return f"{sign}{abs(value):.1f} pp"
    return sign + fmt_value(abs(value), unit)


def fmt_pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:+.2f}%"


def fmt_bytes(value: float) -> str:
    size = abs(value)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def headline(report: dict[str, Any]) -> tuple[str, str]:
    """(result line, why line) shared by the text and Markdown renderers."""
    ci = report.get("ci")
    eligibility = report["eligibility"]
    if ci is not None:
        result = f"{ci['result']} (exit {ci['exit_code']})"
        why = ci["reason"] or ""
        if ci.get("reason_code"):
            why = f"[{ci['reason_code']}] {why}"
        return result, why
    step = report["step_time"]
    if eligibility["eligible"]:
        why = (
            f"{step['clock'].upper()} Step Time went from {fmt_value(step['reference'], 'ms')} to "
            f"{fmt_value(step['candidate'], 'ms')} ({fmt_pct(step['pct_change'])})."
        )
    else:
        why = (
            f"A CI check of this pair would be INCONCLUSIVE: [{eligibility['reason_code']}] "
            f"{eligibility['reason']}"
        )
    return "none (exploratory)", f"{EXPLORATORY_NOTE} {why}"


def _table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    out = []
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def _metric_rows(rows: dict[str, Any], unit_of) -> list[list[str]]:
    out = []
    for key, row in rows.items():
        if row["reference"] is None and row["candidate"] is None:
            continue
        unit = unit_of(key, row)
        out.append(
            [
                row["label"],
                fmt_value(row["reference"], unit),
                fmt_value(row["candidate"], unit),
                fmt_delta(row["delta"], unit),
                fmt_pct(row["pct_change"]),
            ]
        )
    return out


def steps_text(measurement: dict[str, Any]) -> str:
    """A declared measurement window as every surface shows it: ``steps 1-20`` (first to last step)."""
    start, count = measurement.get("start_step"), measurement.get("completed_steps")
    if isinstance(start, int) and isinstance(count, int):
        return f"steps {start}-{start + count - 1}"
    return f"steps {start}+{count}"


def declaration_text(declaration: Optional[dict[str, Any]]) -> str:
    if not declaration:
        return "none"
    workload = declaration["workload"]
    params = ", ".join(f"{k}={v!r}" for k, v in workload["parameters"].items()) or "no parameters"
    return f"{workload['name']} ({params}); {steps_text(declaration['measurement'])}"


def topology_text(topology: Optional[dict[str, Any]]) -> str:
    if not topology:
        return "invalid or missing"
    return f"{topology['nodes']} node(s) x {topology['processes_per_node']} process(es), world size {topology['world_size']}"


def render_text(report: dict[str, Any]) -> str:
    """The full plain-text report."""
    ref, cand = report["reference"], report["candidate"]
    result, why = headline(report)
    lines = [
        f"TraceML compare: {ref['label'] or 'reference'} (reference) vs {cand['label'] or 'candidate'} (candidate)",
        "",
        f"Result: {result}",
        f"Why: {why}",
    ]
    ci = report.get("ci")
    if ci is not None:
        lines.append(f"Threshold: {ci['threshold_pct']:g}% maximum Step Time regression")
    lines.append("")

    step = report["step_time"]
    clock = (step["clock"] or "no common").upper()
    header = ["", "reference", "candidate", "delta", "change"]
    step_rows = [
        [
            f"Step Time ({clock} clock)",
            fmt_value(step["reference"], "ms"),
            fmt_value(step["candidate"], "ms"),
            fmt_delta(step["delta"], "ms"),
            fmt_pct(step["pct_change"]),
        ],
        [
            "Steps analyzed",
            _count(step["reference_steps_analyzed"]),
            _count(step["candidate_steps_analyzed"]),
            "",
            "",
        ],
    ]
    lines.append("Step Time")
    lines += _table(header, step_rows)
    if step["clock"] is None:
        avail = step["available_clocks"]
        lines.append(
            f"  Measured clocks: reference {'/'.join(avail['reference']) or 'none'}, "
            f"candidate {'/'.join(avail['candidate']) or 'none'}."
        )

    phases = report["phases"]
    phase_rows = _metric_rows(phases["rows"], lambda key, row: "ms")
    lines.append("")
    lines.append(f"Phases ({phases['clock'].upper()} clock, averages per step)" if phases["clock"] else "Phases")
    if phases["note"]:
        lines.append(f"  {phases['note']}")
    elif phase_rows:
        lines += _table(header, phase_rows)
    else:
        lines.append("  No phase timings in either summary.")

    for title, key in (("Memory", "memory"), ("System", "system")):
        rows = _metric_rows(report[key], lambda k, row: row["unit"])
        if rows:
            lines.append("")
            lines.append(title)
            lines += _table(header, rows)

    diag_rows = [
        [name.replace("_", " "), d["reference"] or "-", d["candidate"] or "-"]
        for name, d in report["diagnoses"].items()
        if d["reference"] or d["candidate"]
    ]
    if diag_rows:
        lines.append("")
        lines.append("Diagnoses")
        lines += _table(["", "reference", "candidate"], diag_rows)

    lines.append("")
    lines.append("Declaration and topology")
    if ref["declaration"] == cand["declaration"] and ref["declaration"]:
        lines.append(f"  declaration (both): {declaration_text(ref['declaration'])}")
    else:
        for role, info in (("reference", ref), ("candidate", cand)):
            text = declaration_text(info["declaration"])
            if info["declaration_problem"]:
                text = f"summary {info['declaration_problem']}"
            lines.append(f"  declaration ({role}): {text}")
    if ref["topology"] == cand["topology"] and ref["topology"]:
        lines.append(f"  topology (both): {topology_text(ref['topology'])}")
    else:
        lines.append(f"  topology (reference): {topology_text(ref['topology'])}")
        lines.append(f"  topology (candidate): {topology_text(cand['topology'])}")
    lines.append(
        f"  run status: {ref['run_status'] or 'missing'} -> {cand['run_status'] or 'missing'}; "
        f"launcher completion: {ref['launcher_status'] or 'missing'} -> {cand['launcher_status'] or 'missing'}"
    )

    noise = report.get("noise")
    if noise:
        lines.append("")
        lines += noise_lines(noise)

    if report["warnings"]:
        lines.append("")
        lines.append("Notes")
        lines += [f"  - {w}" for w in report["warnings"]]
    lines.append("")
    lines.append("This result describes one pair of runs; it is not a statistical significance test.")
    return "\n".join(lines) + "\n"


def noise_lines(noise: dict[str, Any]) -> list[str]:
    """Text lines for the step-record noise section."""
    lines = ["Noise (per-step records, bootstrap)"]
    if noise.get("status") != "ok":
        lines.append(f"  {noise.get('note') or 'not available'}")
        return lines
    lo, hi = noise["pct_interval_95"]
    lines.append(
        f"  Step Time ratio candidate/reference: {noise['ratio']:.4f}, 95% interval "
        f"{noise['ratio_interval_95'][0]:.4f}-{noise['ratio_interval_95'][1]:.4f} "
        f"({lo:+.2f}% to {hi:+.2f}%)"
    )
    lines.append(
        f"  {noise['reference_steps']} reference and {noise['candidate_steps']} candidate steps "
        f"({noise['clock'].upper()} clock), {noise['resamples']} resamples, seed {noise['seed']}."
    )
    if noise.get("note"):
        lines.append(f"  {noise['note']}")
    return lines


def _count(value: Optional[int]) -> str:
    return "-" if value is None else str(value)
