"""The data source of `traceml watch`: the SQLite index, read-only, as snapshots.

:class:`Source` is the protocol the App depends on (injected through
:func:`traceml_tui.tui.app.create_app`); :class:`IndexSource` implements it
over the daemon's index. Every method runs on the refresh worker's thread,
never on the UI thread, and returns frozen dataclasses from
:mod:`traceml_tui.tui.snapshots`.

Refresh cost is bounded by what is on screen: the Runs list reads one row per
run plus a short tail of each run's downsampled series (cached per run until
the daemon bumps that run's ``updated_version``); the Run screen reads the
run's per-rank aggregates and at most ``SERIES_POINTS`` buckets per rank.
Nothing here reads JSONL or scans run directories.

The clock is injected (``clock``) so that snapshot tests are deterministic.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from daemon import writer_health
from daemon.writer_health import WriterHealth
from traceml_tui.core import forensics, freshness, steptime
from traceml_tui.core.artifacts import EarlyStoppingBlock, decode_lenient
from traceml_tui.core.freshness import eval_lag
from traceml_tui.core.state import (
    LIVE_RUN_STATES,
    STALL_FLOOR_S,
    BacklogState,
    RankState,
    RunStatus,
    commit_overdue,
    count_states,
)
from traceml_tui.tui.snapshots import (
    BACKLOG_STATES,
    WRITER_EMBEDDED,
    WRITER_NONE,
    BacklogItem,
    BacklogSnapshot,
    CompareSnapshot,
    DescribeSnapshot,
    EarlyStoppingInfo,
    EvalPoint,
    FailureInfo,
    FieldVerdict,
    LogSources,
    NodeMetrics,
    Outcome,
    RankRow,
    RunDetail,
    RunRow,
    RunsSnapshot,
    Series,
    SourceHealth,
)

TREND_BUCKETS = 16
HEAT_COLUMNS = 64
MAX_EVALS = 500
MAX_ERRORS = 50
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
        """Everything the Run screen shows for one run (None when the run is gone).

        ``runs`` is a runs snapshot just built, reused for the run's own row;
        ``chart`` = (metric, rank or None for every rank) of the chosen chart.
        """

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


# --------------------------------------------------------------------------- pure helpers


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def worst_ratio(ratios: Any) -> tuple[Optional[str], Optional[float]]:
    """The loss component with the highest scale-free ratio (1.0 = no skill): the one to watch."""
    if not isinstance(ratios, dict):
        return None, None
    best = (None, None)
    for name, value in ratios.items():
        v = _num(value)
        if v is not None and (best[1] is None or v > best[1]):
            best = (str(name), v)
    return best


def _heatmap(step_series: list[Series], columns: int) -> tuple[tuple[tuple[Optional[float], ...], ...], tuple[int, int]]:
    """Rank × step-bucket matrix of step time / median across ranks in the same bucket."""
    xs = [x for s in step_series for x in s.x]
    if not xs:
        return (), (0, 0)
    lo, hi = min(xs), max(xs)
    span = max(1.0, hi - lo)
    cols = max(1, min(columns, len({int(x) for x in xs})))
    grid: list[list[list[float]]] = [[[] for _ in range(cols)] for _ in step_series]
    for r, s in enumerate(step_series):
        for x, y in zip(s.x, s.y):
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


def compare_snapshot(reference: dict, candidate: dict, threshold_pct: Optional[float],
                     labels: tuple[str, str]) -> CompareSnapshot:
    """Run the same comparison core as `traceml compare` and lay its report out for the screen."""
    from traceml_tui.compare.core import compare_summaries
    from traceml_tui.compare.render_text import fmt_value, steps_text
    from traceml_tui.tui.textplot import fmt_num

    res = compare_summaries(reference, candidate, threshold_pct, labels=labels)
    rep = res.report
    rows: list[tuple[str, str, str, str]] = []

    def pct(v: Any) -> str:
        return "" if v is None else f"{v:+.1f}%"

    ref_info, cand_info = rep.get("reference") or {}, rep.get("candidate") or {}

    def decl(info: dict) -> str:
        d = info.get("declaration")
        if isinstance(d, dict):
            wl = d.get("workload") if isinstance(d.get("workload"), dict) else {}
            m = d.get("measurement") if isinstance(d.get("measurement"), dict) else {}
            name = wl.get("name", "?")
            if m:
                return f"{name} {steps_text(m)}"  # as `traceml compare` prints the window
            return str(name)
        return info.get("declaration_problem") or "–"

    def topo(info: dict) -> str:
        t = info.get("topology")
        return f"{t['nodes']}×{t['processes_per_node']} (world {t['world_size']})" if t else "–"

    rows.append(("Run", str(ref_info.get("run_name") or labels[0]), str(cand_info.get("run_name") or labels[1]), ""))
    rows.append(("Status", str(ref_info.get("run_status") or "–"), str(cand_info.get("run_status") or "–"), ""))
    rows.append(("Declaration", decl(ref_info), decl(cand_info), ""))
    rows.append(("Topology", topo(ref_info), topo(cand_info), ""))
    st = rep.get("step_time") or {}
    rows.append((f"Step time ({st.get('clock') or '?'} clock) ms", fmt_num(st.get("reference")),
                 fmt_num(st.get("candidate")), pct(st.get("pct_change"))))
    rows.append(("Steps analyzed", str(st.get("reference_steps_analyzed") or "–"),
                 str(st.get("candidate_steps_analyzed") or "–"), ""))
    for row in ((rep.get("phases") or {}).get("rows") or {}).values():
        if row.get("reference") is None and row.get("candidate") is None:
            continue
        rows.append((f"  {row['label']} ms", fmt_num(row.get("reference")), fmt_num(row.get("candidate")),
                     pct(row.get("pct_change"))))
    for section in ("memory", "system"):
        for row in (rep.get(section) or {}).values():
            if row.get("reference") is None and row.get("candidate") is None:
                continue
            unit = row.get("unit") or ""  # in the units `traceml compare` prints (MiB, GiB, %)
            rows.append((row["label"], fmt_value(row.get("reference"), unit), fmt_value(row.get("candidate"), unit),
                         pct(row.get("pct_change"))))
    ref_ratio = _training_ratio(reference)
    cand_ratio = _training_ratio(candidate)
    if ref_ratio is not None or cand_ratio is not None:
        rows.append(("Loss ratio (1.0 = no skill)", fmt_num(ref_ratio), fmt_num(cand_ratio), ""))
    diags = []
    for name, d in (rep.get("diagnoses") or {}).items():
        if d.get("reference") or d.get("candidate"):
            diags.append((name, str(d.get("reference") or "–"), str(d.get("candidate") or "–")))
    return CompareSnapshot(
        reference=labels[0], candidate=labels[1], threshold_pct=threshold_pct, result=res.result,
        exit_code=res.exit_code, reason_code=res.reason_code, reason=res.reason, rows=tuple(rows),
        diagnoses=tuple(diags), warnings=tuple(rep.get("warnings") or ()), report=rep,
    )


def _training_ratio(summary: dict) -> Optional[float]:
    """Worst recent scale-free loss ratio from our own ``training`` section (None for other summaries)."""
    from traceml_tui.core.artifacts import decode_summary

    typed = decode_summary(summary)
    return typed.training.worst_ratio[1] if typed is not None and typed.training is not None else None


# --------------------------------------------------------------------------- the index adapter


def _serialized(method):
    """Run one source call at a time: the refresh worker's query and ``close`` never overlap (a connection
    closed under a running query crashes SQLite's C code, not just Python)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class IndexSource:
    """:class:`Source` over the daemon's index through :class:`daemon.reader.Reader` (read-only, opened lazily).

    The reader holds every SQL statement and decides every state word; this
    class only lays its results out as screen snapshots.
    """

    def __init__(self, index_path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time,
                 ingester: Any = None, stall_floor_s: float = STALL_FLOOR_S, roots: Optional[list[str]] = None,
                 probe: Optional[Callable[[], Any]] = None,
                 takeover: Optional[Callable[[list[str]], tuple[Any, Any]]] = None,
                 ingest_roots: Optional[list[str]] = None, poll_s: float = 0.5) -> None:
        """``roots`` filter what is shown (the ROOT arguments; None: every run of the index). ``probe()``
        says who holds the writer lock (a ``daemon.lock.DaemonInfo`` or None); without it the source
        reports no health. ``takeover(roots)`` starts this watch's own ingester when the writer is gone and
        returns ``(ingester, None)``, or ``(None, info)`` of a writer that won the race; ``ingest_roots``
        are the roots it indexes (not indexed by the writer: the header says so); ``poll_s`` the poll
        interval the commit-age warning counts in."""
        self.index_path = Path(index_path)
        self.clock = clock
        self.stall_floor_s = stall_floor_s
        self.roots = list(roots) if roots else None
        self.probe = probe
        self.takeover = takeover
        self.ingest_roots = [os.path.realpath(r) for r in (ingest_roots or roots or ())]
        self.poll_s = poll_s
        self._coverage = writer_health.Coverage()  # when this watch's roots were last indexed; the writer's roots
        self._ingester_started: Optional[float] = None  # when this source took over (None: given an ingester)
        self._taking_over = False
        self._lock = threading.RLock()
        self._closed = False  # after close() the index is never reopened (a late refresh gets "no index")
        self.ingester = ingester  # an embedded daemon.service.Ingester we own (stopped on close)
        self._reader: Any = None
        self._row_cache: dict[int, tuple[int, dict]] = {}  # run_id -> (updated_version, cached parts)

    # -- plumbing
    def _db(self) -> Any:
        """The reader, or None while the index does not exist (or is not initialised) yet."""
        if self._reader is None:
            if self._closed or not self.index_path.is_file():
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

    # -- the writer (the facts are daemon.writer_health's; this source only remembers its looks)
    def _writer(self, reader: Any, now: float) -> WriterHealth:
        """Who writes the index now — this watch's own ingester first, else whoever holds the lock — and whether
        it indexes this watch's roots, caught up (remembered in ``_coverage``)."""
        last = reader.last_commit()
        if self.ingester is not None:
            health = writer_health.embedded(os.getpid(), self.ingest_roots, self._ingester_started, last, now)
        else:
            info = self.probe() if self.probe is not None else None
            health = writer_health.of_holder(info, last, now, self.ingest_roots)
        self._coverage.observe(health, now)
        return health

    def can_take_over(self) -> bool:
        """Whether this source may start its own ingester now (it has roots, a way to, and none running)."""
        return (self.takeover is not None and not self._closed and self.ingester is None
                and not self._taking_over and bool(self.ingest_roots))

    def take_over(self) -> tuple[str, Optional[int]]:
        """Start this watch's own ingester (the writer is gone); returns (who writes now, its pid).

        It indexes this watch's roots and those of the writer that left (another watch on other roots would
        else find its runs frozen). Called on a worker thread, never the UI's: opening the index and loading
        the ingester's state take a while, and refreshes go on meanwhile (not serialized with them). A writer
        that took the lock first is joined instead. Raises what the ingester raises (the App says so).
        """
        if not self.can_take_over():
            return WRITER_EMBEDDED if self.ingester is not None else WRITER_NONE, None
        roots = self._coverage.takeover_roots(self.ingest_roots)
        self._taking_over = True
        started = self.clock()
        try:
            ingester, running = self.takeover(roots)
        finally:
            self._taking_over = False
        if ingester is not None:
            with self._lock:
                if self._closed:  # closed while it started: nobody would stop it
                    ingester.stop()
                    return WRITER_NONE, None
                self.ingester = ingester
                self._ingester_started = started
            return WRITER_EMBEDDED, os.getpid()
        return writer_health.kind_of(running), running.pid

    def _health(self, writer: WriterHealth, summaries: Any, now: float) -> Optional[SourceHealth]:
        if self.probe is None and self.ingester is None:
            return None  # a plain reader: who writes is not known
        age = None if writer.last_commit is None else max(0.0, now - writer.last_commit)
        live = [r.median_interval_s for r in summaries if r.status is RunStatus.RUNNING]
        return SourceHealth(
            writer=writer.writer, pid=writer.pid, commit_age_s=age,
            overdue=writer.running and commit_overdue(age, self.poll_s, live),
            stale_since=self._coverage.covered_at if self._coverage.frozen else None, unwatched=writer.unwatched,
            taking_over=not writer.running and self._taking_over)

    @_serialized
    def close(self) -> None:
        self._closed = True
        if self.ingester is not None:
            try:
                self.ingester.stop()
            finally:
                self.ingester = None
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
        version = reader.data_version()
        writer = self._writer(reader, now)
        summaries = reader.list_runs(roots=self.roots, now=self._coverage.decide_at(now))
        backlog = reader.backlog_outstanding()
        rows = []
        for run in summaries:
            rid = run.run_id
            cached = self._row_cache.get(rid)
            if cached is None or cached[0] != run.version:
                parts = self._run_parts(reader, run)
                self._row_cache[rid] = (run.version, parts)
            else:
                parts = cached[1]
            eval_step = parts["eval_step"]
            step = run.last_step
            rows.append(RunRow(
                run_id=rid, name=run.name, status=str(run.status), silent_ranks=run.silent_ranks,
                explaining_ranks=run.explaining_ranks, lost_nodes=run.lost_nodes,
                first_failed=_first_failed(run),
                workload=parts["workload"], nodes=run.nnodes,
                procs_per_node=run.nproc_per_node or (run.ranks or None),
                step=step, declared_steps=parts["manifest"].last_step_ahead(step) if parts["manifest"] else None,
                median_step_ms=parts["median_step_ms"],
                trend=parts["trend"], steps_per_s=run.steps_per_s, examples_per_s=run.examples_per_s,
                loss_ratio=worst_ratio(parts["ratios"])[1], eval_step=eval_step,
                eval_lag=eval_lag(step, eval_step),
                backlog=backlog.get(rid, 0), errors=run.errors or 0, last_ts=run.last_ts,
                folder=run_folder(run.dir, run.root, run.name), dir=run.dir,
                slowest_rank=run.slowest_rank, straggler_score=run.straggler_score,
            ))
        rows.sort(key=lambda r: (-(r.last_ts or 0.0), r.name))
        progress = reader.ingest_progress()  # wall clock: the row's age says whether its ingester still runs
        indexing = progress.text() if progress is not None else None
        health = self._health(writer, summaries, now)
        return RunsSnapshot(tuple(rows), now, version, indexing=indexing,
                            note=None if rows else indexing or _empty_note(health), health=health)

    def _run_parts(self, reader: Any, run: Any) -> dict[str, Any]:
        """Per-run facts that only change when the run's data changes (cached on its version)."""
        manifest = reader.manifest(run.run_id, run.version)
        latest = [r for r in reader.rank_rows(run.run_id) if r.latest]
        timed = sorted(r.median_step_ms for r in latest if r.median_step_ms is not None)
        trend = reader.series_tail(run.run_id, latest[0].rank, "step_ms", TREND_BUCKETS) if latest else ()
        ratios = next((dict(r.ratios) for r in latest if r.ratios), None)
        return {"workload": manifest.workload if manifest else None,
                "manifest": manifest,
                "median_step_ms": statistics.median(timed) if timed else None, "trend": trend, "ratios": ratios,
                "eval_step": reader.newest_evaluated_step(run.run_id)}

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
        self._writer(reader, now)
        base = reader.run_detail(run_id, now=self._coverage.decide_at(now))
        if base is None:
            return None
        latest = [r for r in base.ranks if r.latest]
        timed = [r.median_step_ms for r in latest if r.median_step_ms is not None]
        median = statistics.median(timed) if timed else None
        rank_rows = []
        for r in latest:
            sp = r.step_parts or {}
            ms = sp.get("whole", r.median_step_ms)
            rank_rows.append(RankRow(
                rank=r.rank, attempt=r.attempt, node=r.node, step=r.last_step, step_ms=ms,
                parts=tuple(sp.get(name) for name in steptime.PART_NAMES),
                # like with like: this rank's median against the median rank's (ms is the window's mean, whose
                # parts add up; one slow step would otherwise make every rank look slower than the median)
                delta_pct=None if r.median_step_ms is None or not median else (r.median_step_ms / median - 1.0) * 100.0,
                silent_s=None if r.last_ts is None else max(0.0, now - r.last_ts),
                silent=r.state in (RankState.STALLED, RankState.LOST), ended=r.ended,
                state=None if r.state is None else str(r.state)))
        step_series = [_points_series(f"rank {r.rank}", reader.series(run_id, r.rank, "step_ms")) for r in latest]
        ratio_name, _ = worst_ratio(dict(next((r.ratios for r in latest if r.ratios), ())))
        loss_ratio = train = None
        if latest:
            rank0 = latest[0].rank
            if ratio_name is not None:
                loss_ratio = _points_series(ratio_name, reader.series(run_id, rank0, "ratio/" + ratio_name))
            train = _points_series("train loss", reader.series(run_id, rank0, "loss"))
        chart_metric, chart_rank = chart or DEFAULT_CHART
        if (chart_metric, chart_rank) == DEFAULT_CHART:
            chosen = tuple(step_series)
        else:
            shown = [r.rank for r in latest if chart_rank is None or r.rank == chart_rank][:MAX_CHART_RANKS]
            chosen = tuple(_points_series(f"rank {rk}", reader.series(run_id, rk, chart_metric)) for rk in shown)
        manifest = base.manifest
        backlog = reader.backlog(run_id, now=now)
        early = _early_stopping(reader.validation(run_id), manifest, backlog, reader.early_stopping(run_id))
        evals, eval_name = _eval_points(reader.events(run_id, kind="eval", limit=MAX_EVALS), backlog,
                                        early.metric if early is not None else None)
        heat, heat_steps = _heatmap(step_series, HEAT_COLUMNS)
        eta = None
        if (row.status == "running" and row.declared_steps is not None and row.step is not None
                and row.steps_per_s and row.declared_steps > row.step):
            eta = (row.declared_steps - row.step) / row.steps_per_s
        return RunDetail(
            run=row, ranks=tuple(rank_rows), step_time=tuple(step_series), loss_ratio=loss_ratio,
            ratio_name=ratio_name, train_metric=train if train is not None and train.x else None,
            eval_metric_name=eval_name, evals=evals, heatmap=heat, heat_steps=heat_steps,
            nodes=_nodes(reader.node_samples(run_id, limit=1)), outcomes=_outcomes(base.outcomes),
            errors=tuple(reversed(reader.errors(run_id, limit=MAX_ERRORS))),
            fields=field_verdicts(reader.events(run_id, kind="field_stats", limit=MAX_FIELD_EVENTS)),
            now=now, failure=_failure(reader.failure(run_id)) or _failure_from_ranks(row, rank_rows, base.run.hang),
            metrics=base.metrics, chart_metric=chart_metric, chart_rank=chart_rank, chart=chosen,
            started_at=manifest.started_at if manifest else None, ended_at=manifest.ended_at if manifest else None,
            eta_s=eta, early_stopping=early)

    # -- backlog
    @_serialized
    def backlog(self, run_id: Optional[int] = None) -> BacklogSnapshot:
        now = self.clock()
        reader = self._db()
        if reader is None:
            return BacklogSnapshot((), (), None, None, None, now)
        runs = reader.list_runs(now=now)
        if run_id is not None:
            runs = tuple(r for r in runs if r.run_id == run_id)
        items: list[BacklogItem] = []
        newest = None
        lag = train_step = None
        for run in sorted(runs, key=lambda r: r.name):
            run_items = [_backlog_item(run.name, b, now) for b in reader.backlog(run.run_id, now=now)]
            items += run_items
            best = freshness.newest(freshness.Evaluated(i.step, i.checkpoint) for i in run_items
                                    if i.state == BacklogState.COMPLETED and i.step is not None)
            if best is not None:
                if newest is None or best.step > (newest[2] or 0):
                    newest = (run.name, best.checkpoint, best.step)
                    if run.last_step is not None:
                        train_step, lag = run.last_step, eval_lag(run.last_step, best.step)
            elif run.last_step is not None and run_id is not None:
                train_step = run.last_step
        counts = tuple(count_states((i.state for i in items), BACKLOG_STATES).items())
        label = runs[0].name if run_id is not None and runs else None
        return BacklogSnapshot(tuple(items), counts, newest, lag, train_step, now, run=label)

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
            content = reader.summary_bytes(run.run_id)
            if content is not None:
                return parse_summary_bytes(content), run.name
        raise FileNotFoundError(f"no final summary for {spec!r} (not a file, a run directory, or a run in the index)")


    # -- log view and describe (additive: read on the Log / Describe screens' own workers)
    @_serialized
    def log_sources(self, run_id: int) -> Optional[LogSources]:
        reader = self._db()
        if reader is None:
            return None
        run = reader.run(run_id, now=self.clock())
        run_dir, files = reader.log_files(run_id)
        if run is None or not run_dir:
            return None
        failure = reader.failure(run_id)
        single = run.world_size == 1 or (run.world_size is None and run.ranks == 1)
        return LogSources(run_id=run_id, name=run.name, run_dir=run_dir,
                          files=tuple((f.node, f.stream, f.rel) for f in files),
                          first_failed=failure.rank if failure is not None else _first_failed(run),
                          single_rank=(run.ranks_in(*RankState)[:1] or (0,))[0] if single else None,
                          live=run.status in LIVE_RUN_STATES, missing=run.missing)

    @_serialized
    def describe(self, run_id: int) -> Optional[DescribeSnapshot]:
        import json

        import msgspec

        reader = self._db()
        if reader is None:
            return None
        run = reader.run(run_id, now=self.clock())
        if run is None:
            return None
        manifest = reader.manifest(run_id)
        content = reader.summary_bytes(run_id)
        summary: Any = None
        if content is not None:
            try:
                summary = json.loads(content)
            except ValueError:
                summary = None
        summary = summary if isinstance(summary, dict) else {}
        context = summary.get("run_context") if isinstance(summary.get("run_context"), dict) else {}
        declaration = context.get("declaration")
        environment = summary.get("environment")
        return DescribeSnapshot(
            run_id=run_id, name=run.name, status=str(run.status), folder=run_folder(run.dir, run.root, run.name),
            manifest=msgspec.to_builtins(manifest) if manifest is not None else None,
            declaration=declaration if isinstance(declaration, dict) else None,
            environment=environment if isinstance(environment, dict) else None, has_summary=content is not None)


