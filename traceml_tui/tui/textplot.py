"""Charts drawn with text characters: sparklines, line charts and heatmaps.

Pure functions over numbers returning strings (or lists of lines), so they
work over SSH in any terminal, need no images, and are testable without a
UI. Missing values (``None``) leave gaps rather than being drawn as zero.
"""

from __future__ import annotations

import math
import time
from typing import Optional, Sequence

SPARK = "▁▂▃▄▅▆▇█"
SHADES = " ░▒▓█"
#: Glyphs for series in a line chart, in order (rank 0, rank 1, …).
GLYPHS = "●○◆◇■□▲△xo+*"


def _finite(values: Sequence[Optional[float]]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def resample(values: Sequence[Optional[float]], width: int) -> list[Optional[float]]:
    """Average ``values`` into ``width`` columns (fewer values than columns are kept as they are)."""
    n = len(values)
    if n <= width or width <= 0:
        return list(values)
    out: list[Optional[float]] = []
    for i in range(width):
        chunk = _finite(values[i * n // width:(i + 1) * n // width])
        out.append(sum(chunk) / len(chunk) if chunk else None)
    return out


def sparkline(values: Sequence[Optional[float]], width: int = 12) -> str:
    """A one-line sparkline of the last values, scaled between their min and max."""
    cols = resample(values, width)
    nums = _finite(cols)
    if not nums:
        return ""
    lo, hi = min(nums), max(nums)
    span = hi - lo
    chars = []
    for v in cols:
        if v is None or not math.isfinite(v):
            chars.append(" ")
        elif span <= 0:
            chars.append(SPARK[0])
        else:
            chars.append(SPARK[min(len(SPARK) - 1, int((v - lo) / span * (len(SPARK) - 1) + 0.5))])
    return "".join(chars)


def smooth(values: Sequence[Optional[float]], alpha: float = 0.2) -> list[Optional[float]]:
    """Exponential moving average (gaps are carried over, not averaged in)."""
    out: list[Optional[float]] = []
    acc: Optional[float] = None
    for v in values:
        if v is not None and math.isfinite(v):
            acc = v if acc is None else alpha * v + (1 - alpha) * acc
        out.append(acc)
    return out


def fmt_num(value: Optional[float], digits: int = 3) -> str:
    """Short human number: 1234 → 1.23k, 0.01234 → 0.0123; None → '–'."""
    if value is None or not math.isfinite(value):
        return "–"
    a = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= limit:
            return f"{value / limit:.{digits}g}{suffix}"
    return f"{value:.{digits}g}"


def line_chart(
    series: Sequence[tuple[str, Sequence[float], Sequence[Optional[float]]]],
    width: int = 60,
    height: int = 8,
    *,
    hline: Optional[float] = None,
    marks: Sequence[tuple[float, str]] = (),
    x_range: Optional[tuple[float, float]] = None,
) -> list[str]:
    """Plot ``(label, xs, ys)`` series on a character grid; returns lines (with a y-axis and x labels).

    ``hline`` draws a horizontal reference line (e.g. 1.0 = no skill);
    ``marks`` places a glyph on the bottom axis at an x (e.g. pending evals).
    """
    width = max(10, width)
    height = max(3, height)
    ys_all = _finite([y for _, _, ys in series for y in ys])
    if hline is not None:
        ys_all.append(hline)
    xs_all = [x for _, xs, _ in series for x in xs] + [m[0] for m in marks]
    if not ys_all or not xs_all:
        return ["(no data yet)"]
    y_lo, y_hi = min(ys_all), max(ys_all)
    if y_hi - y_lo <= 0:
        y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
    x_lo, x_hi = x_range if x_range else (min(xs_all), max(xs_all))
    if x_hi - x_lo <= 0:
        x_hi = x_lo + 1
    label_w = max(len(fmt_num(y_hi)), len(fmt_num(y_lo)))
    plot_w = width - label_w - 2
    grid = [[" "] * plot_w for _ in range(height)]

    def col(x: float) -> int:
        return min(plot_w - 1, max(0, int(round((x - x_lo) / (x_hi - x_lo) * (plot_w - 1)))))

    def row(y: float) -> int:
        return min(height - 1, max(0, int(round((y_hi - y) / (y_hi - y_lo) * (height - 1)))))

    if hline is not None:
        r = row(hline)
        for c in range(plot_w):
            grid[r][c] = "┄"
    for i, (_, xs, ys) in enumerate(series):
        glyph = GLYPHS[i % len(GLYPHS)]
        for x, y in zip(xs, ys):
            if y is not None and math.isfinite(y):
                grid[row(y)][col(x)] = glyph
    lines = []
    for r in range(height):
        if r == 0:
            label = fmt_num(y_hi)
        elif r == height - 1:
            label = fmt_num(y_lo)
        elif hline is not None and r == row(hline):
            label = fmt_num(hline)
        else:
            label = ""
        lines.append(f"{label:>{label_w}} │" + "".join(grid[r]))
    axis = ["─"] * plot_w
    for x, glyph in marks:
        axis[col(x)] = glyph
    lines.append(" " * label_w + " └" + "".join(axis))
    left, right = f"{int(x_lo)}", f"{int(x_hi)}"
    lines.append(" " * (label_w + 2) + left + " " * max(1, plot_w - len(left) - len(right)) + right)
    return lines


def heatmap_rows(matrix: Sequence[Sequence[Optional[float]]], width: int = 60) -> list[str]:
    """Shade each cell by how much slower it is than typical (value = time / median of ranks).

    1.0 or faster is blank; ≥ 1.5× is a full block. A rank that is slow again
    and again shows as a dark row.
    """
    lines = []
    for values in matrix:
        cells = resample(list(values), width)
        chars = []
        for v in cells:
            if v is None or not math.isfinite(v):
                chars.append("·")
                continue
            level = (v - 1.0) / 0.5  # 0 at typical speed, 1 at 1.5× slower
            chars.append(SHADES[min(len(SHADES) - 1, max(0, int(level * (len(SHADES) - 1) + 0.5)))])
        lines.append("".join(chars))
    return lines


def clock_time(ts: Optional[float]) -> str:
    """A unix time as ``2026-11-30 13:35:43 UTC`` (UTC: the same on every machine); None → '–'."""
    if ts is None or not math.isfinite(ts):
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def duration(seconds: Optional[float]) -> str:
    """Compact age: 42s, 3m, 2h, 5d; None → '–'."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.0f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"
