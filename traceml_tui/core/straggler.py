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
index each rank's median over its rolling window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

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
