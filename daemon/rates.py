"""The rate rule: steps/s and examples/s over the last seconds of records, decided once for every surface.

Pure (no SQL, no clock of its own). The ingester applies :func:`window_rate`
to each rank's rolling window on every write (``rank_live.steps_per_s`` /
``examples_per_s``, :mod:`daemon.live`); the reader applies :func:`rank_rates` and :func:`run_rates`
at read time, so that ``traceml status`` (table, ``--json``), the metrics and
``traceml watch`` (Runs, Run, ETA) show one figure (docs/contracts.md, "One set
of figures"):

* a rank's rate is the steps (examples) it completed over the last
  :data:`RATE_WINDOW_S` seconds of its records — the records whose ``ts`` lies
  within that long of its newest one, and at least its two newest — over the
  time they span. Seconds, not a count of steps: a 47 s stall leaves the
  window once :data:`RATE_WINDOW_S` seconds of records came after it, so the
  rate is back to the run's pace a few seconds after it resumes, whatever the
  pace;
* while a rank that has not ended is silent past its grace, its rate falls:
  the same steps over the window stretched by the silence past the grace, so a
  paused rank shows a falling rate, not its old pace. The grace is the core's
  one silence threshold, :func:`traceml_tui.core.state.quiet_limit_s` (the
  longer of 5 s and 3 of its own median step intervals: the silence after which
  every surface greys a running rank as quiet), so a rank's rate starts to fall
  when it is greyed; the silence is measured on the ingester's clock
  (``last_seen``), so that a slow ingester does not look like a pause;
* once the core calls such a rank stopped (stalled, waiting or lost: docs/contracts.md "stall limit"), its
  rates are 0 — the pace of a run that does not move, and a figure that no longer changes with the clock;
* a run's steps/s is its slowest rank's rate (synchronous data parallelism
  runs at it), its examples/s the sum over its ranks.
"""

from __future__ import annotations

import bisect
import math
from operator import itemgetter
from typing import Iterable, NamedTuple, Optional, Sequence

from traceml_tui.core.state import QUIET_FLOOR_S, QUIET_INTERVALS, RankState, quiet_limit_s

#: Seconds of a rank's newest records its rate is measured over.
RATE_WINDOW_S = 5.0

#: A rank's newest steps (``daemon.live.WINDOW``, 64) span less than :data:`RATE_WINDOW_S` once it steps faster
#: than 64 per window (12.8 steps/s): its older records within those seconds are kept thinned, as *marks* — the
#: first record of each ``MARK_S`` of record time (``floor(ts / MARK_S)``: the same marks whichever record a
#: daemon started from). The rate then starts at the oldest mark within the window's seconds: at most
#: ``MARK_S`` (1.6 % of the window) later than the oldest record there.
MARK_S = RATE_WINDOW_S / 64
_MARK_TS = itemgetter(0)

#: The rule in words (`traceml status --json` ``figures.rate_rule`` and the Help screen of `traceml watch`).
RATE_RULE = (f"steps completed over each rank's last {RATE_WINDOW_S:g} s of records; the run's is its slowest "
             f"rank's; a rank silent for over {QUIET_FLOOR_S:g} s and {QUIET_INTERVALS:g} of its step intervals "
             "(when it is greyed as silent) falls, and is 0 once it is stalled")


def grace_s(interval_s: Optional[float], steps_per_s: float) -> float:
    """Silence after which a rank's rate falls: the core's quiet threshold (core.state.quiet_limit_s) for its own
    median step interval (``interval_s``; the interval its rate implies when unknown). No stall cap: a rank the
    core calls stalled is at 0 already (:func:`stopped`)."""
    own = interval_s if interval_s is not None and interval_s > 0 else 1.0 / steps_per_s
    return quiet_limit_s(own, math.inf)


class Rate(NamedTuple):
    """A rank's rates over its window of records, and how many seconds of records they were measured over."""

    steps_per_s: float
    examples_per_s: Optional[float]
    span_s: float


