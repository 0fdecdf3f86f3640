"""Markdown comparison report for ``$GITHUB_STEP_SUMMARY`` (``--format markdown``).

Verdict first, then one table; pure: report dict in, string out.
"""

from __future__ import annotations

from typing import Any

from traceml_tui.compare.render_text import (
    declaration_text,
    fmt_delta,
    fmt_pct,
    fmt_value,
    headline,
    topology_text,
)

_ICONS = {
    "WITHIN_THRESHOLD_IN_THIS_PAIR": "✅",
    "FASTER_IN_THIS_PAIR": "✅",
    "SLOWER_IN_THIS_PAIR": "❌",
    "INCONCLUSIVE": "⚠️",
}


def _cell(text: Any) -> str:
    # A pipe or newline inside a cell would break the table.
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: dict[str, Any]) -> str:
    """The Markdown report: a verdict heading, the reason, then a metrics table."""
    ref, cand = report["reference"], report["candidate"]
    ci = report.get("ci")
    result, why = headline(report)
    icon = _ICONS.get(ci["result"], "") if ci else "ℹ️"
    lines = [
        f"### {icon} TraceML compare: `{_cell(result)}`".replace("  ", " "),
        "",
        f"**Why:** {_cell(why)}",
        "",
        f"Reference `{_cell(ref['label'])}` vs candidate `{_cell(cand['label'])}`"
        + (f"; threshold {ci['threshold_pct']:g}% maximum Step Time regression." if ci else "."),
        "",
        "| Metric | Reference | Candidate | Delta | Change |",
        "|---|---:|---:|---:|---:|",
    ]
    step = report["step_time"]
    clock = (step["clock"] or "no common").upper()
    lines.append(
        f"| **Step Time ({clock} clock)** | {fmt_value(step['reference'], 'ms')} | "
        f"{fmt_value(step['candidate'], 'ms')} | {fmt_delta(step['delta'], 'ms')} | **{fmt_pct(step['pct_change'])}** |"
    )
    lines.append(
        f"| Steps analyzed | {_count(step['reference_steps_analyzed'])} | {_count(step['candidate_steps_analyzed'])} | | |"
    )
    for row in report["phases"]["rows"].values():
        if row["reference"] is None and row["candidate"] is None:
            continue
        lines.append(
            f"| {_cell(row['label'])} | {fmt_value(row['reference'], 'ms')} | {fmt_value(row['candidate'], 'ms')} | "
            f"{fmt_delta(row['delta'], 'ms')} | {fmt_pct(row['pct_change'])} |"
        )
    for key in ("memory", "system"):
        for row in report[key].values():
            if row["reference"] is None and row["candidate"] is None:
                continue
            unit = row["unit"]
            lines.append(
                f"| {_cell(row['label'])} | {fmt_value(row['reference'], unit)} | {fmt_value(row['candidate'], unit)} | "
                f"{fmt_delta(row['delta'], unit)} | {fmt_pct(row['pct_change'])} |"
            )
    primary = report["diagnoses"].get("primary", {})
    if primary.get("reference") or primary.get("candidate"):
        lines.append(
            f"| Primary diagnosis | {_cell(primary.get('reference') or '-')} | {_cell(primary.get('candidate') or '-')} | | |"
        )
    lines.append("")
    if ref["declaration"] and ref["declaration"] == cand["declaration"]:
        lines.append(f"Declaration (both): {_cell(declaration_text(ref['declaration']))}  ")
    else:
        lines.append(f"Declaration: reference {_cell(declaration_text(ref['declaration']))}; "
                     f"candidate {_cell(declaration_text(cand['declaration']))}  ")
    lines.append(f"Topology: reference {topology_text(ref['topology'])}; candidate {topology_text(cand['topology'])}")
    noise = report.get("noise")
    if noise and noise.get("status") == "ok":
        lo, hi = noise["pct_interval_95"]
        lines.append("")
        lines.append(
            f"Noise: bootstrap 95% interval of the Step Time change {lo:+.2f}% to {hi:+.2f}% "
            f"({noise['reference_steps']} vs {noise['candidate_steps']} steps)."
            + (f" {_cell(noise['note'])}" if noise.get("note") else "")
        )
    for warning in report["warnings"]:
        lines.append("")
        lines.append(f"> {_cell(warning)}")
    return "\n".join(lines) + "\n"


def _count(value: Any) -> str:
    return "-" if value is None else str(value)
