"""Frozen snapshots handed from the refresh worker to the screens.

Everything a screen shows is in one of these immutable dataclasses, built
off the UI thread by :mod:`traceml_tui.tui.source`. Widgets never query the
index: they receive a slice of a snapshot through a reactive and redraw.
Times are unix seconds; durations are milliseconds unless named ``_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from daemon.reader import IngestError  # one ingest-error type: the reader's, shown as it is
from daemon.views import ROLLING, Diagnosis, EvalPoint, FailureView, StepStatistic  # the reader's views, as they are
from daemon.writer_health import WRITER_DAEMON, WRITER_EMBEDDED, WRITER_NONE, WRITER_WATCH  # noqa: F401 - the words
from traceml_tui.core.state import ALERT_STATES, BACKLOG_ORDER, RUN_ATTENTION, BacklogState, RankState, RunStatus
from traceml_tui.tui.textplot import duration

#: Run states shown in the Runs table, in the order used to sort by status (the core's attention order).
RUN_STATES: tuple[RunStatus, ...] = RUN_ATTENTION

#: Run states that need the user's attention: counted in the Runs header, announced by the bell.
ATTENTION_WORDS: frozenset[RunStatus] = ALERT_STATES

#: Backlog states, in display order (the core's words).
BACKLOG_STATES: tuple[BacklogState, ...] = BACKLOG_ORDER


@dataclass(frozen=True)
class RunRow:
    """One line of the Runs screen."""

    run_id: int
    name: str
    status: RunStatus
    silent_ranks: tuple[int, ...] = ()
    explaining_ranks: tuple[int, ...] = ()  # named beside the status word, as `traceml status` names them
    lost_nodes: tuple[int, ...] = ()  # nodes whose launcher lease expired while another's did not (`lost node 1`)
    workload: Optional[str] = None
    nodes: Optional[int] = None
    procs_per_node: Optional[int] = None
    step: Optional[int] = None
    declared_steps: Optional[int] = None
    median_step_ms: Optional[float] = None
    trend: tuple[float, ...] = ()  # median step time per bucket, oldest first (sparkline)
    steps_per_s: Optional[float] = None
    examples_per_s: Optional[float] = None
    loss_ratio: Optional[float] = None
    eval_step: Optional[int] = None  # step of the newest completed checkpoint evaluation
    eval_lag: Optional[int] = None  # training step minus eval_step
    backlog: int = 0  # validation requests without a receipt
    errors: int = 0  # ingest error rows
    last_ts: Optional[float] = None
    folder: str = ""  # where the run lives, from its root's name ("logs/exp1"): tells same-named runs apart
    dir: str = ""  # the run directory (in memory only: compare picks a run by it, not by its name)
    slowest_rank: Optional[int] = None  # the rank with the slowest median step time
    straggler_score: Optional[float] = None  # its median step time over the median rank's (1.0 = even)
    straggler_pct: Optional[float] = None  # the same as a skew in % (None with one timed rank)
    straggler: bool = False  # the straggler rule's verdict (core/straggler.py, as the summary's STRAGGLER)
    # which statistic median_step_ms, Δ and the straggler are by (the rolling median, or the current summary's means)
    step_statistic: StepStatistic = ROLLING
    first_failed: Optional[int] = None  # the rank that failed first (core/state.py first_failure; the others aborted)
    # Nothing hides (docs/watch.md): the reader's marks after the word (`SIGINT`, `r1 silent 12s`, `⚠ 2 blocked`),
    # whether the run needs attention (an alert word or a validation mark: core.state.needs_attention), the
    # validation mark alone, what interrupted it and when; Age (since its newest record) and Duration (first
    # record to its newest, or to now while live) as shown, and in seconds for sorting (not compared: a rebuild
    # whose shown text did not move is not handed to the screen).
    marks: str = ""
    attention: bool = False
    validation_mark: Optional[str] = None
    quiet_ranks: tuple[int, ...] = ()
    interrupted_by: Optional[str] = None
    interrupted_at: Optional[float] = None
    age: str = "–"
    duration: str = "–"
    age_s: Optional[float] = field(default=None, compare=False)
    duration_s: Optional[float] = field(default=None, compare=False)


@dataclass(frozen=True)
class RunsSnapshot:
    """All runs the index knows, at one data version."""

    rows: tuple[RunRow, ...]
    now: float
    version: int
    index_ready: bool = True
    note: Optional[str] = None  # why the list is empty, shown in the empty state
    indexing: Optional[str] = None  # "indexing 3.2 M / 8.0 M records · 40 s left" while a first launch reads
    health: Optional["SourceHealth"] = None  # who writes the index and how fresh it is (None: not known)




@dataclass(frozen=True)
class SourceHealth:
    """The data source's health, shown in every screen's header (docs/watch.md, "Data source").

    ``writer`` is who holds the index's writer lock: this watch (its embedded
    ingester), a ``traceml daemon`` or another ``traceml watch`` (with ``pid``),
    or nobody. ``stale_since`` is set when nobody indexes this watch's roots
    any more though a writer did earlier: the time it last did, as of which the
    states shown are decided (a silent writer is not a stalled rank).
    ``unwatched`` are this watch's roots that the writer does not index.
    """

    writer: str
    pid: Optional[int] = None
    commit_age_s: Optional[float] = None  # seconds since the writer's newest commit (None: nothing committed)
    overdue: bool = False  # that age is too old while runs are live (core.state.commit_overdue)
    stale_since: Optional[float] = None
    unwatched: tuple[str, ...] = ()
    taking_over: bool = False  # this watch is starting its own ingester (the writer is gone)

    @property
    def stale(self) -> bool:
        """Whether the header warns: nobody writes, the writer's newest commit is overdue, it leaves roots out,
        or the data is as of an earlier time (a new writer has not caught up yet)."""
        return self.writer == WRITER_NONE or self.overdue or bool(self.unwatched) or self.stale_since is not None

    def who(self) -> str:
        """``this watch``, ``daemon pid 4242``, ``watch pid 4242`` or ``no writer``."""
        if self.writer == WRITER_NONE:
            return "no writer"
        if self.writer == WRITER_EMBEDDED or self.pid is None:
            return self.writer
        return f"{self.writer} pid {self.pid}"

    def text(self) -> str:
        """The header's source line: ``daemon pid 4242 · commit 2s ago`` (⚠ first when it warns)."""
        age = duration(self.commit_age_s) if self.commit_age_s is not None else None
        if self.writer == WRITER_NONE:
            what = "writer gone, taking over" if self.taking_over else "no writer"
            return f"⚠ {what}" + (f" · data {age} old" if age else "")
        text = f"{self.who()} · " + (f"commit {age} ago" if age else "nothing committed yet")
        if self.overdue:
            text = f"{self.who()} · last commit {age} ago"
        elif self.stale_since is not None:  # a new writer reading what was written while nobody did
            text = f"{self.who()} · catching up"
        if self.stale:
            text = "⚠ " + text
        if self.unwatched:
            text += f" · {len(self.unwatched)} root{'s' if len(self.unwatched) > 1 else ''} not indexed"
        return text


