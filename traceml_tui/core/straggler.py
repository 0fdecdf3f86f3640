"""The straggler rule: one rank's step time against the median rank's, decided once for every surface.

Textual-, torch- and SQLite-free. The final summary's ``STRAGGLER`` diagnosis
(``traceml_tui/summary/build.py``), the index's straggler score and each
rank's Δ (``daemon/reader.py``: ``traceml status``, the Prometheus metrics and
``traceml watch``) all take the same three steps over one step-time statistic
per rank (docs/contracts.md, "One set of figures"):

* the *median rank* is the lower median of the ranks ordered by (value, rank):
  with two ranks it is the faster one, so a two-rank run's straggler is measured
  against its healthy peer, not against the mean of the two;
* the *slowest rank* is the last of that order;
* its skew is ``slowest / median − 1`` (a percentage), and the run has a
  straggler when the slowest rank is not the median rank and the skew is at
  least :data:`STRAGGLER_SKEW_PCT`.

Which statistic is fed in is the caller's (a place shows one statistic and
names it): the summary feeds each rank's mean over the analysis window, the
index each rank's median over its rolling window while a run is live (or has
no current summary). Once a run's final summary is current, the index shows the
summary's statistic: both call :func:`rows_spread` on the same per-rank rows
(``final_summary.json`` ``step_time.groups.rows``, read back by
:func:`summary_window`), so an ended run shows one number everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from traceml_tui.core.jsonsafe import finite_number

#: Skew (%) from which the slowest rank is a straggler (the summary's ``STRAGGLER`` issue).
STRAGGLER_SKEW_PCT = 10.0


@dataclass(frozen=True)
class Spread:
    """Where the median rank and the slowest rank of one statistic stand.

    ``median_key`` / ``worst_key`` are the ranks (as the caller keys them);
    ``median`` / ``worst`` their values.
    """

    median_key: Any
    median: float
    worst_key: Any
    worst: float
    ranks: int = 1

    @property
    def skew_pct(self) -> Optional[float]:
        """How much slower the slowest rank is than the median rank (%); None with one rank or no median."""
        if self.worst_key == self.median_key or not self.median or self.median <= 0:
            return None
        return (self.worst - self.median) / self.median * 100.0

    @property
    def score(self) -> Optional[float]:
        """The slowest rank's value over the median rank's (1.0 = even; ``1 + skew_pct / 100``)."""
        return self.worst / self.median if self.median and self.median > 0 else None

    @property
    def straggler(self) -> bool:
        """Whether the slowest rank is a straggler (skew ≥ :data:`STRAGGLER_SKEW_PCT`)."""
        skew = self.skew_pct
        return skew is not None and skew >= STRAGGLER_SKEW_PCT

    def delta_pct(self, value: Optional[float]) -> Optional[float]:
        """A rank's value against the median rank's (%); the slowest rank's is :attr:`skew_pct`."""
        if value is None or not self.median or self.median <= 0:
            return None
        return (value / self.median - 1.0) * 100.0


def spread(values: Iterable[tuple[Any, Optional[float]]]) -> Optional[Spread]:
    """The spread of ``(rank, value)`` pairs (ranks without a value left out); None when none has one."""
    ordered = sorted((v, k) for k, v in values if v is not None)
    if not ordered:
        return None
    mid_value, mid_key = ordered[(len(ordered) - 1) // 2]
    top_value, top_key = ordered[-1]
    return Spread(median_key=mid_key, median=mid_value, worst_key=top_key, worst=top_value, ranks=len(ordered))


#: The per-rank metric of the summary's step-time rows the straggler rule reads (the published name).
SUMMARY_METRIC = "step_time_ms"


def row_value(row: Any, metric: str = SUMMARY_METRIC) -> Optional[float]:
    """One summary row's ``metrics[metric]`` as a finite float (None: absent, not a number, or not finite)."""
    metrics = row.get("metrics") if isinstance(row, Mapping) else None
    value = metrics.get(metric) if isinstance(metrics, Mapping) else None
    return finite_number(value)


def rows_spread(rows: Mapping[str, Any], metric: str = SUMMARY_METRIC) -> Optional[Spread]:
    """The spread of a summary's per-rank rows (``{"1": {"metrics": {metric: value, …}}, …}``), keyed as they are.

    The one function behind the summary's median and worst rank of every metric and its ``STRAGGLER`` verdict
    (``summary/build.py``), and behind an ended run's figures in the index (``daemon/read_runs.py``), which
    calls it on the rows it reads back from the same summary.
    """
    return spread((key, row_value(row, metric)) for key, row in rows.items())


@dataclass(frozen=True)
class SummaryWindow:
    """A final summary's step-time rows and the window they were averaged over, as read back from its JSON.

    ``rows`` are ``step_time.groups.rows`` keyed by global rank (the summary's string keys); ``start_step`` /
    ``end_step`` the analysis window's steps; ``clock`` its ``diagnosis_clock``.
    """

    rows: Mapping[str, Any]
    start_step: Optional[int] = None
    end_step: Optional[int] = None
    clock: Optional[str] = None

    def value(self, rank: int, metric: str = SUMMARY_METRIC) -> Optional[float]:
        """The rank's ``metric`` over the window (None: the rank has no row, or no such figure)."""
        return row_value(self.rows.get(str(rank)), metric)

    def spread(self, metric: str = SUMMARY_METRIC) -> Optional[Spread]:
        """:func:`rows_spread` of these rows."""
        return rows_spread(self.rows, metric)


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rank_key(key: Any) -> bool:
    """A global rank as the summary keys it: ``"0"``, ``"12"`` (ASCII digits, no sign, no leading zero; at most 9
    digits, so that a hostile key is never a huge number to convert)."""
    return isinstance(key, str) and 0 < len(key) <= 9 and key.isascii() and key.isdigit() and key == str(int(key))


def summary_window(step_time: Any) -> Optional[SummaryWindow]:
    """The ``step_time`` section of a final summary (ours or traceml-ai's) as a :class:`SummaryWindow`.

    Untrusted input: anything that is not the published layout gives None, never an error. Only rows keyed by
    a global rank (``"0"``, ``"1"`` …) whose ``step_time_ms`` is a finite number are kept; None when none is.
    """
    if not isinstance(step_time, Mapping):
        return None
    groups = step_time.get("groups")
    rows = groups.get("rows") if isinstance(groups, Mapping) else None
    if not isinstance(rows, Mapping):
        return None
    kept = {key: row for key, row in rows.items()
            if _rank_key(key) and row_value(row) is not None}
    if not kept:
        return None
    glob = step_time.get("global")
    window = glob.get("window") if isinstance(glob, Mapping) else None
    window = window if isinstance(window, Mapping) else {}
    clock = window.get("diagnosis_clock")
    return SummaryWindow(rows=kept, start_step=_int(window.get("start_step")), end_step=_int(window.get("end_step")),
                         clock=clock if isinstance(clock, str) else None)
