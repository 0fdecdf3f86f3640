"""What a run's validation delivered, for ``final_summary.json`` ``validation`` (seed 004).

Everything here is read from the files the backlog and early stopping already
keep; no state is decided here:

* request states come from :func:`traceml_tui.hygiene.backlog.backlog_status`
  (the words of :func:`traceml_tui.core.state.decide_backlog`);
* the selected best checkpoint, the stop and its reason from
  ``early_stopping.json`` (:mod:`traceml_tui.hygiene.early_stopping`).

The section says ``status: missing`` when a run that declared
``hygiene.validation`` published no checkpoint, or ended with requests that
have no receipt: a pending or failed request is never a result (docs/hygiene.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from traceml_tui.core.rundir import LEARNING_CURVE, RunDir
from traceml_tui.core.state import BACKLOG_ORDER, BacklogState
from traceml_tui.core.stopping import state_word
from traceml_tui.hygiene import backlog

#: The section's status words.
COMPLETE = "complete"  # every request has a receipt
MISSING = "missing"  # nothing published, or requests without a receipt at the end

#: What the selection split is, said wherever the best checkpoint is shown.
SELECTION_NOTE = "eval was used to select this checkpoint: it is not an untouched test"


def _count_key(word: BacklogState) -> str:
    return word.value.replace("-", "_")


def _early_stopping(run_dir: Path, declared: dict) -> Optional[dict[str, Any]]:
    """The early-stopping state as recorded (``early_stopping.json``), else what was declared."""
    state = backlog.read_early_stopping(RunDir(run_dir).early_stopping)
    policy = (state or {}).get("policy") if isinstance((state or {}).get("policy"), dict) else {}
    policy = policy or declared
    if not policy and state is None:
        return None
    enabled = policy.get("enabled", True) is not False
    out: dict[str, Any] = {
        "enabled": enabled,
        "metric": policy.get("metric") or None,
        "direction": policy.get("direction") if enabled else None,
        "patience": policy.get("patience") if enabled else None,
        "disabled_reason": None if enabled else policy.get("reason"),
    }
    if state is None:
        out["state"] = state_word(recorded=False, stopped=False, enabled=enabled)
        return out
    stopped = bool(state.get("stopped"))
    out.update(
        state=state_word(recorded=True, stopped=stopped, enabled=enabled),  # core/stopping.py, the one rule
        reason=state.get("reason"),
        trigger_checkpoint=state.get("trigger_checkpoint"),
        trigger_step=state.get("trigger_step"),
        patience_counter=state.get("patience_counter"),
        evaluations=state.get("evaluations"),
        last_consumed=state.get("last_consumed"),
        after_stop=[dict(e) for e in state.get("after_stop") or [] if isinstance(e, dict)],
        skipped=[dict(e) for e in state.get("skipped") or [] if isinstance(e, dict)],
        missing_metric=[dict(e) for e in state.get("missing_metric") or [] if isinstance(e, dict)],
    )
    return out


# The wording of what early stopping could not use, said the same way by the summary, the
# launcher's warnings and watch's early-stopping panel (one home: here).

def missing_metric_note(metric: Optional[str], count: int, names: Any = ()) -> str:
    """``count`` completed evaluations had no finite value of the monitored ``metric`` (``names``: what they had)."""
    seen = sorted({str(n) for n in names or ()} - {str(metric)})
    have = f"; they report {', '.join(seen)}" if seen else ""
    return (f"{count} completed evaluation{'s' if count != 1 else ''} without the monitored metric "
            f"{metric!s} (not counted{have})")


def skipped_note(entries: list[dict]) -> str:
    """Blocked checkpoints early stopping skipped (recorded, never counted as non-improvement)."""
    first = entries[0] if entries else {}
    more = f" and {len(entries) - 1} more" if len(entries) > 1 else ""
    return (f"skipped blocked {first.get('checkpoint')} (update {first.get('step')}){more}: "
            f"{first.get('reason') or 'every allowed attempt failed'}")


def early_stopping_notes(early: Optional[dict[str, Any]]) -> list[str]:
    """The notes on what early stopping could not use, from the summary's ``early_stopping`` section."""
    if not early:
        return []
    notes = []
    skipped = [e for e in early.get("skipped") or [] if isinstance(e, dict)]
    if skipped:
        notes.append(skipped_note(skipped))
    missing = [e for e in early.get("missing_metric") or [] if isinstance(e, dict)]
    if missing:
        names = {n for e in missing for n in e.get("metrics") or []}
        notes.append(missing_metric_note(early.get("metric"), len(missing), names))
    return notes