@dataclass(frozen=True)
class RankRow:
    """One rank of a run (its latest attempt)."""

    rank: int
    attempt: int
    node: Optional[int]
    step: Optional[int]
    step_ms: Optional[float]  # step time: previous step's end to this step's end (core.steptime)
    parts: tuple[Optional[float], ...]  # ms of each core.steptime part, in PART_NAMES order (None: not measured)
    delta_pct: Optional[float]  # vs the median rank's step time
    silent_s: Optional[float]  # seconds since its newest record
    silent: bool = False  # stalled or lost
    ended: Optional[str] = None  # the rank_end record's status word, as written
    state: Optional[RankState] = None  # the core's decision (None: an older attempt)
    quiet: bool = False  # still running, but silent for several of its own step intervals (core.state.quiet_ranks)


@dataclass(frozen=True)
class Series:
    """A downsampled series: x = representative step of each bucket, y = mean, lo/hi = bucket min/max."""

    name: str
    x: tuple[float, ...]
    y: tuple[Optional[float], ...]
    lo: tuple[Optional[float], ...] = ()
    hi: tuple[Optional[float], ...] = ()


@dataclass(frozen=True)
class NodeMetrics:
    node: int
    ts: Optional[float]
    cpu_pct: Optional[float]
    ram_used: Optional[int]
    ram_total: Optional[int]
    gpus: tuple[tuple[int, Optional[float], Optional[int], Optional[int]], ...] = ()  # (index, util %, mem used, mem total)


