"""The Run screen's verdict line: the final summary's ``Verdict:`` and ``Next:`` in one line, near the top.

The words are the summary's own (its step-time diagnosis, read through the
index by the reader: ``daemon/views.py`` ``Diagnosis``); nothing is decided
here. A live run has no summary yet: the line says the verdict comes when the
run ends. An ended run without a summary shows no line.
"""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from daemon.views import Diagnosis

#: Verdict styles by the issue's severity (the summary's ``warn`` / ``info``).
SEVERITY_STYLE = {"warn": "bold yellow", "info": "bold cyan"}

#: What a live run's line says before its summary exists.
PENDING = "Verdict: when the run ends (its final summary diagnoses the step time)"


def verdict_text(verdict: Optional[Diagnosis], live: bool) -> Optional[Text]:
    """``Verdict: STRAGGLER — Rank 1 is 18% slower than the median rank. Next: …``; None: no line."""
    if verdict is None:
        return Text(PENDING, style="dim") if live else None
    v = verdict.verdict
    out = Text("Verdict: ", style="bold")
    out.append(v.status, style=SEVERITY_STYLE.get(v.severity or "", "bold"))
    out.append(f" — {v.summary}")
    if v.action:
        out.append(" Next: ", style="bold")
        out.append(v.action)
    return out


class VerdictLine(Widget):
    """``data`` = (the run's :class:`Diagnosis` or None, whether the run is live); one line, cut with ``…`` (the
    diagnosis panel below holds every word)."""

    DEFAULT_CSS = "VerdictLine { height: 1; display: none; }"

    data: reactive[Optional[tuple[Optional[Diagnosis], bool]]] = reactive(None)

    def watch_data(self, data: Optional[tuple[Optional[Diagnosis], bool]]) -> None:
        self.display = data is not None and verdict_text(*data) is not None

    def render(self) -> Text:
        text = verdict_text(*self.data) if self.data is not None else None
        if text is None:
            return Text()
        text.truncate(max(1, self.size.width), overflow="ellipsis")
        return text
