"""The reader's views: what every surface shows of the index, with each figure computed once.

``traceml status`` (table, ``--json``, ``--oneline``), the Prometheus metrics
(``traceml daemon --metrics``) and ``traceml watch`` read runs through these
frozen dataclasses, built by :class:`daemon.reader.Reader` (``runs_view``,
``run_view``, ``figures``, ``backlog_view``). A surface formats a figure; it
never derives one (docs/contracts.md, "One set of figures"):

* one step-time statistic per run, named where it is shown (:class:`StepStatistic`):
  while a run is live, or has no current final summary, each rank's median step
  time over its rolling window (:data:`STEP_STATISTIC`); once its final summary
  is current, the summary's own: each rank's mean over its analysis window
  (:data:`SUMMARY_STATISTIC`, read back from ``step_time.groups.rows``), so an
  ended run shows the summary's numbers on every surface; the run's step time
  is the median rank's;
* each rank's Δ, the slowest rank and the straggler score come from that
  statistic by the one straggler rule, :mod:`traceml_tui.core.straggler` (for
  an ended run the very function the summary's ``STRAGGLER`` verdict called,
  on the same rows: one slow rank and one size everywhere);
* steps/s is the run's pace (its slowest rank's rate: synchronous data
  parallelism runs at it), each rank's measured by the rate rule over its last
  seconds of records, falling while it is silent (:mod:`daemon.rates`,
  :data:`RATE_RULE`); eval lag the training step minus the newest
  evaluated step, and the early-stopping best the policy's own record when the
  run recorded one, else the best completed receipt on the declared metric;
* statuses are :mod:`traceml_tui.core.state` enums, never strings.

This module holds the types and the pure rules that build them from what the
reader fetched; the SQL is the reader's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Optional, Sequence

from traceml_tui.core import artifacts, forensics, steptime, stopping, straggler
from traceml_tui.core.jsonsafe import finite_number
from traceml_tui.core.state import LIVE_RUN_STATES, BacklogState, RankState, RunStatus
from traceml_tui.core.straggler import Spread, SummaryWindow

from .live import WINDOW
from .rates import RATE_RULE

#: The rolling step-time statistic of a live run (named in `traceml status --json` and the Run screen's Help).
STEP_STATISTIC = f"median step time over each rank's last {WINDOW} steps"
#: The same statistic as a column header names it (the Run screen's rank table): the median (p50) in ms.
STEP_STATISTIC_LABEL = "p50 step ms"
#: The statistic of a run whose final summary is current: the summary's own (``step_time.groups.rows``).
SUMMARY_STATISTIC = "mean step time over the final summary's analysis window"
#: ... as the rank table's column header names it.
SUMMARY_STATISTIC_LABEL = "mean step ms"


@dataclass(frozen=True)
class StepStatistic:
    """Which step-time statistic a run's figures are by: ``rolling`` (:data:`STEP_STATISTIC`) or ``summary``
    (:data:`SUMMARY_STATISTIC`, over the summary's steps ``start_step``–``end_step``)."""

    kind: str = "rolling"
    start_step: Optional[int] = None
    end_step: Optional[int] = None

    @property
    def text(self) -> str:
        """The statistic in words (`traceml status --json` ``step_time_statistic``, the Run screen's Help)."""
        if self.kind != "summary":
            return STEP_STATISTIC
        steps = f" (steps {self.start_step}–{self.end_step})" if self.start_step is not None else ""
        return SUMMARY_STATISTIC + steps

    @property
    def label(self) -> str:
        """The rank table's step-time column header."""
        return SUMMARY_STATISTIC_LABEL if self.kind == "summary" else STEP_STATISTIC_LABEL

    @property
    def word(self) -> str:
        """How the Run screen's header names the run's step time: ``median 42.8 ms`` / ``mean 7.88 ms``."""
        return "mean" if self.kind == "summary" else "median"


ROLLING = StepStatistic()


def step_statistic(rolling: Iterable[tuple[int, Optional[float]]], window: Optional[SummaryWindow]
                   ) -> tuple[StepStatistic, tuple[tuple[int, Optional[float]], ...], Optional[Spread]]:
    """A run's statistic, each rank's value of it and their spread (core/straggler.py).

    ``rolling``: (rank, median step ms over its rolling window) of each rank's newest attempt; ``window``: the
    run's current final summary's rows (None: live, or no current summary with step times). With a window, the
    spread is :func:`~traceml_tui.core.straggler.rows_spread` of the summary's rows — the call its ``STRAGGLER``
    verdict made — keyed by rank, and each rank's value is its row's (None without one).
    """
    rolling = tuple(rolling)
    if window is None:
        return ROLLING, rolling, straggler.spread(rolling)
    found = window.spread()
    if found is not None:
        found = replace(found, median_key=int(found.median_key), worst_key=int(found.worst_key))
    stat = StepStatistic("summary", window.start_step, window.end_step)
    return stat, tuple((rank, window.value(rank)) for rank, _ in rolling), found


def summary_parts(window: SummaryWindow, rank: int) -> Optional[dict[str, Any]]:
    """A rank's step-time parts over the summary's window, as the rank table reads parts (``daemon/live.py``
    ``step_parts``: the whole, each part of ``core.steptime.PART_NAMES``, traced, clock); None without a row."""
    whole = window.value(rank)
    if whole is None:
        return None
    parts: dict[str, Any] = {name: window.value(rank, steptime.metric_name(name)) for name in steptime.PART_NAMES}
    parts.update(whole=whole, traced=window.value(rank, "traced_step_time_ms"), clock=window.clock,
                 steps=None if window.start_step is None or window.end_step is None
                 else window.end_step - window.start_step + 1)
    return parts


_num = finite_number  # a figure read back from a side file (core/jsonsafe.py)


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RankView:
    """One rank of a run (its newest attempt) with its figures."""

    rank: int
    attempt: int
    node: Optional[int]
    state: Optional[RankState]
    records: int
    last_step: Optional[int]
    last_ts: Optional[float]
    last_seen: Optional[float]
    step_ms: Optional[float]  # the run's statistic (RunFigures.step_statistic)
    delta_pct: Optional[float]  # step_ms against the median rank's (core.straggler.Spread.delta_pct)
    input_wait_ms: Optional[float]  # the median input wait over the same steps
    steps_per_s: Optional[float]
    examples_per_s: Optional[float]
    loss: Optional[float]
    ratios: tuple[tuple[str, float], ...]
    ended: Optional[str]
    exit_code: Optional[int]
    # The window's step time and parts averaged over the same steps (core.steptime.average_parts; they add up to
    # parts["whole"], a mean, so they are shown as the window's means beside the median step_ms).
    parts: Optional[dict[str, Any]] = field(default=None, hash=False)


@dataclass(frozen=True)
class EarlyStoppingView:
    """The run's early stopping (seed 004; docs/hygiene.md "Early stopping").

    ``source`` says where the facts come from: ``summary`` — the state the run
    recorded at its end (``final_summary.json`` ``validation.early_stopping``
    and ``best``); ``policy`` — the policy's own state as it goes
    (``early_stopping.json`` as indexed, core/stopping.py: its best weighs
    ``min_delta`` and the warm-up); ``declared`` — only the policy the
    manifest's hygiene block declares, nothing consumed yet (no best).
    """

    enabled: bool
    source: str  # summary | policy | declared
    metric: Optional[str] = None
    direction: Optional[str] = None  # min | max
    patience: Optional[int] = None
    patience_used: Optional[int] = None
    evaluations: Optional[int] = None
    state: Optional[str] = None  # stopped | not-stopped | disabled | not-recorded (summary only)
    reason: Optional[str] = None
    trigger_checkpoint: Optional[str] = None
    trigger_step: Optional[int] = None
    best_checkpoint: Optional[str] = None
    best_step: Optional[int] = None
    best_value: Optional[float] = None
    receipts: int = 0  # completed evaluations in the backlog now
    after_stop_steps: tuple[Optional[int], ...] = ()
    # completed receipts without the monitored metric (declared only): how many, and the metrics they had
    lacking: int = 0
    lacking_metrics: tuple[str, ...] = ()
    # blocked checkpoints the policy consumed without counting (policy only): (checkpoint, step, reason)
    skipped: tuple[tuple[Optional[str], Optional[int], Optional[str]], ...] = ()
    min_delta: Optional[float] = None  # improvement the policy requires over its best (policy file or declared)
    warmup: Optional[int] = None  # updates before an evaluation counts
    recorded: Optional[dict[str, Any]] = field(default=None, hash=False, compare=False)  # the summary's section


@dataclass(frozen=True)
class RunFigures:
    """The figures every surface shows for one run (the Run screen's header, `status --json` ``figures``,
    the metrics' run gauges)."""

    statistic: str  # the run's StepStatistic.text: STEP_STATISTIC, or SUMMARY_STATISTIC once its summary is current
    step_ms: Optional[float]  # the median rank's step time
    slowest_rank: Optional[int]
    straggler_score: Optional[float]  # the slowest rank's step time over the median rank's (1.0 = even)
    straggler_pct: Optional[float]  # the same as a skew (%); None with one timed rank
    straggler: bool  # the straggler rule's verdict (core.straggler.STRAGGLER_SKEW_PCT)
    steps_per_s: Optional[float]
    examples_per_s: Optional[float]
    eval_step: Optional[int]  # the newest evaluated step (an eval record or a validation receipt)
    eval_lag: Optional[int]  # the training step minus eval_step
    early_stopping: Optional[EarlyStoppingView] = None
    declared_steps: Optional[int] = None  # the declared last step while the run has not passed it (manifest)
    eta_s: Optional[float] = None  # seconds to declared_steps at steps_per_s (a running run only)
    ratio_name: Optional[str] = None  # the loss component with the highest scale-free ratio (the one to watch)
    loss_ratio: Optional[float] = None  # its ratio (1.0 = what predicting zero scores)
    rate_rule: str = RATE_RULE  # how steps_per_s / examples_per_s are measured (daemon/rates.py)
    step_statistic: StepStatistic = ROLLING  # which statistic step_ms, Δ and the straggler are by

    @property
    def best(self) -> Optional[tuple[Optional[str], Optional[int], float]]:
        """The early-stopping best as (checkpoint, step, value), or None."""
        es = self.early_stopping
        if es is None or es.best_value is None:
            return None
        return es.best_checkpoint, es.best_step, es.best_value

    def to_json(self) -> dict[str, Any]:
        """``traceml status --json``'s ``figures`` of a run (docs/daemon.md)."""
        es = self.early_stopping
        best = None
        if es is not None and es.best_value is not None:
            best = {"metric": es.metric, "direction": es.direction, "checkpoint": es.best_checkpoint,
                    "step": es.best_step, "value": es.best_value, "source": es.source}
        return {"step_time_statistic": self.statistic, "step_time_source": self.step_statistic.kind,
                "step_ms": self.step_ms, "slowest_rank": self.slowest_rank,
                "straggler_score": self.straggler_score, "straggler_pct": self.straggler_pct,
                "straggler": self.straggler, "steps_per_s": self.steps_per_s, "examples_per_s": self.examples_per_s,
                "eval_step": self.eval_step, "eval_lag": self.eval_lag, "early_stopping_best": best,
                "rate_rule": self.rate_rule}


def run_times(status: RunStatus, first_ts: Optional[float], last_ts: Optional[float], now: float,
              started: Optional[float] = None, ended: Optional[float] = None) -> tuple[Optional[float], Optional[float]]:
    """(age, duration) of a run at ``now``, in seconds: age since its newest record; duration from when it
    started (the launcher's start, else its first record: the earlier) to when it ended (the launcher's end or its
    newest record: the later), or to now while it is live (``running``/``stalled``: it is still going).

    The one duration every surface shows (the Runs table, the Run screen, Describe): a run that hung 45 s
    before it was stopped read 1 s in the Runs table (first record to newest) and 53 s on its Run screen
    (found trying the product)."""
    age = None if last_ts is None else max(0.0, now - last_ts)
    starts = [t for t in (first_ts, started) if t is not None]
    if not starts:
        return age, None
    if status in LIVE_RUN_STATES:
        end = now
    else:
        ends = [t for t in (last_ts, ended) if t is not None]
        end = max(ends) if ends else now
    return age, max(0.0, end - min(starts))


def step_figures(spread: Optional[Spread]) -> tuple[Optional[float], Optional[int], Optional[float],
                                                     Optional[float], bool]:
    """(step_ms, slowest_rank, straggler_score, straggler_pct, straggler) of a run's rank spread."""
    if spread is None:
        return None, None, None, None, False
    return spread.median, spread.worst_key, spread.score, spread.skew_pct, spread.straggler


def early_stopping(validation: Optional[artifacts.ValidationSection], manifest: Optional[artifacts.Manifest],
                   backlog: Iterable[Any], policy: Optional[stopping.StoppingView] = None) -> Optional[EarlyStoppingView]:
    """The run's early stopping: the state it recorded at its end (summary ``validation``), else the policy's own
    state as it goes (``early_stopping.json`` as indexed: :meth:`Reader.early_stopping`), else the policy its
    manifest declares with nothing consumed yet (no best: the best is the policy's own, core/stopping.py);
    None without any.

    ``backlog`` are the reader's backlog items (``checkpoint``, ``step``, ``state``, ``metrics``).
    """
    backlog = tuple(backlog)
    receipts = sum(1 for b in backlog if b.state is BacklogState.COMPLETED)
    early = validation.early_stopping if validation is not None else None
    if isinstance(early, dict):
        enabled = early.get("enabled") is not False
        best = validation.best if validation is not None and isinstance(validation.best, dict) else {}
        stopped = early.get("state") == "stopped"
        return EarlyStoppingView(
            enabled=enabled, source="summary", metric=early.get("metric"), direction=early.get("direction"),
            patience=_int(early.get("patience")), patience_used=_int(early.get("patience_counter")),
            evaluations=_int(early.get("evaluations")), state=early.get("state"),
            reason=early.get("reason") if stopped else (None if enabled else early.get("disabled_reason")),
            trigger_checkpoint=early.get("trigger_checkpoint"), trigger_step=_int(early.get("trigger_step")),
            best_checkpoint=best.get("checkpoint"), best_step=_int(best.get("step")), best_value=_num(best.get("value")),
            receipts=receipts,
            after_stop_steps=tuple(_int(e.get("step")) for e in early.get("after_stop") or [] if isinstance(e, dict)),
            min_delta=policy.min_delta if policy is not None else None,
            warmup=policy.warmup if policy is not None else None, recorded=early)
    if policy is not None:
        on = policy.enabled
        return EarlyStoppingView(
            enabled=on, source="policy", metric=policy.metric, direction=policy.direction if on else None,
            patience=policy.patience if on else None, patience_used=policy.patience_used if on else None,
            evaluations=policy.evaluations, state=policy.state,
            reason=policy.reason if policy.stopped else policy.disabled_reason,
            trigger_checkpoint=policy.trigger_checkpoint, trigger_step=policy.trigger_step,
            best_checkpoint=policy.best_checkpoint, best_step=policy.best_step, best_value=policy.best_value,
            receipts=receipts, after_stop_steps=policy.after_stop_steps, lacking=policy.missing_metric,
            lacking_metrics=policy.missing_metric_names, skipped=policy.skipped,
            min_delta=policy.min_delta, warmup=policy.warmup)
    raw = manifest.hygiene_block.get("early_stopping") if manifest is not None else None
    block = artifacts.decode_lenient(raw, artifacts.EarlyStoppingBlock)  # the declared block, typed
    if block is None:
        return None
    on = block.enabled
    metric = block.metric if on else None
    # Receipts that lack the monitored metric are named already, in the policy's words (docs/hygiene.md).
    lacking = [b for b in backlog if b.state is BacklogState.COMPLETED and _num(dict(b.metrics).get(metric)) is None
               ] if metric else []
    return EarlyStoppingView(
        enabled=on, source="declared", metric=metric, direction=(block.direction or "min") if on else None,
        patience=block.patience if on else None, reason=None if on else block.reason, receipts=receipts,
        lacking=len(lacking), lacking_metrics=tuple(sorted({str(k) for b in lacking for k, _ in b.metrics})),
        min_delta=block.min_delta if on else None, warmup=block.warmup if on else None)


def diagnosis_line(summary: Optional[artifacts.Summary]) -> Optional[str]:
    """The final summary's primary diagnosis in one line: ``STRAGGLER — Rank 1 is 18% slower … Next: …``."""
    found = diagnosis(summary)
    return found.line if found is not None else None


@dataclass(frozen=True)
class Issue:
    """One diagnosis of the final summary's step time (``step_time.issues``): ``STRAGGLER``, ``INPUT-BOUND``…"""

    status: str  # the verdict word: STRAGGLER, INPUT-BOUND, BETWEEN-STEPS, COMPUTE-BOUND, BALANCED, NO DATA
    summary: str  # what it found, in one sentence
    action: Optional[str] = None  # what to do next
    severity: Optional[str] = None  # warn | info
    ranks: tuple[int, ...] = ()  # the ranks it names (a straggler)
    skew_pct: Optional[float] = None  # a straggler's size (%)


@dataclass(frozen=True)
class Diagnosis:
    """The final summary's verdict and every issue behind it, as the summary card says them (``Verdict:`` /
    ``Next:``): the Run screen's verdict line and its diagnosis panel. Only a run's current summary has one."""

    verdict: Issue  # the primary diagnosis (``primary_diagnosis``: the first issue)
    issues: tuple[Issue, ...]  # every step-time issue, the verdict first

    @property
    def line(self) -> str:
        """``STRAGGLER — Rank 1 is 18% slower than the median rank. Next: …`` (:func:`diagnosis_line`)."""
        v = self.verdict
        return f"{v.status} — {v.summary}" + (f" Next: {v.action}" if v.action else "")


def _issue(d: Any) -> Optional[Issue]:
    if not isinstance(d, dict) or not isinstance(d.get("status"), str) or not isinstance(d.get("summary"), str):
        return None
    action, severity = d.get("action"), d.get("severity")
    ranks = d.get("ranks") if isinstance(d.get("ranks"), list) else []
    return Issue(status=d["status"], summary=d["summary"], action=action if isinstance(action, str) and action else None,
                 severity=severity if isinstance(severity, str) else None,
                 ranks=tuple(r for r in ranks if _int(r) is not None), skew_pct=_num(d.get("skew_pct")))


def diagnosis(summary: Optional[artifacts.Summary]) -> Optional[Diagnosis]:
    """The summary's verdict (``primary_diagnosis``) and its step-time issues (None: no summary, or no verdict)."""
    if summary is None:
        return None
    verdict = _issue(summary.primary_diagnosis)
    if verdict is None:
        return None
    raw = summary.step_time.get("issues") if isinstance(summary.step_time, dict) else None
    issues = tuple(i for i in (_issue(d) for d in (raw if isinstance(raw, list) else [])) if i is not None)
    return Diagnosis(verdict=verdict, issues=issues or (verdict,))


@dataclass(frozen=True)
class RunsView:
    """Every run of the index (optionally under some roots), most recently active first."""

    runs: tuple[Any, ...]  # daemon.reader.RunSummary
    version: int
    backlog_outstanding: tuple[tuple[int, int], ...] = ()  # (run_id, requests without a receipt)
    indexing: Optional[Any] = None  # daemon.reader.IngestProgress while a first launch reads a backlog

    def outstanding(self, run_id: int) -> int:
        """Validation requests of ``run_id`` without a receipt."""
        return dict(self.backlog_outstanding).get(run_id, 0)


@dataclass(frozen=True)
class RunView:
    """One run, everything the Run screen shows above its charts and `status --json` shows of it."""

    run: Any  # daemon.reader.RunSummary
    figures: RunFigures
    ranks: tuple[RankView, ...]  # the newest attempt of each rank, by rank
    attempts: tuple[Any, ...]  # every (rank, attempt): daemon.reader.RankRow
    outcomes: tuple[Any, ...]
    manifest: Optional[artifacts.Manifest]
    summary_status: Optional[str]
    nodes: tuple[int, ...]
    metrics: tuple[str, ...]
    backlog: tuple[Any, ...]  # daemon.reader.BacklogItem
    failure: Optional["FailureView"] = None  # the summary's failure section, else what the rank states say
    diagnosis: Optional[str] = None  # diagnosis_line of the run's current final summary
    evals: tuple["EvalPoint", ...] = ()  # eval records and the backlog's requests (eval_points)
    eval_metric: Optional[str] = None  # the metric the evaluations are charted by
    verdict: Optional["Diagnosis"] = None  # the current final summary's verdict and issues (diagnosis)


@dataclass(frozen=True)
class BacklogView:
    """The validation backlog of one run or of every run, and the heavy QC backlog beside it."""

    items: tuple[tuple[str, Any], ...]  # (run name, daemon.reader.BacklogItem), by run name then step
    counts: tuple[tuple[BacklogState, int], ...]
    newest_completed: Optional[tuple[str, str, Optional[int]]]  # (run, checkpoint, step)
    eval_lag: Optional[int]
    train_step: Optional[int]
    run: Optional[str] = None  # the run's name when the view is of one run
    #: the heavy QC backlog beside it (docs/qc.md): (run name, BacklogItem of kind ``qc``), by run name then step
    qc_items: tuple[tuple[str, Any], ...] = ()
    #: (run name, ``reader.backlog.worker_qc`` report) of each run that requires worker QC, by run name
    worker_qc: tuple[tuple[str, dict], ...] = ()


def worst_ratio(ratios: Any) -> tuple[Optional[str], Optional[float]]:
    """The loss component with the highest scale-free ratio (1.0 = no skill): the one to watch."""
    if not isinstance(ratios, dict):
        return None, None
    best: tuple[Optional[str], Optional[float]] = (None, None)
    for name, value in ratios.items():
        v = _num(value)
        if v is not None and (best[1] is None or v > best[1]):
            best = (str(name), v)
    return best


def eta_s(status: RunStatus, step: Optional[int], declared_steps: Optional[int],
          steps_per_s: Optional[float]) -> Optional[float]:
    """Seconds a running run needs to reach its declared last step at its pace (None: not running, no end declared,
    no pace, or past it)."""
    if status is not RunStatus.RUNNING or declared_steps is None or step is None or not steps_per_s \
            or declared_steps <= step:
        return None
    return (declared_steps - step) / steps_per_s


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation on the train-vs-eval chart: an ``eval`` record or a validation request."""

    step: int
    value: Optional[float]
    status: str  # completed | pending | failed
    checkpoint: Optional[str] = None


#: Backlog states whose checkpoint is still to be evaluated (a waiting point) or failed.
_EVAL_WAITING = frozenset({BacklogState.PENDING, BacklogState.CLAIMED, BacklogState.STALE_CLAIM})
_EVAL_FAILED = frozenset({BacklogState.FAILED, BacklogState.BLOCKED})


def eval_points(events: Iterable[Any], backlog: Iterable[Any] = (), preferred: Optional[str] = None,
                ) -> tuple[tuple[EvalPoint, ...], Optional[str]]:
    """Evaluations as chart points — ``eval`` records and the validation backlog alike — and the metric charted.

    A receipt is a completed point; a failed or blocked request a failure; a
    pending, claimed or stale-claimed one a waiting point at its checkpoint's
    step. A request whose checkpoint an ``eval`` record already reports as
    completed is not drawn twice. The metric is ``preferred`` (the early-stopping
    metric) when recorded, else ``loss``, else the commonest (ties: by name).
    """
    events, backlog = tuple(events), tuple(backlog)
    names: dict[str, int] = {}
    for e in events:
        for k in (e.body.get("metrics") or {}):
            names[k] = names.get(k, 0) + 1
    for b in backlog:
        for k, _ in b.metrics:
            names[k] = names.get(k, 0) + 1
    if preferred in names:
        name: Optional[str] = preferred
    elif "loss" in names:
        name = "loss"
    else:
        name = min(names, key=lambda k: (-names[k], k)) if names else None
    points = []
    reported = set()
    for e in events:
        value = _num((e.body.get("metrics") or {}).get(name)) if name else None
        status = str(e.body.get("status"))
        if status == "completed" and e.body.get("checkpoint"):
            reported.add(e.body.get("checkpoint"))
        points.append(EvalPoint(step=int(e.step or 0), value=value, status=status, checkpoint=e.body.get("checkpoint")))
    for b in backlog:
        if b.step is None or b.checkpoint in reported:
            continue
        if b.state is BacklogState.COMPLETED:
            status, value = "completed", _num(dict(b.metrics).get(name)) if name else None
        elif b.state in _EVAL_FAILED:
            status, value = "failed", None
        elif b.state in _EVAL_WAITING:
            status, value = "pending", None
        else:
            continue
        points.append(EvalPoint(step=b.step, value=value, status=status, checkpoint=b.checkpoint))
    points.sort(key=lambda p: p.step)
    return tuple(points), name


def heatmap(step_series: Sequence[Any], columns: int
            ) -> tuple[tuple[tuple[Optional[float], ...], ...], tuple[int, int]]:
    """Rank × step-bucket matrix of step time over the median across ranks in the same bucket.

    ``step_series`` are the reader's step-time series, one per rank (each point a bucket of steps with its mean);
    returns the matrix and the (first, last) step it spans.
    """
    xy = [[((p.step_lo + p.step_hi) / 2.0, p.mean) for p in s.points] for s in step_series]
    xs = [x for pts in xy for x, _ in pts]
    if not xs:
        return (), (0, 0)
    lo, hi = min(xs), max(xs)
    span = max(1.0, hi - lo)
    cols = max(1, min(columns, len({int(x) for x in xs})))
    grid: list[list[list[float]]] = [[[] for _ in range(cols)] for _ in xy]
    for r, pts in enumerate(xy):
        for x, y in pts:
            if y is not None:
                grid[r][min(cols - 1, int((x - lo) / span * cols))].append(y)
    means = [[(sum(c) / len(c)) if c else None for c in row] for row in grid]
    out = []
    for row in means:
        cells = []
        for c, v in enumerate(row):
            col_vals = [m[c] for m in means if m[c] is not None]
            med = statistics.median(col_vals) if col_vals else None
            cells.append(None if v is None or not med else v / med)
        out.append(tuple(cells))
    return tuple(out), (int(lo), int(hi))


@dataclass(frozen=True)
class FailureView:
    """Who failed first, where and why: the run's ``failure`` summary section (core/forensics.py), or — before
    the launcher's summary, or without one — what the rank states and a hang's records say."""

    cause: str
    rank: Optional[int] = None
    node: Optional[int] = None
    step: Optional[int] = None
    state: Optional[RankState] = None  # the first failing rank's state: failed | lost
    cause_text: str = ""
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    exception: Optional[str] = None
    victims: tuple[int, ...] = ()
    log: Optional[str] = None
    hang: Optional[str] = None  # the hang's one line (core/hang.py): the culprit's frame, who waits where
    last_step: Optional[int] = None  # its last completed step (a teardown crash came after it, in no step)


#: Why a failure shown from the rank states alone has no cause yet.
PENDING_CAUSE = "no final summary: the launcher writes the cause when it finalizes the run"


def recorded_failure(section: Optional[artifacts.FailureSection]) -> Optional[FailureView]:
    """The summary's failure section as a view (None: no failure recorded)."""
    if section is None:
        return None
    state = section.state if section.state in {s.value for s in RankState} else None
    return FailureView(cause=section.cause, rank=section.rank, node=section.node, step=section.step,
                       state=RankState(state) if state is not None else None, cause_text=section.cause_text, exit_code=section.exit_code,
                       signal=section.signal, exception=section.exception, victims=tuple(section.victims),
                       log=section.log, hang=section.hang_text, last_step=section.last_step)


def inferred_failure(run: Any, ranks: Sequence[RankView]) -> Optional[FailureView]:
    """Before the launcher's summary (or without one: the launcher died), who failed first as the states say;
    while a run hangs, the rank its peers wait for (the reader's core.hang.HangReport)."""
    hang = run.hang
    victims = tuple(r.rank for r in ranks if r.state is RankState.ABORTED)
    if hang is not None and hang.culprits and run.status in (RunStatus.STALLED, RunStatus.FAILED, RunStatus.LOST):
        culprit = next((r for r in ranks if r.rank == hang.culprits[0]), None)
        return FailureView(cause="hang", cause_text=forensics.CAUSE_TEXT["hang"], rank=hang.culprits[0],
                           node=culprit.node if culprit else None,
                           step=None if culprit is None or culprit.last_step is None else culprit.last_step + 1,
                           state=culprit.state if culprit is not None else None,
                           hang=hang.text, victims=victims)
    first = next((r for r in ranks if r.rank == run.first_failed), None)
    if first is None:
        # lost with no lost rank: every rank ended (or none ever wrote: its lease expired first) and the launcher
        # never finalized (core/state.py launcher_lost and the launcher-lease rules)
        if run.status is RunStatus.LOST and all(r.ended is not None for r in ranks):
            return FailureView(cause="launcher-lost", cause_text=forensics.CAUSE_TEXT["launcher-lost"])
        return None
    return FailureView(cause="unknown", cause_text=PENDING_CAUSE, rank=first.rank, node=first.node,
                       step=None if first.last_step is None else first.last_step + 1,
                       state=first.state, victims=victims)