def validation_report(run_dir: Path, hygiene: Optional[dict] = None) -> Optional[dict[str, Any]]:
    """The ``validation`` section of a run's summary; None for a run without validation.

    A run has validation when it declared ``hygiene.validation`` (``hygiene``:
    the normalized block from the manifest) or published a request anyway.
    """
    run_dir = Path(run_dir)
    hygiene = hygiene if isinstance(hygiene, dict) else {}
    declared = isinstance(hygiene.get("validation"), dict)
    layout = RunDir(run_dir)
    if not declared and not layout.backlog_dir("requests").is_dir():
        return None
    status = backlog.backlog_status(run_dir)
    counts = {_count_key(word): status["counts"].get(word.value, 0) for word in BACKLOG_ORDER}
    requested = len(status["requests"])
    outstanding = len(status["outstanding"])  # requests without a receipt (core/backlog.py is_outstanding)
    missing: Optional[str] = None
    if requested == 0:
        missing = "no checkpoint was published for validation"
    elif outstanding:
        left = ", ".join(f"{n} {word}" for word, n in status["counts"].items() if word != BacklogState.COMPLETED and n)
        missing = f"{outstanding} of {requested} validation requests have no receipt ({left})"
    rows = {row["checkpoint"]: row for row in status["requests"]}
    es_declared = hygiene.get("early_stopping") if isinstance(hygiene.get("early_stopping"), dict) else {}
    early = _early_stopping(run_dir, es_declared)
    best = None
    es_state = backlog.read_early_stopping(layout.early_stopping) or {}
    if isinstance(es_state.get("best_checkpoint"), str):
        ckpt = es_state["best_checkpoint"]
        best = {
            "checkpoint": ckpt,
            "step": es_state.get("best_step"),
            "metric": (early or {}).get("metric"),
            "value": es_state.get("best_metric"),
            "metrics": (rows.get(ckpt) or {}).get("metrics") or {},
            "selected_on": "eval",
            "note": SELECTION_NOTE,
        }
    curve = layout.learning_curve
    return {
        "status": MISSING if missing else COMPLETE,
        "missing": missing,
        "recipe": (hygiene.get("validation") or {}).get("recipe") if declared else None,
        "requested": requested,
        **counts,
        "newest_completed": status["newest_completed"],
        "latest_requested": status["latest_requested"],
        "best": best,
        "early_stopping": early,
        "curve": LEARNING_CURVE if curve.is_file() else None,
    }


def report_lines(section: Optional[dict[str, Any]]) -> list[str]:
    """The few lines ``final_summary.txt`` prints for a ``validation`` section (a presentation only)."""
    if not section:
        return []
    counts = ", ".join(f"{section.get(_count_key(w), 0)} {w.value}" for w in BACKLOG_ORDER
                       if section.get(_count_key(w)))
    head = f"Validation: {section.get('requested', 0)} requested" + (f" · {counts}" if counts else "")
    lines = []
    if section.get("status") == MISSING:
        lines.append(f"Validation: MISSING — {section.get('missing')}")
        lines.append("  " + head)
    else:
        lines.append(head)
    newest = section.get("newest_completed")
    if newest:
        lines.append(f"  newest completed: {newest['checkpoint']} (update {newest.get('step')}) "
                     f"{_metrics_text(newest.get('metrics'))}".rstrip())
    best = section.get("best")
    if best:
        value = best.get("value")
        shown = f"{best.get('metric')}={value:.6g}" if isinstance(value, (int, float)) else ""
        lines.append(f"  selected best: {best['checkpoint']} (update {best.get('step')}) {shown} — {SELECTION_NOTE}")
    early = section.get("early_stopping")
    if early:
        if not early.get("enabled"):
            lines.append(f"  early stopping: disabled ({early.get('disabled_reason')})")
        elif early.get("state") == "stopped":
            after = len(early.get("after_stop") or [])
            later = f"; {after} evaluation{'s' if after != 1 else ''} after the stop not counted" if after else ""
            where = (f"{early.get('trigger_checkpoint')} (update {early.get('trigger_step')})"
                     if early.get("trigger_checkpoint") else f"update {early.get('trigger_step')}")
            lines.append(f"  early stopping: stopped, {early.get('reason')} at {where}{later}")
        else:
            lines.append(f"  early stopping: {early.get('state')}, patience {early.get('patience_counter') or 0}"
                         f"/{early.get('patience')} on {early.get('metric')}")
    for note in early_stopping_notes(early):
        lines.append(f"  early stopping: {note}")
    lines.append(f"  curve: {section.get('curve') or 'not rendered'}")
    return lines


def _metrics_text(metrics: Any) -> str:
    if not isinstance(metrics, dict):
        return ""
    return ", ".join(f"{k}={v:.6g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in sorted(metrics.items()))
