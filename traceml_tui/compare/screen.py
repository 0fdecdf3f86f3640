"""The comparison as rows for a side-by-side table (``traceml watch``'s Compare screen).

Runs the same comparison core as ``traceml compare`` (:func:`compare_summaries`)
and lays its report out as ``(field, reference, candidate, delta)`` rows, so the
screen shows the verdict, the reason and every figure of the CLI's report, in
its units. Textual-free: the screen only draws these rows. Numbers without a
unit are formatted by the caller's ``number`` (the screen's short style).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from traceml_tui.compare.core import compare_summaries
from traceml_tui.compare.render_text import fmt_value, steps_text
from traceml_tui.core.artifacts import decode_summary


@dataclass(frozen=True)
class ComparisonRows:
    """The core's result and the rows a side-by-side table shows."""

    result: Optional[str]
    exit_code: int
    reason_code: Optional[str]
    reason: Optional[str]
    rows: tuple[tuple[str, str, str, str], ...]  # (field, reference, candidate, delta)
    diagnoses: tuple[tuple[str, str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    report: Any = field(default=None, compare=False, repr=False)


def _pct(value: Any) -> str:
    return "" if value is None else f"{value:+.1f}%"


def _declaration(info: dict) -> str:
    d = info.get("declaration")
    if isinstance(d, dict):
        workload = d.get("workload") if isinstance(d.get("workload"), dict) else {}
        measurement = d.get("measurement") if isinstance(d.get("measurement"), dict) else {}
        name = workload.get("name", "?")
        return f"{name} {steps_text(measurement)}" if measurement else str(name)  # as `traceml compare` prints it
    return info.get("declaration_problem") or "–"


def _topology(info: dict) -> str:
    t = info.get("topology")
    return f"{t['nodes']}×{t['processes_per_node']} (world {t['world_size']})" if t else "–"


def training_ratio(summary: dict) -> Optional[float]:
    """Worst recent scale-free loss ratio from our own ``training`` section (None for other summaries)."""
    typed = decode_summary(summary)
    return typed.training.worst_ratio[1] if typed is not None and typed.training is not None else None


def comparison_rows(reference: dict, candidate: dict, threshold_pct: Optional[float], labels: tuple[str, str],
                    number: Callable[[Optional[float]], str]) -> ComparisonRows:
    """Compare two summaries as ``traceml compare`` does and lay the report out as table rows."""
    res = compare_summaries(reference, candidate, threshold_pct, labels=labels)
    rep = res.report
    ref_info, cand_info = rep.get("reference") or {}, rep.get("candidate") or {}
    rows: list[tuple[str, str, str, str]] = [
        ("Run", str(ref_info.get("run_name") or labels[0]), str(cand_info.get("run_name") or labels[1]), ""),
        ("Status", str(ref_info.get("run_status") or "–"), str(cand_info.get("run_status") or "–"), ""),
        ("Declaration", _declaration(ref_info), _declaration(cand_info), ""),
        ("Topology", _topology(ref_info), _topology(cand_info), ""),
    ]
    st = rep.get("step_time") or {}
    rows.append((f"Step time ({st.get('clock') or '?'} clock) ms", number(st.get("reference")),
                 number(st.get("candidate")), _pct(st.get("pct_change"))))
    rows.append(("Steps analyzed", str(st.get("reference_steps_analyzed") or "–"),
                 str(st.get("candidate_steps_analyzed") or "–"), ""))
    for row in ((rep.get("phases") or {}).get("rows") or {}).values():
        if row.get("reference") is None and row.get("candidate") is None:
            continue
        rows.append((f"  {row['label']} ms", number(row.get("reference")), number(row.get("candidate")),
                     _pct(row.get("pct_change"))))
    for section in ("memory", "system"):
        for row in (rep.get(section) or {}).values():
            if row.get("reference") is None and row.get("candidate") is None:
                continue
            unit = row.get("unit") or ""  # in the units `traceml compare` prints (MiB, GiB, %)
            rows.append((row["label"], fmt_value(row.get("reference"), unit), fmt_value(row.get("candidate"), unit),
                         _pct(row.get("pct_change"))))
    ref_ratio, cand_ratio = training_ratio(reference), training_ratio(candidate)
    if ref_ratio is not None or cand_ratio is not None:
        rows.append(("Loss ratio (1.0 = no skill)", number(ref_ratio), number(cand_ratio), ""))
    diagnoses = tuple((name, str(d.get("reference") or "–"), str(d.get("candidate") or "–"))
                      for name, d in (rep.get("diagnoses") or {}).items() if d.get("reference") or d.get("candidate"))
    return ComparisonRows(result=res.result, exit_code=res.exit_code, reason_code=res.reason_code, reason=res.reason,
                          rows=tuple(rows), diagnoses=diagnoses, warnings=tuple(rep.get("warnings") or ()), report=rep)
