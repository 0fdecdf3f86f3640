"""Read-only API over the index: the read side's entrance, whose rooms are the only code that reads it with SQL.

Every method returns frozen dataclasses with states already decided by
:mod:`traceml_tui.core.state` (no Textual, no SQLite rows), and costs what it
returns: aggregates and downsampled series were computed at ingest time
(:mod:`daemon.live`). :meth:`Reader.data_version` is one primary-key lookup,
cheap enough to poll several times a second; when it moved,
:meth:`Reader.changes_since` names the runs that changed.

The reader holds the connection, the versions, the run list and one run, and
the views' entry points; what it reads is split into rooms by what they read
(docs/daemon.md, "Reader API"), reached as attributes:

* ``reader.series`` (:mod:`daemon.read_series`) — series, their newest buckets, node samples, step rows;
* ``reader.backlog`` (:mod:`daemon.read_backlog`) — the validation and QC backlogs, eval freshness, early stopping;
* ``reader.events`` (:mod:`daemon.read_events`) — events, ingest errors, dark streams, hang records;
* ``reader.files`` (:mod:`daemon.read_files`) — the manifest, the final summary, outcomes, log paths;
* the runs room (:mod:`daemon.read_runs`) decides each run's word behind :meth:`Reader.list_runs`.

``traceml status``, ``traceml watch`` and its alerts all read runs through
:meth:`Reader.list_runs`, so they show the same word for the same run; they
read a run's figures (step time, Δ, straggler, steps/s, eval lag, the
early-stopping best) from the views of :mod:`daemon.views`
(:meth:`Reader.runs_view`, :meth:`Reader.figures`, :meth:`Reader.run_view`,
:meth:`Reader.backlog_view`), so they show the same number too.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from traceml_tui.core import artifacts, freshness
from traceml_tui.core.rundir import QC_BACKLOG
from traceml_tui.core.state import BACKLOG_ORDER, STALL_FLOOR_S, BacklogState, summary_is_current

from . import index as idx
from . import views
from .read_backlog import BacklogItem, BacklogReader
from .read_events import Event, EventsReader, IngestError
from .read_files import FilesReader, LogFile, Outcome
from .read_query import fetch, num
from .read_runs import RankRow, RunsReader, RunSummary
from .read_series import NodeSample, Series, SeriesPoint, SeriesReader

# The rooms' types are the reader's API (docs/contracts.md, "reader API"): importable from here.
__all__ = [
    "BacklogItem", "Changes", "Event", "IndexVersionError", "IngestError", "IngestProgress", "LogFile", "NodeSample",
    "Outcome", "RankRow", "Reader", "RunDetail", "RunSummary", "Series", "SeriesPoint",
]


@dataclass(frozen=True)
class RunDetail:
    """Everything the Run screen shows above its charts."""

    run: RunSummary
    ranks: tuple[RankRow, ...]
    outcomes: tuple[Outcome, ...]
    manifest: Optional[artifacts.Manifest]
    summary_status: Optional[str]
    nodes: tuple[int, ...]
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class Changes:
    """The index's data version and the runs updated after the version asked about."""

    version: int
    run_ids: tuple[int, ...]


def _count(n: float) -> str:
    """3.2 M, 850 k, 412: a record count for a one-line progress."""
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    if n >= 1e4:
        return f"{n / 1e3:.0f} k"
    return f"{n:,.0f}"


@dataclass(frozen=True)
class IngestProgress:
    """A large backlog the ingester is reading (a first launch): ``meta.ingest_progress``.

    ``records_total`` and ``eta_s`` are estimates (None until the first batch is in): the bytes left at
    the mean size of the records read so far.
    """

    files_done: int
    files_total: int
    records_done: int
    records_total: Optional[int]
    records_per_s: float
    eta_s: Optional[float]
    updated: float
    done: bool = False

    def text(self) -> str:
        """``indexing 3.2 M / 8.0 M records · 40 s left`` (``indexed 8.0 M records`` once done)."""
        if self.done:
            return f"indexed {_count(self.records_done)} records"
        total = f" / {_count(self.records_total)}" if self.records_total else ""
        left = f" · {self.eta_s:.0f} s left" if self.eta_s is not None else ""
        return f"indexing {_count(self.records_done)}{total} records{left}"


#: The newest evaluations a run view charts (``eval`` records; receipts come with the backlog).
MAX_EVALS = 500

