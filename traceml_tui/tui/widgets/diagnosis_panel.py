"""The Run screen's diagnosis panel: every step-time issue of the final summary, with what to do next.

The summary's own words (``step_time.issues``, the verdict first), read
through the index by the reader (``daemon/views.py`` ``Diagnosis``). Takes no
space without a summary.
"""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from daemon.views import Diagnosis
from traceml_tui.tui.widgets.verdict_line import SEVERITY_STYLE

TITLE = "Diagnosis (final summary, step time)"


def diagnosis_text(diagnosis: Diagnosis) -> Text:
    """The title, then each issue: its word and sentence, and ``Next:`` on the line below."""
    out = Text(TITLE, style="bold")
    for issue in diagnosis.issues:
        out.append("\n")
        out.append(issue.status, style=SEVERITY_STYLE.get(issue.severity or "", "bold"))
        out.append(f"  {issue.summary}")
        if issue.action:
            out.append("\n  Next: ", style="bold")
            out.append(issue.action)
    return out


class DiagnosisPanel(Widget):
    """``data`` = the run's :class:`Diagnosis`, or None (then the panel takes no space)."""

    DEFAULT_CSS = "DiagnosisPanel { height: auto; display: none; margin-bottom: 1; }"

    data: reactive[Optional[Diagnosis]] = reactive(None, layout=True)

    def watch_data(self, diagnosis: Optional[Diagnosis]) -> None:
        self.display = diagnosis is not None

    def render(self) -> Text:
        return diagnosis_text(self.data) if self.data is not None else Text()
