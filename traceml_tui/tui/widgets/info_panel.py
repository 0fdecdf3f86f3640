"""A titled block of text lines (node metrics, guard outcomes, ingest errors, verdicts)."""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget


class InfoPanel(Widget):
    """``data`` = (title, lines); a line is a str or a (str, style) pair."""

    DEFAULT_CSS = "InfoPanel { height: auto; }"

    data: reactive[Optional[tuple]] = reactive(None, layout=True)

    def render(self) -> Text:
        if self.data is None:
            return Text("…", style="dim")
        title, lines = self.data
        out = Text(title, style="bold") if title else Text()
        for line in lines:
            if title or out.plain:
                out.append("\n")
            if isinstance(line, tuple):
                out.append(line[0], style=line[1])
            else:
                out.append(line)
        return out
