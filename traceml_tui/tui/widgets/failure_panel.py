"""The failure panel at the top of the Run screen: who failed first, where, and why."""

from __future__ import annotations

import dataclasses
from typing import Optional

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from traceml_tui.core import forensics
from traceml_tui.core.state import RunStatus
from traceml_tui.tui.glyphs import run_label
from traceml_tui.tui.snapshots import FailureInfo


def failure_text(info: FailureInfo) -> Text:
    """The panel's text: the core's lines for the section (the same as the summary card's), styled."""
    first, *rest = forensics.section_lines(dataclasses.asdict(info))
    out = Text(run_label(RunStatus.FAILED, "Failure") + ": ", style="bold red")
    out.append(first, style="bold")
    for line in rest:
        out.append("\n  ")
        style = "red" if info.exception and line.endswith(info.exception) else ""
        out.append(line, style=style)
    return out


class FailurePanel(Widget):
    """``data`` = the run's :class:`FailureInfo`, or None (then the panel takes no space)."""

    DEFAULT_CSS = "FailurePanel { height: auto; display: none; }"  # look: styles/watch.tcss

    data: reactive[Optional[FailureInfo]] = reactive(None, layout=True)

    def watch_data(self, info: Optional[FailureInfo]) -> None:
        self.display = info is not None

    def render(self) -> Text:
        return failure_text(self.data) if self.data is not None else Text()
