"""The data source of `traceml watch`: the reader's views of the SQLite index, as screen snapshots.

:class:`Source` is the protocol the App depends on (injected through
:func:`traceml_tui.tui.app.create_app`); :class:`IndexSource` implements it
over the daemon's index. It is a thin presenter: the reader
(:mod:`daemon.reader`, :mod:`daemon.views`) computes every figure and decides
every state; this module keeps a per-version cache of what the Runs list
shows and hands views to :mod:`traceml_tui.tui.present`, which lays them out
as the frozen snapshots of :mod:`traceml_tui.tui.snapshots`. Who writes the
index, and the takeover when nobody does, is :mod:`traceml_tui.tui.writer_watch`'s.

Every method runs on a worker thread, never on the UI thread. Refresh cost is
bounded by what is on screen: the Runs list reads one row per run plus, when
the daemon bumped that run's ``updated_version``, its figures and a short
tail of its step-time series; the Run screen reads the run's view and at most
one series per rank. Nothing here reads JSONL or scans run directories. The
clock is injected (``clock``) so that snapshot tests are deterministic.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from daemon import views
from traceml_tui.core.state import LIVE_RUN_STATES, STALL_FLOOR_S, RankState
from traceml_tui.tui import present
from traceml_tui.tui.present import compare_snapshot, run_folder  # noqa: F401 - where callers find them
from traceml_tui.tui.snapshots import (
    BacklogSnapshot,
    DescribeSnapshot,
    LogSources,
    RunDetail,
    RunsSnapshot,
)
from traceml_tui.tui.writer_watch import WriterWatch

TREND_BUCKETS = 16
HEAT_COLUMNS = 64
MAX_ERRORS = 50
MAX_FIELD_EVENTS = 5000
#: Ranks drawn on one chart (the chart's glyphs tell at most this many apart).
MAX_CHART_RANKS = 8
#: The chart the Run screen opens with: step time, every rank.
DEFAULT_CHART: tuple[str, Optional[int]] = ("step_ms", None)


class Source(Protocol):
    """What the App needs from its data source (all calls happen off the UI thread)."""

    def data_version(self) -> int:
        """A cheap number that changes whenever the data changes (-1 when nothing is there yet)."""

    def now(self) -> float:
        """The current time as the snapshots see it (injectable for tests)."""

    def runs(self) -> RunsSnapshot:
        """Every run, one row each."""

    def run_detail(self, run_id: int, runs: Optional[RunsSnapshot] = None,
                   chart: Optional[tuple[str, Optional[int]]] = None) -> Optional[RunDetail]:
        """Everything the Run screen shows for one run (None when the run is gone); ``runs``: a runs snapshot
        just built, reused for the run's own row; ``chart`` = (metric, rank or None for every rank)."""

    def backlog(self, run_id: Optional[int] = None) -> BacklogSnapshot:
        """Validation requests of one run (or of every run)."""

    def summary(self, spec: str) -> tuple[dict, str]:
        """A final summary by path, run directory or run name in the index, and its display label."""

    def log_sources(self, run_id: int) -> Optional[LogSources]:
        """Where the run's training logs are (None when the run is unknown)."""

    def describe(self, run_id: int) -> Optional[DescribeSnapshot]:
        """The run's manifest, guard contract, hygiene block and environment (None when the run is unknown)."""

    def close(self) -> None:
        """Release connections (and stop an embedded ingester)."""


