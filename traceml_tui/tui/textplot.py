"""Numbers as short text: sparklines for table cells, compact numbers, times and durations.

Pure functions over numbers returning strings, testable without a UI. Missing
values (``None``) leave gaps rather than being drawn as zero. Line charts are
drawn by a plotting library (widgets/line_chart.py), the straggler heatmap by
widgets/heatmap.py.
"""

from __future__ import annotations

import math
import time
from typing import Optional, Sequence

from traceml_tui.core.state import compact_age

SPARK = "▁▂▃▄▅▆▇█"


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


def clock_time(ts: Optional[float]) -> str:
    """A unix time as ``2026-11-30 13:35:43 UTC`` (UTC: the same on every machine); None → '–'."""
    if ts is None or not math.isfinite(ts):
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def duration(seconds: Optional[float]) -> str:
    """Compact age: 42s, 3m, 2h, 5d; None → '–'."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    return compact_age(seconds)  # one rule for every age the watch and the marks print