#: A progress row older than this was left by an ingester that stopped mid-backlog: not shown.
PROGRESS_STALE_S = 60.0



#: The newest evaluations a run view charts (``eval`` records; receipts come with the backlog).
MAX_EVALS = 500

#: A progress row older than this was left by an ingester that stopped mid-backlog: not shown.
PROGRESS_STALE_S = 60.0


class IndexVersionError(RuntimeError):
    """The index's schema is not the one this traceml reads; ``str()`` says what to do in one line."""


class Reader:
    """Read-only access to one index file.

    ``stall_floor_s`` is the least silence (seconds) after which a rank that
    has not ended counts as stalled (``traceml status --stall-after``); the
    rest of the rule is :func:`traceml_tui.core.state.stall_limit_s`.
    Raises ``FileNotFoundError`` when the index does not exist yet and
    :class:`IndexVersionError` when it was written by an older or newer
    traceml (a writer upgrades an older one on open).

    Its rooms (module docstring): ``series``, ``backlog``, ``events``, ``files``.
    """

    def __init__(self, index_path: str | os.PathLike[str], stall_floor_s: float = STALL_FLOOR_S):
        self.index_path = str(index_path)
        if not Path(self.index_path).is_file():
            raise FileNotFoundError(self.index_path)
        self.conn = idx.connect_reader(self.index_path)
        self.stall_floor_s = stall_floor_s
        version = self._rows("SELECT value FROM meta WHERE key = 'schema_version'")
        if version and str(version[0][0]) != str(idx.SCHEMA_VERSION):
            self.conn.close()
            newer = int(version[0][0]) > idx.SCHEMA_VERSION
            raise IndexVersionError(
                f"the index {self.index_path} has schema version {version[0][0]}; this traceml reads "
                f"{idx.SCHEMA_VERSION}: " + ("use a newer traceml or another --index" if newer else
                                             "run `traceml daemon ROOT --once` (or `traceml watch`) to upgrade it"))
        columns = {t: idx.table_columns(self.conn, t) for t, _, _ in idx.ADDED_COLUMNS}
        lacking = [f"{t}.{c}" for t, c, _ in idx.ADDED_COLUMNS if columns[t] and c not in columns[t]]
        if lacking:  # written by this version before these columns were added; the writer adds them on open
            self.conn.close()
            raise IndexVersionError(
                f"the index {self.index_path} lacks {', '.join(lacking)}: run `traceml daemon ROOT --once`"
                " (or `traceml watch`) to upgrade it")
        rows = functools.partial(fetch, self.conn)
        self.series = SeriesReader(rows)
        self.events = EventsReader(rows)
        self.files = FilesReader(rows)
        self.backlog = BacklogReader(rows, self.files.manifest)
        self._runs = RunsReader(rows, stall_floor_s, self.events.current_hangs, self.backlog.blocked,
                                self.files.manifest)

    def close(self) -> None:
        """Close the connection (the reader and its rooms read nothing after)."""
        self.conn.close()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _rows(self, sql: str, params=()) -> list:
        return fetch(self.conn, sql, params)

    def ready(self) -> bool:
        """True once the writer has created the schema."""
        return bool(self._rows("SELECT v FROM version WHERE id = 1"))

    # ------------------------------------------------------------------ versions
    def data_version(self) -> int:
        """Monotonic counter bumped by every committed ingest batch."""
        rows = self._rows("SELECT v FROM version WHERE id = 1")
        return int(rows[0][0]) if rows else 0

    def last_commit(self) -> Optional[float]:
        """When the writer last committed a change to any run (its wall clock), or None before the first."""
        rows = self._rows("SELECT max(last_change) FROM runs")
        return num(rows[0][0]) if rows else None

    def changes_since(self, version: int) -> Changes:
        """The current version and the runs updated after ``version``."""
        current = self.data_version()
        ids = [r[0] for r in self._rows("SELECT run_id FROM runs WHERE updated_version > ? ORDER BY run_id", (version,))]
        return Changes(current, tuple(ids))

    def ingest_progress(self, now: Optional[float] = None) -> Optional[IngestProgress]:
        """The backlog being indexed now, or None (none, finished, or left by a stopped ingester)."""
        rows = self._rows("SELECT value FROM meta WHERE key = 'ingest_progress'")
        if not rows:
            return None
        try:
            d = json.loads(rows[0][0])
            p = IngestProgress(**{k: d[k] for k in IngestProgress.__dataclass_fields__})
        except (ValueError, TypeError, KeyError):
            return None
        now = time.time() if now is None else now
        if p.done or now - p.updated > PROGRESS_STALE_S:
            return None
        return p

    # ------------------------------------------------------------------ runs (daemon/read_runs.py)
    def list_runs(self, roots: Optional[list[str]] = None, now: Optional[float] = None) -> tuple[RunSummary, ...]:
        """All runs (optionally only those under ``roots``), most recently active first, with states decided."""
        return self._runs.all(roots, time.time() if now is None else now)

    def run(self, run_id: int, now: Optional[float] = None) -> Optional[RunSummary]:
        """One run's summary, or None."""
        return self._runs.one(run_id, time.time() if now is None else now)

    def find_run(self, name_or_dir: str, now: Optional[float] = None) -> Optional[RunSummary]:
        """A run by directory or by name (the newest with that name), its states decided at ``now``."""
        real = os.path.realpath(name_or_dir)
        runs = self.list_runs(now=now)
        for run in runs:
            if run.dir == real:
                return run
        for run in runs:
            if run.name == name_or_dir:
                return run
        return None

    def rank_rows(self, run_id: int, now: Optional[float] = None) -> tuple[RankRow, ...]:
        """Per (rank, attempt) rows, ordered by rank then attempt; the newest attempt carries the state."""
        return self._runs.attempts(run_id, self.run(run_id, now))

    def run_detail(self, run_id: int, now: Optional[float] = None) -> Optional[RunDetail]:
        """Summary, rank rows, outcomes, manifest and the metric names with series."""
        now = time.time() if now is None else now
        run = self.run(run_id, now)
        if run is None:
            return None
        return RunDetail(run, self.rank_rows(run_id, now), self.files.outcomes(run_id),
                         self.files.manifest(run_id, run.version), self.files.summary_status(run_id),
                         self.files.nodes(run_id), self.series.metrics(run_id))

    # ------------------------------------------------------------------ views (daemon/views.py)
    def runs_view(self, roots: Optional[list[str]] = None, now: Optional[float] = None) -> views.RunsView:
        """Every run (optionally only those under ``roots``) with its states and step-time figures decided."""
        version = self.data_version()
        return views.RunsView(runs=self.list_runs(roots, now), version=version,
                              backlog_outstanding=tuple(sorted(self.backlog.outstanding().items())),
                              indexing=self.ingest_progress())

    def figures(self, run: RunSummary, now: Optional[float] = None,
                backlog: Optional[tuple[BacklogItem, ...]] = None) -> views.RunFigures:
        """The figures every surface shows for ``run`` (a few queries: the caller caches them per run version)."""
        backlog = self.backlog.entries(run.run_id, now=now) if backlog is None else backlog
        eval_step = self.backlog.newest_evaluated_step(run.run_id)
        manifest = self.files.manifest(run.run_id, run.version)
        early = views.early_stopping(self.files.validation(run.run_id), manifest, backlog,
                                     self.backlog.early_stopping(run.run_id))
        declared = manifest.last_step_ahead(run.last_step) if manifest is not None else None
        ratio_name, loss_ratio = views.worst_ratio(self._runs.latest_ratios(run.run_id))
        return views.RunFigures(
            statistic=run.step_statistic.text, step_statistic=run.step_statistic, step_ms=run.step_ms,
            slowest_rank=run.slowest_rank,
            straggler_score=run.straggler_score, straggler_pct=run.straggler_pct, straggler=run.straggler,
            steps_per_s=run.steps_per_s, examples_per_s=run.examples_per_s, eval_step=eval_step,
            eval_lag=freshness.eval_lag(run.last_step, eval_step), early_stopping=early, declared_steps=declared,
            eta_s=views.eta_s(run.status, run.last_step, declared, run.steps_per_s), ratio_name=ratio_name,
            loss_ratio=loss_ratio)

    def rank_views(self, run: RunSummary, rows: tuple[RankRow, ...]) -> tuple[views.RankView, ...]:
        """The newest attempt of each rank with its step time and Δ against the median rank (core/straggler.py), by
        the run's statistic (``run.step_statistic``): the rolling median, or the current final summary's per-rank
        means, input wait and parts over its analysis window."""
        window = self._runs.window(run)
        values = dict(run.rank_step_ms)
        spread = views.step_statistic(run.rank_step_ms, window)[2]

        def step_ms(r: RankRow) -> Optional[float]:
            return values.get(r.rank) if r.rank in values else r.median_step_ms

        return tuple(views.RankView(
            rank=r.rank, attempt=r.attempt, node=r.node, state=r.state, records=r.records, last_step=r.last_step,
            last_ts=r.last_ts, last_seen=r.last_seen, step_ms=step_ms(r),
            delta_pct=spread.delta_pct(step_ms(r)) if spread is not None else None,
            input_wait_ms=r.median_input_wait_ms if window is None else window.value(r.rank, "input_wait_ms"),
            steps_per_s=r.steps_per_s, examples_per_s=r.examples_per_s, loss=r.loss, ratios=r.ratios, ended=r.ended,
            exit_code=r.exit_code, parts=r.step_parts if window is None else views.summary_parts(window, r.rank))
            for r in rows if r.latest)

    def run_view(self, run_id: int, now: Optional[float] = None) -> Optional[views.RunView]:
        """One run as every surface shows it (None when the index does not hold it)."""
        now = time.time() if now is None else now
        detail = self.run_detail(run_id, now)
        if detail is None:
            return None
        backlog = self.backlog.entries(run_id, now=now)
        current = summary_is_current(detail.run.manifest_status)
        content = self.files.summary_bytes(run_id) if current else None
        summary = artifacts.decode_summary(content) if content is not None else None
        ranks = self.rank_views(detail.run, detail.ranks)
        figures = self.figures(detail.run, now, backlog)
        preferred = figures.early_stopping.metric if figures.early_stopping is not None else None
        evals, eval_metric = views.eval_points(self.events.recent(run_id, kind="eval", limit=MAX_EVALS), backlog,
                                             preferred)
        failure = views.recorded_failure(summary.failure if summary is not None else None)
        return views.RunView(
            run=detail.run, figures=figures, ranks=ranks, attempts=detail.ranks, outcomes=detail.outcomes,
            manifest=detail.manifest, summary_status=detail.summary_status, nodes=detail.nodes,
            metrics=detail.metrics, backlog=backlog, failure=failure or views.inferred_failure(detail.run, ranks),
            diagnosis=views.diagnosis_line(summary), evals=evals, eval_metric=eval_metric,
            verdict=views.diagnosis(summary))

    def backlog_view(self, run_id: Optional[int] = None, now: Optional[float] = None) -> views.BacklogView:
        """The validation backlog of one run (or of every run), with the newest completed checkpoint and its lag, and
        the heavy QC backlog beside it: its entries and each run's worker-QC report (docs/qc.md)."""
        now = time.time() if now is None else now
        runs = self.list_runs(now=now)
        if run_id is not None:
            runs = tuple(r for r in runs if r.run_id == run_id)
        items: list[tuple[str, BacklogItem]] = []
        qc_items: list[tuple[str, BacklogItem]] = []
        worker_qc: list[tuple[str, dict]] = []
        newest = lag = train_step = None
        for run in sorted(runs, key=lambda r: r.name):
            run_items = self.backlog.entries(run.run_id, now=now)
            items += [(run.name, b) for b in run_items]
            qc_entries = self.backlog.entries(run.run_id, now=now, kind=QC_BACKLOG)
            qc_items += [(run.name, b) for b in qc_entries]
            if (report := self.backlog.worker_qc(run.run_id, now, qc_entries)) is not None:
                worker_qc.append((run.name, report))
            best = freshness.newest(freshness.Evaluated(b.step, b.checkpoint) for b in run_items
                                    if b.state is BacklogState.COMPLETED and b.step is not None)
            if best is not None:
                if newest is None or best.step > (newest[2] or 0):
                    newest = (run.name, best.checkpoint, best.step)
                    if run.last_step is not None:
                        train_step, lag = run.last_step, freshness.eval_lag(run.last_step, best.step)
            elif run.last_step is not None and run_id is not None:
                train_step = run.last_step
        counts = tuple((state, n) for state in BACKLOG_ORDER if (n := sum(1 for _, b in items if b.state is state)))
        return views.BacklogView(tuple(items), counts, newest, lag, train_step,
                                 run=runs[0].name if run_id is not None and runs else None,
                                 qc_items=tuple(qc_items), worker_qc=tuple(worker_qc))