@dataclass(frozen=True)
class Outcome:
    node: int
    status: str
    exit_code: Optional[int]
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class FieldVerdict:
    """Field-collapse QC of one latent field (seed 004): ``status`` is ok, failed or no_reference."""

    name: str
    status: str
    qc_points: int
    failed_at_step: Optional[int]
    latest_step: Optional[int]
    latest_spread_ratio: Optional[float]
    factor: float


#: Who failed first, where and why (the reader's view: the summary's failure section, else the rank states).
FailureInfo = FailureView


@dataclass(frozen=True)
class EarlyStoppingInfo:
    """The Run screen's early-stopping panel (seed 004; docs/hygiene.md "Early stopping").

    ``source`` says where the facts come from: ``summary`` — the state the run
    recorded at its end (``final_summary.json`` ``validation.early_stopping`` and
    ``best``); ``policy`` — the policy's own state as it goes (``early_stopping.json``
    as indexed: ``core/stopping.py``; its best weighs ``min_delta`` and the warm-up);
    ``declared`` — only the policy the manifest's hygiene block declares (nothing
    consumed yet: no best).
    """

    enabled: bool
    source: str  # summary | declared
    metric: Optional[str] = None
    direction: Optional[str] = None  # min | max
    patience: Optional[int] = None
    patience_used: Optional[int] = None  # evaluations since the best without improvement (summary only)
    evaluations: Optional[int] = None  # evaluations consumed (summary only)
    state: Optional[str] = None  # stopped | not-stopped | disabled | not-recorded (summary only)
    reason: Optional[str] = None  # why it stopped (patience_exhausted, max_budget) or why it is disabled
    trigger_checkpoint: Optional[str] = None
    trigger_step: Optional[int] = None
    best_checkpoint: Optional[str] = None
    best_step: Optional[int] = None
    best_value: Optional[float] = None
    receipts: int = 0  # completed evaluations in the backlog now
    after_stop_steps: tuple[Optional[int], ...] = ()  # checkpoints consumed after the stop, not counted (summary only)
    notes: tuple[str, ...] = ()  # what early stopping could not use (hygiene/report.py early_stopping_notes)
    min_delta: Optional[float] = None  # improvement the policy requires over its best (policy file or declared)
    warmup: Optional[int] = None  # updates before an evaluation counts


@dataclass(frozen=True)
class RunDetail:
    """Everything the Run screen shows for one run."""

    run: RunRow
    ranks: tuple[RankRow, ...]
    step_time: tuple[Series, ...]  # one per rank
    loss_ratio: Optional[Series]
    ratio_name: Optional[str]
    train_metric: Optional[Series]
    eval_metric_name: Optional[str]
    evals: tuple[EvalPoint, ...]
    heatmap: tuple[tuple[Optional[float], ...], ...]  # rows = ranks, cols = step buckets, value = step time / median of ranks
    heat_steps: tuple[int, int] = (0, 0)
    nodes: tuple[NodeMetrics, ...] = ()
    outcomes: tuple[Outcome, ...] = ()
    errors: tuple[IngestError, ...] = ()
    fields: tuple[FieldVerdict, ...] = ()
    now: float = 0.0
    failure: Optional[FailureInfo] = None  # a failed run's forensics, from its final summary
    metrics: tuple[str, ...] = ()  # the metrics with series in the index (the chart chooser's choices)
    chart_metric: str = "step_ms"  # the metric of the chosen chart
    chart_rank: Optional[int] = None  # its rank (None: every rank)
    chart: tuple[Series, ...] = ()  # the chosen chart: one series per rank shown
    started_at: Optional[float] = None  # the manifest's start (unix seconds)
    ended_at: Optional[float] = None  # the manifest's end (None while running)
    eta_s: Optional[float] = None  # seconds to the declared last step at the current steps/s (running only)
    early_stopping: Optional[EarlyStoppingInfo] = None  # runs that declared or recorded early stopping
    diagnosis: Optional[str] = None  # the final summary's primary diagnosis and what to do next, in one line
    verdict: Optional[Diagnosis] = None  # the final summary's verdict and its issues (None: no current summary)


