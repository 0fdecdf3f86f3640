"""Rank × step heatmap: darker = slower than the median rank at that point of training."""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from traceml_tui.tui import textplot


class Heatmap(Widget):
    """``data`` = (rank labels, matrix rows, (first step, last step))."""

    DEFAULT_CSS = "Heatmap { height: auto; }"

    data: reactive[Optional[tuple]] = reactive(None, layout=True)

    def render(self) -> Text:
        out = Text("Straggler heatmap", style="bold")
        out.append("  rank × step, ░▒▓█ = 1.1–1.5× the median rank", style="dim")
        out.append("\n")
        if not self.data or not self.data[1]:
            out.append("(no step times yet)", style="dim")
            return out
        labels, matrix, (lo, hi) = self.data
        label_w = max(len(s) for s in labels)
        width = max(10, (self.size.width or 80) - label_w - 3)
        for label, line in zip(labels, textplot.heatmap_rows(matrix, width)):
            out.append(f"{label:>{label_w}} │", style="dim")
            out.append(line, style="red")
            out.append("\n")
        out.append(" " * (label_w + 2) + f"step {lo}" + " " * max(1, width - len(str(lo)) - len(str(hi)) - 10)
                   + f"step {hi}", style="dim")
        return out