def _serialized(method):
    """Run one source call at a time: the refresh worker's query and ``close`` never overlap (a connection
    closed under a running query crashes SQLite's C code, not just Python)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class IndexSource:
    """:class:`Source` over the daemon's index through :class:`daemon.reader.Reader` (read-only, opened lazily)."""

    def __init__(self, index_path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time,
                 ingester: Any = None, stall_floor_s: float = STALL_FLOOR_S, roots: Optional[list[str]] = None,
                 probe: Optional[Callable[[], Any]] = None,
                 takeover: Optional[Callable[[list[str]], tuple[Any, Any]]] = None,
                 ingest_roots: Optional[list[str]] = None, poll_s: float = 0.5) -> None:
        """``roots`` filter what is shown (the ROOT arguments; None: every run of the index); ``probe``,
        ``takeover``, ``ingest_roots`` (default: ``roots``) and ``poll_s`` are the writer watch's
        (:class:`~traceml_tui.tui.writer_watch.WriterWatch`); ``ingester`` an embedded one this source owns."""
        self.index_path = Path(index_path)
        self.clock = clock
        self.stall_floor_s = stall_floor_s
        self.roots = list(roots) if roots else None
        self._lock = threading.RLock()
        self.writer = WriterWatch(clock=clock, lock=self._lock, ingester=ingester, probe=probe, takeover=takeover,
                                  ingest_roots=list(ingest_roots or roots or ()), poll_s=poll_s)
        self._reader: Any = None
        self._row_cache: dict[int, tuple[int, dict]] = {}  # run_id -> (updated_version, what the row shows)

    @property
    def ingester(self) -> Any:
        """This watch's own ingester (None: another process writes the index, or nobody)."""
        return self.writer.ingester

    @property
    def takeover(self) -> Optional[Callable[[list[str]], tuple[Any, Any]]]:
        """How this watch starts its own ingester when the writer is gone (the writer watch's)."""
        return self.writer.takeover

    @takeover.setter
    def takeover(self, value: Optional[Callable[[list[str]], tuple[Any, Any]]]) -> None:
        self.writer.takeover = value

    def _db(self) -> Any:
        """The reader, or None while the index does not exist (or is not initialised) yet."""
        if self._reader is None:
            if self.writer.closed or not self.index_path.is_file():
                return None
            from daemon.reader import Reader

            try:
                reader = Reader(self.index_path, stall_floor_s=self.stall_floor_s)
                if not reader.ready():
                    reader.close()
                    return None  # created but not initialised yet: try again next poll
            except Exception:  # noqa: BLE001 - an index being created: try again next poll
                return None
            self._reader = reader
        return self._reader

    def now(self) -> float:
        return self.clock()

    def can_take_over(self) -> bool:
        """Whether this source may start its own ingester now (the writer is gone)."""
        return self.writer.can_take_over()

    def take_over(self) -> tuple[str, Optional[int]]:
        """Start this watch's own ingester (on a worker thread; not serialized with refreshes)."""
        return self.writer.take_over()

    @_serialized
    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    @_serialized
    def data_version(self) -> int:
        reader = self._db()
        if reader is None:
            return -1
        try:
            return reader.data_version()
        except Exception:  # noqa: BLE001 - a busy or half-written index: report "nothing new"
            return -1

    # -- runs
    @_serialized
    def runs(self) -> RunsSnapshot:
        now = self.clock()
        reader = self._db()
        if reader is None:
            return RunsSnapshot((), now, -1, index_ready=False, note=f"waiting for the index {self.index_path.name}")
        writer = self.writer.observe(reader, now)
        view = reader.runs_view(roots=self.roots, now=self.writer.decide_at(now))
        rows = []
        for run in view.runs:
            cached = self._row_cache.get(run.run_id)
            if cached is None or cached[0] != run.version:
                cached = self._row_cache[run.run_id] = (run.version, self._run_parts(reader, run))
            parts = cached[1]
            rows.append(present.run_row(run, parts["figures"], workload=parts["workload"], trend=parts["trend"],
                                        backlog=view.outstanding(run.run_id)))
        rows.sort(key=lambda r: (-(r.last_ts or 0.0), r.name))
        # wall clock: the progress row's age says whether its ingester still runs
        indexing = view.indexing.text() if view.indexing is not None else None
        health = self.writer.health(writer, view.runs, now)
        return RunsSnapshot(tuple(rows), now, view.version, indexing=indexing,
                            note=None if rows else indexing or present.empty_note(health), health=health)

    @staticmethod
    def _run_parts(reader: Any, run: Any) -> dict[str, Any]:
        """What a run's row shows that only changes when the run's data changes (cached on its version)."""
        manifest = reader.files.manifest(run.run_id, run.version)
        ranks = [rank for rank, _ in run.rank_states]
        trend = reader.series.tail(run.run_id, ranks[0], "step_ms", TREND_BUCKETS) if ranks else ()
        return {"workload": manifest.workload if manifest else None, "trend": trend, "figures": reader.figures(run)}

    # -- one run
    @_serialized
    def run_detail(self, run_id: int, runs: Optional[RunsSnapshot] = None,
                   chart: Optional[tuple[str, Optional[int]]] = None) -> Optional[RunDetail]:
        reader = self._db()
        if reader is None:
            return None
        now = self.clock()
        row = next((r for r in (runs or self.runs()).rows if r.run_id == run_id), None)
        if row is None:
            return None
        self.writer.observe(reader, now)
        view = reader.run_view(run_id, now=self.writer.decide_at(now))
        if view is None:
            return None
        ranks = [r.rank for r in view.ranks]
        step_series = [reader.series.points(run_id, rank, "step_ms") for rank in ranks]
        fig = view.figures
        loss_ratio = train = None
        if ranks:
            if fig.ratio_name is not None:
                loss_ratio = present.points_series(fig.ratio_name,
                                                   reader.series.points(run_id, ranks[0], "ratio/" + fig.ratio_name))
            train = present.points_series("train loss", reader.series.points(run_id, ranks[0], "loss"))
        chart_metric, chart_rank = chart or DEFAULT_CHART
        shown = [r for r in ranks if chart_rank is None or r == chart_rank]
        if (chart_metric, chart_rank) == DEFAULT_CHART:
            chosen = tuple(present.points_series(f"rank {r}", s) for r, s in zip(ranks, step_series))
        else:
            chosen = tuple(present.points_series(f"rank {r}", reader.series.points(run_id, r, chart_metric))
                           for r in shown[:MAX_CHART_RANKS])
        heat, heat_steps = views.heatmap(step_series, HEAT_COLUMNS)
        manifest = view.manifest
        return RunDetail(
            run=row, ranks=tuple(present.rank_row(r, now, row.quiet_ranks) for r in view.ranks),
            step_time=tuple(present.points_series(f"rank {r}", s) for r, s in zip(ranks, step_series)),
            loss_ratio=loss_ratio, ratio_name=fig.ratio_name,
            train_metric=train if train is not None and train.x else None, eval_metric_name=view.eval_metric,
            evals=view.evals, heatmap=heat, heat_steps=heat_steps,
            nodes=present.nodes(reader.series.node_samples(run_id, limit=1)), outcomes=present.outcomes(view.outcomes),
            errors=tuple(reversed(reader.events.errors(run_id, limit=MAX_ERRORS))),
            fields=present.field_verdicts(reader.events.recent(run_id, kind="field_stats", limit=MAX_FIELD_EVENTS)),
            now=now, failure=view.failure, metrics=view.metrics, chart_metric=chart_metric, chart_rank=chart_rank,
            chart=chosen, started_at=manifest.started_at if manifest else None,
            ended_at=manifest.ended_at if manifest else None, eta_s=fig.eta_s,
            early_stopping=present.early_stopping_info(fig.early_stopping), diagnosis=view.diagnosis,
            verdict=view.verdict)

    # -- backlog
    @_serialized
    def backlog(self, run_id: Optional[int] = None) -> BacklogSnapshot:
        now = self.clock()
        reader = self._db()
        if reader is None:
            return BacklogSnapshot((), (), None, None, None, now)
        view = reader.backlog_view(run_id, now=now)
        return BacklogSnapshot(tuple(present.backlog_item(run, b, now) for run, b in view.items), view.counts,
                               view.newest_completed, view.eval_lag, view.train_step, now, run=view.run,
                               qc_items=tuple(present.backlog_item(run, b, now, "qc") for run, b in view.qc_items),
                               worker_qc=view.worker_qc)

    # -- compare
    @_serialized
    def summary(self, spec: str) -> tuple[dict, str]:
        from traceml_tui.compare.load import parse_summary_bytes, read_summary
        from traceml_tui.core.rundir import SUMMARY_JSON, RunDir

        path = Path(spec)
        if path.is_dir():
            path = RunDir(path).summary_json
        if path.is_file():
            return read_summary(path), path.parent.name if path.name == SUMMARY_JSON else path.name
        reader = self._db()
        run = reader.find_run(spec) if reader is not None else None
        if run is not None:
            content = reader.files.summary_bytes(run.run_id)
            if content is not None:
                return parse_summary_bytes(content), run.name
        raise FileNotFoundError(f"no final summary for {spec!r} (not a file, a run directory, or a run in the index)")

    # -- log view and describe (read on the Log / Describe screens' own workers)
    @_serialized
    def log_sources(self, run_id: int) -> Optional[LogSources]:
        reader = self._db()
        if reader is None:
            return None
        run = reader.run(run_id, now=self.clock())
        run_dir, files = reader.files.logs(run_id)
        if run is None or not run_dir:
            return None
        failure = reader.files.failure(run_id)
        single = run.world_size == 1 or (run.world_size is None and run.ranks == 1)
        return LogSources(run_id=run_id, name=run.name, run_dir=run_dir,
                          files=tuple((f.node, f.stream, f.rel) for f in files),
                          first_failed=failure.rank if failure is not None else run.first_failed,
                          single_rank=(run.ranks_in(*RankState)[:1] or (0,))[0] if single else None,
                          live=run.status in LIVE_RUN_STATES, missing=run.missing)

    @_serialized
    def describe(self, run_id: int) -> Optional[DescribeSnapshot]:
        reader = self._db()
        run = reader.run(run_id, now=self.clock()) if reader is not None else None
        if run is None:
            return None
        return present.describe_snapshot(run, reader.files.manifest(run_id), reader.files.summary_bytes(run_id))