def run_folder(run_dir: str, root: str, name: str) -> str:
    """Where a run lives, from its root's own name: ``logs/exp1``.

    When the run's folder is not named as the run, the folder itself is named
    (``logs/exp1/dir``), so two runs of the same name always read apart.
    """
    base = os.path.dirname(root.rstrip("/")) or "/"
    where = run_dir if os.path.basename(run_dir) != name else os.path.dirname(run_dir)
    try:
        return os.path.relpath(where, base)
    except ValueError:  # another drive (Windows): the folder's own name
        return os.path.basename(where)


#: Why a failure shown from the rank states alone has no cause yet.
PENDING_CAUSE = "no final summary: the launcher writes the cause when it finalizes the run"


def _empty_note(health: Any) -> str:
    """What an empty Runs list says: that the writer does not index this watch's roots, when it does not (its
    runs may well be there), else that nothing was found."""
    unwatched = getattr(health, "unwatched", ())
    if unwatched:
        return (f"{', '.join(unwatched)} not indexed: {health.who()} writes this index for other roots — restart it "
                f"with these roots too, or watch them with another --index")
    return "nothing under the watched roots; start a run with `traceml run`"


def _first_failed(run: Any) -> Optional[int]:
    """The rank that failed first: the core marks every later failure ``aborted``, so it is the one failed or lost."""
    if str(run.status) not in ("failed", "lost"):
        return None
    first = run.ranks_in(RankState.FAILED, RankState.LOST)
    return first[0] if len(first) == 1 else None


