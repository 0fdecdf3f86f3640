"""A line chart drawn in text, sized to the widget."""

from __future__ import annotations

from typing import Optional, Sequence

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from traceml_tui.tui import textplot


class ChartData:
    """What one chart shows: series, an optional reference line and axis marks (immutable by convention)."""

    __slots__ = ("title", "series", "hline", "marks", "legend", "empty")

    def __init__(self, title: str, series: Sequence[tuple[str, Sequence[float], Sequence[Optional[float]]]] = (),
                 *, hline: Optional[float] = None, marks: Sequence[tuple[float, str]] = (), legend: str = "",
                 empty: str = "(no data yet)") -> None:
        self.title = title
        self.series = tuple(series)
        self.hline = hline
        self.marks = tuple(marks)
        self.legend = legend
        self.empty = empty


class TextChart(Widget):
    """Renders :class:`ChartData` with :func:`textplot.line_chart` at the widget's width."""

    DEFAULT_CSS = "TextChart { height: auto; }"

    data: reactive[Optional[ChartData]] = reactive(None, layout=True)

    def __init__(self, chart_height: int = 6, **kwargs) -> None:
        super().__init__(**kwargs)
        self.chart_height = chart_height

    def render(self) -> Text:
        data = self.data
        if data is None:
            return Text("…", style="dim")
        out = Text(data.title, style="bold")
        if data.legend:
            out.append("  " + data.legend, style="dim")
        out.append("\n")
        if not any(len(xs) for _, xs, _ in data.series):
            out.append(data.empty, style="dim")
            return out
        width = max(20, (self.size.width or 80) - 1)
        lines = textplot.line_chart(data.series, width=width, height=self.chart_height, hline=data.hline,
                                    marks=data.marks)
        out.append("\n".join(lines))
        return out