def window_rate(steps: Sequence[int], ts: Sequence[Optional[float]], examples: Sequence[Optional[int]],
                seconds: float = RATE_WINDOW_S, marks: Sequence[tuple] = ()) -> Optional[Rate]:
    """The rates over the records within ``seconds`` of the newest one (at least the two newest).

    ``steps``, ``ts`` and ``examples`` are the rank's newest records, oldest first (``examples`` cumulative, as
    the SDK writes them). ``marks`` are older records of the rank, thinned (:data:`MARK_S`), as ``(ts, step,
    examples, …)`` oldest first: when the newest records do not reach back ``seconds``, the rates start at the
    oldest mark within ``seconds`` of the newest record that is older than them. None with fewer than two
    timed records or when they span no time.
    """
    n = len(steps)
    if n < 2 or ts[-1] is None:
        return None
    end = ts[-1]
    # A binary search over the records in step order, which are in time order: the live daemon asks this of every
    # rank it writes, every pass. (A wall clock stepped back makes the window a little longer or shorter, never
    # empty: at least the two newest records, over a positive span.)
    times = ts  # a window's deque: indexed in place (a copy of its 64 times cost more than the search)
    try:
        first = bisect.bisect_left(times, end - seconds, 0, n - 2)
    except TypeError:  # an untimed record among them: the records after it
        first = max(i for i in range(n - 1) if times[i] is None) + 1
        first = min(first, n - 2)
    start = times[first]
    if start is None or end <= start:
        return None
    step0, examples0 = steps[first], examples[first]
    if marks and first == 0 and start > end - seconds:  # the newest records do not reach back the seconds
        i = bisect.bisect_left(marks, end - seconds, key=_MARK_TS)
        if i < len(marks) and end - seconds <= marks[i][0] < start:
            start, step0, examples0 = marks[i][0], marks[i][1], marks[i][2]
    span = end - start
    done = examples[-1], examples0
    per_example = (done[0] - done[1]) / span if done[0] is not None and done[1] is not None else None
    return Rate((steps[-1] - step0) / span, per_example, span)


def _stretch(steps_per_s: float, silent_s: float, interval_s: Optional[float]) -> float:
    late = silent_s - grace_s(interval_s, steps_per_s)
    if late <= 0:
        return 1.0
    span = max(RATE_WINDOW_S, 1.0 / steps_per_s)
    return span / (span + late)


def rank_rates(steps_per_s: Optional[float], examples_per_s: Optional[float], silent_s: Optional[float],
               interval_s: Optional[float] = None) -> tuple[Optional[float], Optional[float]]:
    """A rank's (steps/s, examples/s) as of now: both fall by the same stretch while it is silent past its grace
    (:func:`grace_s` of its median step interval ``interval_s``; ``silent_s`` None: it ended, or the run is not
    live — its rates stay those of its last records)."""
    if steps_per_s is None or silent_s is None or steps_per_s <= 0:
        return steps_per_s, examples_per_s
    k = _stretch(steps_per_s, silent_s, interval_s)
    return steps_per_s * k, None if examples_per_s is None else examples_per_s * k


#: Rank states (core/state.py) whose rates are 0 in a live run: they stopped writing without an end.
STOPPED = frozenset({RankState.STALLED, RankState.WAITING, RankState.LOST})


def stopped(steps_per_s: Optional[float], examples_per_s: Optional[float]
            ) -> tuple[Optional[float], Optional[float]]:
    """The rates of a rank in :data:`STOPPED` in a live run: 0 (None stays None: it never had a rate)."""
    return (None if steps_per_s is None else 0.0), (None if examples_per_s is None else 0.0)


def run_rates(ranks: Iterable[tuple[Optional[float], Optional[float]]]) -> tuple[Optional[float], Optional[float]]:
    """A run's (steps/s, examples/s) from its ranks' rates: the slowest rank's pace, the examples of every rank."""
    ranks = list(ranks)
    steps = [s for s, _ in ranks if s is not None]
    examples = [e for _, e in ranks if e is not None]
    return (min(steps) if steps else None), (sum(examples) if examples else None)