def _failure_from_ranks(row: RunRow, ranks: list[RankRow], hang: Any = None) -> Optional[FailureInfo]:
    """Before the launcher's summary (or without one: the launcher died), who failed first as the states say;
    while a run hangs, the rank its peers wait for (the reader's core.hang.HangReport)."""
    if hang is not None and hang.culprits and row.status in ("stalled", "failed", "lost"):
        culprit = next((r for r in ranks if r.rank == hang.culprits[0]), None)
        return FailureInfo(cause="hang", cause_text=forensics.CAUSE_TEXT["hang"], rank=hang.culprits[0],
                           node=culprit.node if culprit else None,
                           step=None if culprit is None or culprit.step is None else culprit.step + 1,
                           state=culprit.state if culprit else None, hang=hang.text,
                           victims=tuple(r.rank for r in ranks if r.state == RankState.ABORTED))
    first = next((r for r in ranks if r.rank == row.first_failed), None)
    if first is None:
        # lost with no lost rank: every rank ended (or none ever wrote: its lease expired first) and the launcher
        # never finalized (core/state.py launcher_lost and the launcher-lease rules)
        if row.status == "lost" and all(r.ended is not None for r in ranks):
            return FailureInfo(cause="launcher-lost", cause_text=forensics.CAUSE_TEXT["launcher-lost"])
        return None
    return FailureInfo(cause="unknown", cause_text=PENDING_CAUSE, rank=first.rank, node=first.node,
                       step=None if first.step is None else first.step + 1, state=first.state,
                       victims=tuple(r.rank for r in ranks if r.state == RankState.ABORTED))


