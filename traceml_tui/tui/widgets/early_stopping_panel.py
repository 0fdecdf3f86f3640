"""The Run screen's early-stopping panel: metric, best checkpoint, patience used and left, stop reason."""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from traceml_tui.tui import textplot
from traceml_tui.tui.snapshots import EarlyStoppingInfo

#: The early-stopping rule's stop reasons (traceml_tui/hygiene/early_stopping.py) in words.
REASON_TEXT = {"patience_exhausted": "patience exhausted", "max_budget": "update budget reached"}


def early_stopping_lines(info: EarlyStoppingInfo) -> list:
    """The panel's lines (a str or a (str, style) pair each); pure, so the words are testable."""
    if not info.enabled:
        return [("disabled" + (f" — {info.reason}" if info.reason else ""), "dim")]
    arrow = {"min": "↓ lower is better", "max": "↑ higher is better"}.get(info.direction or "", "")
    head = f"metric {info.metric or '?'}" + (f" ({arrow})" if arrow else "")
    if info.patience is not None:
        if info.patience_used is not None:
            left = max(0, info.patience - info.patience_used)
            head += f" · patience {info.patience_used}/{info.patience} used, {left} left"
        else:
            head += f" · patience {info.patience}"
    if info.min_delta:
        head += f" · min Δ {textplot.fmt_num(info.min_delta, 4)}"
    if info.warmup:
        head += f" · warm-up {info.warmup} updates"
    lines: list = [head]
    label = "best"
    if info.best_checkpoint is not None:
        lines.append(f"{label}: {info.best_checkpoint} (step {'–' if info.best_step is None else info.best_step})"
                     f" {info.metric}={textplot.fmt_num(info.best_value, 4)}")
    else:
        lines.append((f"{label}: none yet ({info.receipts} completed evaluation{'s' if info.receipts != 1 else ''})",
                      "dim"))
    if info.state == "stopped":
        where = f" at {info.trigger_checkpoint}" if info.trigger_checkpoint else ""
        if info.trigger_step is not None:
            # a budget stop has no trigger checkpoint: its update is the trigger
            where += f" (step {info.trigger_step})" if info.trigger_checkpoint else f" at step {info.trigger_step}"
        lines.append((f"stopped: {REASON_TEXT.get(info.reason or '', info.reason or 'no reason recorded')}{where}",
                      "bold yellow"))
        if info.after_stop_steps:
            lines.append((_after_stop_text(info.after_stop_steps), "dim"))
    elif info.source in ("summary", "policy"):
        evals = f" after {info.evaluations} evaluation{'s' if info.evaluations != 1 else ''}" \
            if info.evaluations is not None else ""
        lines.append(f"not stopped{evals}" if info.state != "not-recorded" else ("no state recorded", "dim"))
    else:
        lines.append(("nothing consumed yet: no state recorded by the policy", "dim"))
    lines.extend((note, "yellow") for note in info.notes)
    return lines


def _after_stop_text(steps: tuple) -> str:
    """Checkpoints consumed after the stop: the decision above is final, they were recorded, not counted."""
    n = len(steps)
    known = [s for s in steps if s is not None]
    where = ""
    if known:
        where = f" (step {known[0]})" if len(known) == 1 else f" (steps {min(known)}–{max(known)})"
    return f"after the stop: {n} evaluation{'s' if n != 1 else ''}{where} recorded, not counted"


class EarlyStoppingPanel(Widget):
    """``data`` = the run's :class:`EarlyStoppingInfo`, or None (then the panel takes no space)."""

    DEFAULT_CSS = "EarlyStoppingPanel { height: auto; display: none; }"

    data: reactive[Optional[EarlyStoppingInfo]] = reactive(None, layout=True)

    def watch_data(self, info: Optional[EarlyStoppingInfo]) -> None:
        self.display = info is not None

    def render(self) -> Text:
        info = self.data
        if info is None:
            return Text()
        out = Text("Early stopping", style="bold")
        for line in early_stopping_lines(info):
            out.append("\n  ")
            if isinstance(line, tuple):
                out.append(line[0], style=line[1])
            else:
                out.append(line)
        return out