@dataclass(frozen=True)
class BacklogItem:
    run: str
    checkpoint: str
    step: Optional[int]
    state: BacklogState
    age_s: Optional[float]  # since the request was created
    owner: Optional[str] = None
    heartbeat_age_s: Optional[float] = None
    lease_s: Optional[float] = None
    retries: int = 0
    stuck: bool = False  # a stale claim: its owner is gone
    last_error: Optional[str] = None
    metrics: tuple[tuple[str, Any], ...] = ()  # a completed request's receipt metrics, by name
    attempts: tuple[tuple[Optional[int], Optional[float], str], ...] = ()  # failed attempts: (n, when, error)
    kind: str = "validation"  # its backlog: validation, or qc (the heavy QC backlog, docs/qc.md)


@dataclass(frozen=True)
class BacklogSnapshot:
    items: tuple[BacklogItem, ...]
    counts: tuple[tuple[str, int], ...]
    newest_completed: Optional[tuple[str, str, Optional[int]]]  # (run, checkpoint, step)
    eval_lag: Optional[int]
    train_step: Optional[int]
    now: float
    run: Optional[str] = None
    #: the heavy QC backlog beside validation (docs/qc.md), from the index: its requests (kind ``qc``) …
    qc_items: tuple[BacklogItem, ...] = ()
    #: … and (run name, worker-QC report) of each run that requires worker QC (``reader.backlog.worker_qc``)
    worker_qc: tuple[tuple[str, dict], ...] = ()


@dataclass(frozen=True)
class CompareSide:
    label: str
    rows: tuple[tuple[str, str], ...]  # (field, value) for the side-by-side table


@dataclass(frozen=True)
class CompareSnapshot:
    """The Compare screen: the core's result plus rows for display."""

    reference: str
    candidate: str
    threshold_pct: Optional[float]
    result: Optional[str]
    exit_code: int
    reason_code: Optional[str]
    reason: Optional[str]
    rows: tuple[tuple[str, str, str, str], ...]  # (field, reference, candidate, delta)
    diagnoses: tuple[tuple[str, str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    error: Optional[str] = None
    report: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class LogSources:
    """Where the Log screen reads a run's training logs (the one thing watch reads from the run folder)."""

    run_id: int
    name: str
    run_dir: str
    files: tuple[tuple[int, str, str], ...]  # (node, "stdout" | "stderr", path relative to run_dir)
    first_failed: Optional[int] = None  # the rank that failed first: the view opens at its first error line
    single_rank: Optional[int] = None  # a one-process run: its unprefixed lines are this rank's
    live: bool = False  # still running (the view follows new lines)
    missing: bool = False  # the run's folder is gone from disk (the index keeps its rows)


@dataclass(frozen=True)
class DescribeSnapshot:
    """The Describe screen: the run's manifest and final-summary facts as plain values."""

    run_id: int
    name: str
    status: RunStatus
    folder: str
    manifest: Optional[dict] = field(default=None, hash=False)  # the typed manifest as plain values
    declaration: Optional[dict] = field(default=None, hash=False)  # the final summary's run_context.declaration
    environment: Optional[dict] = field(default=None, hash=False)  # the final summary's environment (versions)
    has_summary: bool = False
    duration_s: Optional[float] = None  # the reader's (daemon/views.py run_times), as every surface shows it