def _failure(section: Any) -> Optional[FailureInfo]:
    """The reader's failure section as the Run screen's snapshot (None: no failure recorded)."""
    if section is None:
        return None
    return FailureInfo(cause=section.cause, rank=section.rank, node=section.node, step=section.step,
                       state=section.state, cause_text=section.cause_text, exit_code=section.exit_code,
                       signal=section.signal, exception=section.exception, victims=tuple(section.victims),
                       log=section.log, hang=section.hang_text)


#: Backlog states whose checkpoint is still to be evaluated (▵ on the eval chart) or failed (✗).
_EVAL_WAITING = frozenset({BacklogState.PENDING, BacklogState.CLAIMED, BacklogState.STALE_CLAIM})
_EVAL_FAILED = frozenset({BacklogState.FAILED, BacklogState.BLOCKED})


def _eval_points(events: Any, backlog: Any = (), preferred: Optional[str] = None,
                 ) -> tuple[tuple[EvalPoint, ...], Optional[str]]:
    """Evaluations as chart points — ``eval`` records and the validation backlog alike — and the metric charted.

    A receipt is a completed point; a failed or blocked request a failure; a
    pending, claimed or stale-claimed one a waiting point at its checkpoint's
    step. A request whose checkpoint an ``eval`` record already reports as
    completed is not drawn twice. The metric is ``preferred`` (the early-stopping
    metric) when recorded, else ``loss``, else the commonest (ties: by name).
    """
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
        points.append(EvalPoint(step=int(e.step or 0), value=value, status=status,
                                checkpoint=e.body.get("checkpoint")))
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


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _early_stopping(validation: Any, manifest: Any, backlog: Any, recorded: Any = None) -> Optional[EarlyStoppingInfo]:
    """The early-stopping panel's facts: the state the run recorded at its end (summary ``validation``), else the
    policy's own state as it goes (``early_stopping.json`` through the reader: core/stopping.py), else the policy
    its manifest declares (nothing consumed yet); None without any."""
    from traceml_tui.hygiene.report import (  # the wording's one home
        early_stopping_notes,
        missing_metric_note,
        skipped_note,
    )

    receipts = sum(1 for b in backlog if b.state is BacklogState.COMPLETED)
    early = validation.early_stopping if validation is not None else None
    if isinstance(early, dict):
        enabled = early.get("enabled") is not False
        best = validation.best if isinstance(validation.best, dict) else {}
        stopped = early.get("state") == "stopped"
        return EarlyStoppingInfo(
            enabled=enabled, source="summary", metric=early.get("metric"), direction=early.get("direction"),
            patience=_int(early.get("patience")), patience_used=_int(early.get("patience_counter")),
            evaluations=_int(early.get("evaluations")), state=early.get("state"),
            reason=early.get("reason") if stopped else (None if enabled else early.get("disabled_reason")),
            trigger_checkpoint=early.get("trigger_checkpoint"), trigger_step=_int(early.get("trigger_step")),
            best_checkpoint=best.get("checkpoint"), best_step=_int(best.get("step")), best_value=_num(best.get("value")),
            receipts=receipts,
            after_stop_steps=tuple(_int(e.get("step")) for e in early.get("after_stop") or [] if isinstance(e, dict)),
            notes=tuple(early_stopping_notes(early)),
            min_delta=recorded.min_delta if recorded is not None else None,
            warmup=recorded.warmup if recorded is not None else None)
    if recorded is not None:
        notes = []
        if recorded.skipped:
            notes.append(skipped_note([{"checkpoint": c, "step": st, "reason": r} for c, st, r in recorded.skipped]))
        if recorded.missing_metric:
            notes.append(missing_metric_note(recorded.metric, recorded.missing_metric, recorded.missing_metric_names))
        return EarlyStoppingInfo(
            enabled=recorded.enabled, source="policy", metric=recorded.metric,
            direction=recorded.direction if recorded.enabled else None,
            patience=recorded.patience if recorded.enabled else None,
            patience_used=recorded.patience_used if recorded.enabled else None,
            evaluations=recorded.evaluations, state=recorded.state,
            reason=recorded.reason if recorded.stopped else recorded.disabled_reason,
            trigger_checkpoint=recorded.trigger_checkpoint, trigger_step=recorded.trigger_step,
            best_checkpoint=recorded.best_checkpoint, best_step=recorded.best_step, best_value=recorded.best_value,
            receipts=receipts, after_stop_steps=recorded.after_stop_steps, notes=tuple(notes),
            min_delta=recorded.min_delta, warmup=recorded.warmup)
    raw = manifest.hygiene_block.get("early_stopping") if manifest is not None else None
    block = decode_lenient(raw, EarlyStoppingBlock)  # the declared block, typed (core/artifacts.py)
    if block is None:
        return None
    on = block.enabled
    metric = block.metric if on else None
    # Nothing consumed yet: no best (the policy's best is its own: core/stopping.py). Receipts that lack the
    # monitored metric are named already, in the policy's words.
    lacking = [b for b in backlog if b.state is BacklogState.COMPLETED and _num(dict(b.metrics).get(metric)) is None
               ] if metric else []
    notes = (missing_metric_note(metric, len(lacking), {k for b in lacking for k, _ in b.metrics}),) if lacking else ()
    return EarlyStoppingInfo(
        enabled=on, source="declared", metric=metric, direction=(block.direction or "min") if on else None,
        patience=block.patience if on else None, reason=None if on else block.reason, receipts=receipts,
        notes=notes, min_delta=block.min_delta if on else None, warmup=block.warmup if on else None)


