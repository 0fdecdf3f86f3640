"""Rank × step heatmap: darker = slower than the median rank over the same stretch of steps.

The refresh worker hands over the matrix (rows = ranks, columns = step buckets
from the first to the last step, value = the rank's step time ÷ the median
rank's); this widget only draws it. The buckets are stretched over the whole
width, so the first bucket sits under the first step label and the last bucket
under the last one (docs/watch.md "Straggler heatmap").
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

#: Shades from "about as fast as the median rank" to "1.5× slower or worse", with the ratio each starts at.
SHADES = ((1.5, "█"), (1.35, "▓"), (1.2, "▒"), (1.1, "░"))
#: The scale, said under the title.
SCALE = "step time ÷ the median rank's:  ░ ≥1.1×  ▒ ≥1.2×  ▓ ≥1.35×  █ ≥1.5×  · no steps"
#: What a run with one rank shows instead of an empty box.
ONE_RANK = "One rank: nothing to compare it with (the heatmap shows ranks slower than the others)."


def shade(value: Optional[float]) -> str:
    """The glyph of one cell (:data:`SCALE`): blank below 1.1× the median rank's time, a full block at 1.5×."""
    if value is None or not math.isfinite(value):
        return "·"
    return next((glyph for start, glyph in SHADES if value >= start), " ")


def stretch(row: Sequence[Optional[float]], width: int) -> list[Optional[float]]:
    """``row``'s buckets spread over ``width`` columns: column c shows bucket ``c * len(row) // width``
    (wider than the buckets: each repeats; narrower: columns skip buckets, the last column is the last bucket)."""
    n = len(row)
    if n == 0 or width <= 0:
        return []
    if width >= n:
        return [row[c * n // width] for c in range(width)]
    return [row[min(n - 1, round(c * (n - 1) / max(1, width - 1)))] for c in range(width)]


def step_axis(lo: int, hi: int, width: int) -> str:
    """``step LO`` under the first column and ``step HI`` ending under the last one (middle step if it fits)."""
    left, right = f"step {lo}", f"step {hi}"
    if width < len(left) + len(right) + 1:
        return right.rjust(width)
    line = [" "] * width
    line[:len(left)] = left
    line[width - len(right):] = right
    mid_step = (lo + hi) // 2
    mid = str(mid_step)
    at = width // 2 - len(mid) // 2
    if hi - lo >= 4 and at > len(left) + 1 and at + len(mid) < width - len(right) - 1:
        line[at:at + len(mid)] = mid
    return "".join(line)


class Heatmap(Widget):
    """``data`` = (rank labels, matrix rows, (first step, last step))."""

    DEFAULT_CSS = "Heatmap { height: auto; }"

    data: reactive[Optional[tuple]] = reactive(None, layout=True)

    def render(self) -> Text:
        out = Text("Straggler heatmap", style="bold")
        out.append("  rank × step", style="dim")
        out.append("\n")
        labels, matrix, steps = self.data or ((), (), (0, 0))
        if len(labels) == 1:
            out.append(ONE_RANK, style="dim")
            return out
        if not matrix or not any(matrix):
            out.append("(no step times yet)", style="dim")
            return out
        out.append(SCALE, style="dim")
        out.append("\n")
        label_w = max(len(s) for s in labels)
        width = max(10, (self.size.width or 80) - label_w - 2)
        for label, row in zip(labels, matrix):
            out.append(f"{label:>{label_w}} │", style="dim")
            out.append("".join(shade(v) for v in stretch(row, width)), style="red")
            out.append("\n")
        lo, hi = steps
        out.append(" " * (label_w + 2) + step_axis(lo, hi, width), style="dim")
        return out
