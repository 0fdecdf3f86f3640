"""A braille line chart drawn by ``textual-plot``: one colour per series, ticked axes, clipping and log scale.

The widget is dumb: it gets :class:`ChartData` (series the refresh worker
built from the index, docs/watch.md "Charts") and only draws. Choosing the y
range is drawing, so it is decided here: one outlier (a 47 s stalled step among
50 ms steps) must not squash every other point into the bottom row, so the
range is cut at a robust quantile and the points above it are marked ``▲`` on
the top edge (:func:`y_range`). Zoom and pan are textual-plot's own keys and
mouse (``+``/``-``, arrows, ``r`` to reset, wheel, drag) once the chart has
focus; a zoomed chart keeps its view across data refreshes until ``r``.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Static
from textual_hires_canvas import Canvas
from textual_plot import HiResMode, NumericAxisFormatter, PlotWidget
from textual_plot.axis_formatter import AxisFormatter

from traceml_tui.tui.textplot import fmt_num

#: One colour per series (rank 0, rank 1, …): ANSI names, so 16-colour terminals tell them apart too.
#: Red is left out: it marks clipped outliers.
PALETTE = ("cyan", "yellow", "magenta", "green", "bright_blue", "bright_white", "bright_cyan", "bright_yellow")
#: The glyph and colour of a point above the clipped range.
OUTLIER_GLYPH, OUTLIER_STYLE = "▲", "bold red"
#: The range is cut at this quantile of the values shown ...
CLIP_QUANTILE = 0.95
#: ... when the largest value lies this many times further from the bottom than the quantile does.
CLIP_FACTOR = 3.0


@dataclass(frozen=True)
class Line:
    """One series: ``y[i]`` at step ``x[i]``; None is a gap. ``style`` None: the palette colour of its position."""

    name: str
    x: tuple[float, ...]
    y: tuple[Optional[float], ...]
    style: Optional[str] = None
    points: bool = False  # also mark each point (few, sparse points such as evaluations)


@dataclass(frozen=True)
class Marks:
    """Glyphs on the bottom edge at steps ``x`` (pending or failed evaluations), named in the legend."""

    x: tuple[float, ...]
    glyph: str
    label: str
    style: str = "bold"


@dataclass(frozen=True)
class ChartData:
    """What one chart shows. Immutable, so an unchanged chart compares equal and is not redrawn."""

    title: str
    lines: tuple[Line, ...] = ()
    unit: str = ""  # the y axis's unit, written above it
    hline: Optional[float] = None  # a reference level kept in range and drawn dashed (1.0 = no skill)
    hline_label: str = ""
    marks: tuple[Marks, ...] = ()
    hint: str = ""  # the keys that change this chart, shown after the legend
    empty: str = "(no data yet)"
    log_ok: bool = False  # the log-scale toggle applies (step times, loss ratios)


def y_range(values: Sequence[float], keep: Sequence[float] = (), clip: bool = True) -> tuple[float, float, Optional[float]]:
    """The y range to draw ``values`` in: ``(low, high, cut)``.

    ``cut`` is not None when the largest value lies more than :data:`CLIP_FACTOR`
    times further above the smallest than the :data:`CLIP_QUANTILE` quantile
    does: values above ``cut`` (a little above that quantile) are drawn as
    markers at ``cut``, just inside the top of the range. ``keep`` are levels
    always inside the range (a reference line). A flat series gets a small band
    around its value, never a range that makes 0.05 read as −0.45..0.55.
    ``clip=False`` (the log scale, which shows every point) never cuts.
    """
    vals = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if not len(vals):
        return 0.0, 1.0, None
    lo, hi = float(vals.min()), float(vals.max())
    cut: Optional[float] = None
    if clip and len(vals) >= 10:
        q = float(np.quantile(vals, CLIP_QUANTILE))
        if q > lo and hi - lo > CLIP_FACTOR * (q - lo):
            hi = cut = q + 0.25 * (q - lo)
    for k in keep:
        lo, hi = min(lo, k), max(hi, k)
    if cut is not None and hi > cut:  # a reference level above the cut: nothing is cut below it
        cut = None if hi >= float(vals.max()) else hi
    if hi - lo <= 0:
        pad = abs(lo) * 0.05 or 0.5
        return lo - pad, hi + pad, None
    pad = (hi - lo) * 0.06
    return lo - pad, hi + pad, cut


def thin(x: np.ndarray, y: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """At most two points per column of the plot: the lowest and the highest of each (in step order).

    Drawing cost then follows the pane, not the run's length, and no spike is lost
    (each column keeps its extremes). ``x`` is ascending; ``columns`` ≤ 0 keeps everything.
    """
    n = len(x)
    if columns <= 0 or n <= 2 * columns:
        return x, y
    edges = np.linspace(0, n, columns + 1).astype(int)
    keep: list[int] = []
    for a, b in zip(edges[:-1], edges[1:]):
        if b > a:
            seg = y[a:b]
            keep.extend(sorted({a + int(seg.argmin()), a + int(seg.argmax())}))
    idx = np.asarray(keep, dtype=int)
    return x[idx], y[idx]


class ShortNumbers(NumericAxisFormatter):
    """Ticks at 1-2-5 steps labelled short (``1.2k``, ``0.05``) so they fit the axis margin."""

    def get_labels_for_ticks(self, ticks: Sequence[float]) -> list[str]:
        labels = super().get_labels_for_ticks(ticks)
        return [lab if len(lab) <= 6 else fmt_num(t) for lab, t in zip(labels, ticks)]


class LogTicks(AxisFormatter):
    """Ticks of a log10 axis: values drawn as ``log10(y)``, labelled as ``y`` at 1-2-5 steps of each decade."""

    def get_ticks(self, min_: float, max_: float, max_ticks: int = 8) -> list[float]:
        ticks = []
        for decade in range(math.floor(min_), math.ceil(max_) + 1):
            for m in (1, 2, 5) if max_ - min_ < 2 else (1,):
                t = decade + math.log10(m)
                if min_ <= t <= max_:
                    ticks.append(t)
        return ticks or [min_, max_]

    def get_labels_for_ticks(self, ticks: Sequence[float]) -> list[str]:
        return [fmt_num(10 ** t, 2) for t in ticks]


def _legend_text(data: ChartData, clipped: int, top: Optional[float], log: bool) -> Text:
    out = Text(data.title, style="bold")
    for i, line in enumerate(data.lines):
        out.append("  ⠒⠒ ", style=line.style or PALETTE[i % len(PALETTE)])
        out.append(line.name)
    if data.hline is not None:
        out.append("  ┄ ", style="dim")
        out.append(data.hline_label or fmt_num(data.hline), style="dim")
    for m in data.marks:
        out.append(f"  {m.glyph} ", style=m.style)
        out.append(f"{m.label} ({len(m.x)})")
    if clipped:
        out.append(f"  {OUTLIER_GLYPH} ", style=OUTLIER_STYLE)
        out.append(f"{clipped} above {fmt_num(top)}")
    if log:
        out.append("  log scale", style="italic")
    if data.hint:
        out.append("  " + data.hint, style="dim")
    return out


class ChartPlot(PlotWidget):
    """textual-plot's widget; remembers whether the user zoomed or panned away from the drawn range."""

    # the unit above the y axis; step ticks and the word "step" below the x axis; short tick labels at the left
    margin_top = reactive(1)
    margin_bottom = reactive(3)
    margin_left = reactive(8)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        #: The limits this chart drew with last (x_min, x_max, y_min, y_max).
        self.drawn: Optional[tuple[float, float, float, float]] = None
        #: True once zoom or pan moved the view: data refreshes then keep it (``r`` resets).
        self.moved = False

    def render(self):
        """textual-plot's render, with each canvas refreshed once at the end rather than once per pixel set."""
        with ExitStack() as stack:
            for canvas in self.query(Canvas):
                stack.enter_context(canvas.batch_refresh())
            return super().render()

    def on_plot_widget_scale_changed(self, event: PlotWidget.ScaleChanged) -> None:
        self.moved = (event.x_min, event.x_max, event.y_min, event.y_max) != self.drawn