def _nodes(samples: Any) -> tuple[NodeMetrics, ...]:
    latest: dict[int, Any] = {}
    for sample in samples:
        latest[sample.node] = sample
    out = []
    for node in sorted(latest):
        s = latest[node]
        gpus = tuple((int(g.get("index", 0)), _num(g.get("util_pct")), g.get("mem_used"), g.get("mem_total"))
                     for g in s.gpus if isinstance(g, dict))
        out.append(NodeMetrics(node, s.ts, s.cpu_pct, s.ram_used, s.ram_total, gpus))
    return tuple(out)


def _points_series(name: str, series: Any) -> Series:
    """A reader Series (buckets with min/max/mean) as a snapshot Series."""
    pts = series.points
    return Series(name, tuple((p.step_lo + p.step_hi) / 2.0 for p in pts), tuple(p.mean for p in pts),
                  tuple(p.vmin for p in pts), tuple(p.vmax for p in pts))


def _outcomes(items: Any) -> tuple[Outcome, ...]:
    out = []
    for o in items:
        status = o.status or ("invalid" if o.error else "unknown")
        reasons = ("node_training_failed",) if status == "failed" else (("node_outcome_invalid",) if o.error else ())
        out.append(Outcome(o.node if o.node is not None else -1, status, o.exit_code, reasons))
    return tuple(out)