class LineChart(Vertical):
    """A title line with the legend, then a braille plot that grows with the pane (or a sentence when empty)."""

    DEFAULT_CSS = """
    LineChart { height: auto; }
    LineChart > .chart-title { height: auto; }
    LineChart > ChartPlot { height: 40vh; min-height: 9; }
    LineChart > .chart-empty { height: auto; color: $text-muted; }
    """

    data: reactive[Optional[ChartData]] = reactive(None)
    #: Draw the y axis on a log scale (only where ``data.log_ok``).
    log: reactive[bool] = reactive(False)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        #: How many times the plot was drawn (a refresh with unchanged data draws nothing).
        self.draws = 0
        self._title = Text("")
        self._empty = ""

    def compose(self) -> ComposeResult:
        yield Static("…", classes="chart-title")
        yield Static("", classes="chart-empty")
        yield ChartPlot()

    def on_mount(self) -> None:
        self.query_one(ChartPlot).display = False
        self.query_one(".chart-empty", Static).display = False

    def watch_data(self, old: Optional[ChartData], new: Optional[ChartData]) -> None:
        if new is not None and new != old:
            self._draw()

    def watch_log(self) -> None:
        if self.data is not None and self.data.log_ok:
            self._draw()

    def _draw(self) -> None:
        data = self.data
        if data is None or not self.is_mounted:
            return
        self.draws += 1
        log = self.log and data.log_ok
        plot = self.query_one(ChartPlot)
        empty = self.query_one(".chart-empty", Static)

        def ys(line: Line) -> tuple[np.ndarray, np.ndarray]:
            x = np.asarray(line.x, dtype=float)
            y = np.asarray([np.nan if v is None else v for v in line.y], dtype=float)
            if log:
                with np.errstate(divide="ignore", invalid="ignore"):
                    y = np.where(y > 0, np.log10(y), np.nan)
            ok = np.isfinite(y) & np.isfinite(x)
            return x[ok], y[ok]

        shown = [(line, *ys(line)) for line in data.lines]
        values = np.concatenate([y for _, _, y in shown]) if shown else np.empty(0)
        mark_x = [x for m in data.marks for x in m.x]
        if not len(values) and not mark_x:
            self._title, self._empty = _legend_text(data, 0, None, log), data.empty
            self.query_one(".chart-title", Static).update(self._title)
            empty.update(data.empty)
            empty.display, plot.display = True, False
            return
        keep = () if data.hline is None or (log and data.hline <= 0) else (
            (math.log10(data.hline),) if log else (data.hline,))
        lo, hi, cut = y_range(values.tolist(), keep, clip=not log)
        top = hi if cut is None else cut
        xs = np.concatenate([x for _, x, _ in shown] + [np.asarray(mark_x, dtype=float)])
        x_lo, x_hi = float(xs.min()), float(xs.max())
        if x_hi <= x_lo:
            x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
        elif data.marks or any(line.points for line in data.lines):
            # glyphs on the first or last step would sit under the frame, which is drawn over the data
            pad = (x_hi - x_lo) * 0.03
            x_lo, x_hi = x_lo - pad, x_hi + pad
        above = int((values > top).sum())
        self._title, self._empty = _legend_text(data, above, (10 ** top) if log else top, log), ""
        self.query_one(".chart-title", Static).update(self._title)
        empty.display, plot.display = False, True

        plot.clear()
        plot.set_y_formatter(LogTicks() if log else ShortNumbers())
        plot.set_x_formatter(ShortNumbers())
        plot.set_ylabel(data.unit)
        plot.set_xlabel("step")
        if data.hline is not None and keep:
            plot.plot([x_lo, x_hi], [keep[0], keep[0]], line_style="dim white", hires_mode=HiResMode.BRAILLE)
        cells = max(0, self.size.width - 10)  # the plot's columns (less the margins): a low and a high point each
        for i, (line, x, y) in enumerate(shown):
            style = line.style or PALETTE[i % len(PALETTE)]
            x, y = thin(x, y, cells)
            if len(x) >= 2:
                plot.plot(x, np.minimum(y, top), line_style=style, hires_mode=HiResMode.BRAILLE)
            if line.points or len(x) < 2:
                plot.scatter(x, np.minimum(y, top), marker="●", marker_style=style)
            if (y > top).any():
                plot.scatter(x[y > top], np.full(int((y > top).sum()), top), marker=OUTLIER_GLYPH,
                             marker_style=OUTLIER_STYLE)
        for m in data.marks:
            if m.x:
                plot.scatter(list(m.x), [lo] * len(m.x), marker=m.glyph, marker_style=m.style)
        if not plot.moved:
            plot.drawn = (x_lo, x_hi, lo, hi)
            plot.set_xlimits(x_lo, x_hi)
            plot.set_ylimits(lo, hi)

    def plain(self) -> str:
        """What the chart shows as plain text: the title line, then the plot's rows (tests and tools)."""
        lines = [self._title.plain]
        if self._empty:
            return "\n".join(lines + [self._empty])
        plot = self.query_one(ChartPlot)
        canvases = {c.id: c for c in plot.query("Canvas")}
        top, left, body, bottom = (canvases.get(k) for k in ("margin-top", "margin-left", "plot", "margin-bottom"))

        def row(canvas, y: int) -> str:
            chars = []
            for x in range(canvas.size.width if canvas is not None else 0):
                try:
                    chars.append(canvas.get_pixel(x, y)[0])
                except IndexError:  # not drawn at this size yet (scrolled out of view)
                    break
            return "".join(chars)

        if top is not None:
            lines += [row(top, y) for y in range(top.size.height)]
        if body is not None:
            lines += [row(left, y) + row(body, y) for y in range(body.size.height)]
        if bottom is not None:
            lines += [row(bottom, y) for y in range(bottom.size.height)]
        return "\n".join(lines)