def _backlog_item(run: str, b: Any, now: float) -> BacklogItem:
    """A reader backlog item in the screen's terms (the state word is the reader's, decided in the core)."""
    claimed = b.state in (BacklogState.CLAIMED, BacklogState.STALE_CLAIM)
    return BacklogItem(
        run=run, checkpoint=b.checkpoint, step=b.step, state=str(b.state),
        age_s=None if b.created is None else now - b.created, owner=b.owner if claimed else None,
        heartbeat_age_s=None if b.heartbeat is None or not claimed else now - b.heartbeat,
        lease_s=b.lease_s if claimed else None, retries=b.failures,
        stuck=b.state is BacklogState.STALE_CLAIM, last_error=b.last_error, metrics=b.metrics,
        attempts=b.attempts)


MAX_FIELD_EVENTS = 5000


def field_verdicts(events: Any) -> tuple[FieldVerdict, ...]:
    """Field-collapse verdicts from the index's field_stats events (the same rule as the summary's)."""
    if not events:
        return ()
    import msgspec

    from traceml_tui.core import records
    from traceml_tui.hygiene.field_qc import summarize_records

    parsed = []
    for event in events:
        try:
            parsed.append(msgspec.convert(dict(event.body, kind="field_stats"), records.FieldStats))
        except (msgspec.ValidationError, TypeError):
            continue
    fields = summarize_records(parsed)["fields"]
    return tuple(
        FieldVerdict(name=name, status=v["status"], qc_points=v["qc_points"], failed_at_step=v["failed_at_step"],
                     latest_step=v["latest_step"], latest_spread_ratio=v["latest_spread_ratio"], factor=v["factor"])
        for name, v in fields.items()
    )
