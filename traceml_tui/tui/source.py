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

import json
import math
import os
import sqlite3
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from traceml_tui.tui.snapshots import (
    FieldVerdict,
    BacklogItem,
    BacklogSnapshot,
    CompareSnapshot,
    EvalPoint,
    IngestError,
    NodeMetrics,
    Outcome,
    RankRow,
    RunDetail,
    RunRow,
    RunsSnapshot,
    Series,
)

#: A rank is silent when its newest record is older than this many seconds …
SILENT_MIN_S = 30.0
#: … and older than this many of the run's median step intervals.
SILENT_INTERVALS = 20.0
TREND_BUCKETS = 16
HEAT_COLUMNS = 64
MAX_EVALS = 500
MAX_ERRORS = 50


class Source(Protocol):
    """What the App needs from its data source (all calls happen off the UI thread)."""

    def data_version(self) -> int:
        """A cheap number that changes whenever the data changes (-1 when nothing is there yet)."""

    def now(self) -> float:
        """The current time as the snapshots see it (injectable for tests)."""

    def runs(self) -> RunsSnapshot:
        """Every run, one row each."""

    def run_detail(self, run_id: int, runs: Optional[RunsSnapshot] = None) -> Optional[RunDetail]:
        """Everything the Run screen shows for one run (None when the run is gone).

        ``runs`` is a runs snapshot just built, reused for the run's own row.
        """

    def backlog(self, run_id: Optional[int] = None) -> BacklogSnapshot:
        """Validation requests of one run (or of every run)."""

    def summary(self, spec: str) -> tuple[dict, str]:
        """A final summary by path, run directory or run name in the index, and its display label."""

    def close(self) -> None:
        """Release connections (and stop an embedded ingester)."""


# --------------------------------------------------------------------------- pure helpers


def _loads(text: Optional[str]) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def silent_after(median_interval_s: Optional[float]) -> float:
    """Seconds without a record after which a rank counts as silent."""
    interval = median_interval_s if median_interval_s and median_interval_s > 0 else 0.0
    return max(SILENT_MIN_S, SILENT_INTERVALS * interval)


def find_silent(ranks: list[dict], now: float, median_interval_s: Optional[float]) -> tuple[int, ...]:
    """Ranks (latest attempt, not ended) that have gone silent.

    A rank is silent when its newest record is ``silent_after`` seconds older
    than the newest record of any rank of the run (the others go on without
    it), or when the whole run has written nothing for that long by the
    record clock *and* the ingester has seen nothing new for that long (a
    hung collective silences every rank at once). The threshold adapts to the
    run's pace, so a slow model is not called stalled.
    """
    limit = silent_after(median_interval_s)
    stamps = [float(r["last_ts"]) for r in ranks if r.get("last_ts") is not None]
    if not stamps:
        return ()
    newest = max(stamps)
    seen = [float(r["last_seen"]) for r in ranks if r.get("last_seen") is not None]
    idle = (now - max(seen) > limit) if seen else True
    out = []
    for r in ranks:
        if r.get("ended") or r.get("last_ts") is None:
            continue
        ts = float(r["last_ts"])
        if newest - ts > limit or (now - ts > limit and idle):
            out.append(int(r["rank"]))
    return tuple(sorted(out))


def run_status(
    *,
    missing: bool,
    manifest_status: Optional[str],
    summary_status: Optional[str],
    training_status: Optional[str],
    ranks_total: int,
    ranks_ended: int,
    ranks_failed: int,
    outcomes_failed: int,
    silent: tuple[int, ...],
) -> str:
    """One of running, completed, failed, stalled, missing (see snapshots.RUN_STATES)."""
    if missing:
        return "missing"
    statuses = {s for s in (manifest_status, summary_status, training_status) if isinstance(s, str)}
    if ranks_failed or outcomes_failed or statuses & {"failed", "error", "crashed", "incomplete"}:
        return "failed"
    if statuses & {"completed", "finished", "succeeded"} or (ranks_total and ranks_ended >= ranks_total):
        return "completed"
    if silent:
        return "stalled"
    return "running"


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


def manifest_facts(manifest: Any) -> tuple[Optional[str], Optional[int]]:
    """(workload name, declared last step) from a manifest: the guard contract, else --trace-max-steps."""
    if not isinstance(manifest, dict):
        return None, None
    workload = declared = None
    guard = manifest.get("guard") if isinstance(manifest.get("guard"), dict) else {}
    contract = guard.get("contract") if isinstance(guard.get("contract"), dict) else {}
    wl = contract.get("workload") if isinstance(contract.get("workload"), dict) else {}
    if isinstance(wl.get("name"), str):
        workload = wl["name"]
    meas = contract.get("measurement") if isinstance(contract.get("measurement"), dict) else {}
    if isinstance(meas.get("start_step"), int) and isinstance(meas.get("completed_steps"), int):
        declared = meas["start_step"] + meas["completed_steps"] - 1
    elif isinstance(manifest.get("trace_max_steps"), int):
        declared = manifest["trace_max_steps"]
    return workload, declared


def compare_snapshot(reference: dict, candidate: dict, threshold_pct: Optional[float],
                     labels: tuple[str, str]) -> CompareSnapshot:
    """Run the same comparison core as `traceml compare` and lay its report out for the screen."""
    from traceml_tui.compare.core import compare_summaries
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
                return f"{name} steps {m.get('start_step')}+{m.get('completed_steps')}"
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
            rows.append((row["label"], fmt_num(row.get("reference")), fmt_num(row.get("candidate")),
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
    """Worst scale-free loss ratio from our own ``training`` section of a summary, when present."""
    training = summary.get("training") if isinstance(summary.get("training"), dict) else {}
    for key in ("loss_ratio", "latest_ratio", "ratio"):
        v = _num(training.get(key))
        if v is not None:
            return v
    ratios = training.get("ratios") or training.get("loss_ratios") or training.get("components")
    if isinstance(ratios, dict):
        flat = {}
        for k, v in ratios.items():
            flat[k] = v.get("ratio") if isinstance(v, dict) else v
        return worst_ratio(flat)[1]
    return None


# --------------------------------------------------------------------------- the index adapter


class IndexSource:
    """:class:`Source` over the daemon's index through :class:`daemon.reader.Reader` (read-only, opened lazily).

    The few things the reader does not offer yet (eval events, the tail of a
    series, a rank's node, per-run backlog counts in the listing) are read
    with small queries over the reader's own read-only connection.
    """

    def __init__(self, index_path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time,
                 ingester: Any = None) -> None:
        self.index_path = Path(index_path)
        self.clock = clock
        self.ingester = ingester  # an embedded daemon.service.Ingester we own (stopped on close)
        self._reader: Any = None
        self._row_cache: dict[int, tuple[int, Any]] = {}  # run_id -> (updated_version, cached parts)

    # -- plumbing
    def _db(self) -> Any:
        """The reader, or None while the index does not exist (or is not initialised) yet."""
        if self._reader is None:
            if not self.index_path.is_file():
                return None
            from daemon.reader import Reader

            try:
                reader = Reader(self.index_path)
                reader.conn.execute("SELECT v FROM version WHERE id = 1").fetchone()
            except (OSError, sqlite3.Error):
                return None  # created but not initialised yet: try again next poll
            self._reader = reader
        return self._reader

    def _sql(self, sql: str, params: tuple = ()) -> list:
        try:
            return self._reader.conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise

    def now(self) -> float:
        return self.clock()

    def close(self) -> None:
        if self.ingester is not None:
            try:
                self.ingester.stop()
            finally:
                self.ingester = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def data_version(self) -> int:
        reader = self._db()
        if reader is None:
            return -1
        try:
            return reader.data_version()
        except sqlite3.Error:
            return -1

    # -- runs
    def runs(self) -> RunsSnapshot:
        now = self.clock()
        reader = self._db()
        if reader is None:
            return RunsSnapshot((), now, -1, index_ready=False, note=f"waiting for the index {self.index_path.name}")
        version = reader.data_version()
        summaries = reader.list_runs(now=now)
        live_rows: dict[int, list[dict]] = {}
        lcols = ("run_id", "rank", "last_step", "last_ts", "last_seen", "median_step_ms", "ratios", "ended")
        for r in self._sql(
            f"SELECT {', '.join(lcols)} FROM rank_live r WHERE attempt ="
            " (SELECT max(attempt) FROM rank_live WHERE run_id = r.run_id AND rank = r.rank)"
        ):
            d = dict(zip(lcols, r))
            live_rows.setdefault(d["run_id"], []).append(d)
        intervals = dict(self._sql("SELECT run_id, median_interval_s FROM runs"))
        summary_status = dict(self._sql("SELECT run_id, summary_status FROM runs"))
        rows = []
        for run in summaries:
            rid = run.run_id
            ranks = live_rows.get(rid, [])
            cached = self._row_cache.get(rid)
            if cached is None or cached[0] != run.version:
                parts = self._run_parts(rid, ranks)
                self._row_cache[rid] = (run.version, parts)
            else:
                parts = cached[1]
            silent = find_silent(ranks, now, intervals.get(rid))
            status = run_status(
                missing=run.missing, manifest_status=run.manifest_status, summary_status=summary_status.get(rid),
                training_status=run.training_status, ranks_total=run.ranks, ranks_ended=run.ranks_ended,
                ranks_failed=sum(1 for r in ranks if r["ended"] and r["ended"] != "completed"),
                outcomes_failed=run.outcomes_failed, silent=silent)
            eval_step = max([s for s in (parts["eval_step"], parts["receipt_step"]) if s is not None], default=None)
            step = run.last_step
            rows.append(RunRow(
                run_id=rid, name=run.name, status=status, silent_ranks=silent if status == "stalled" else (),
                workload=parts["workload"], nodes=run.nnodes,
                procs_per_node=run.nproc_per_node or (len(ranks) if ranks else None),
                step=step, declared_steps=parts["declared"], median_step_ms=parts["median_step_ms"],
                trend=parts["trend"], steps_per_s=run.steps_per_s, examples_per_s=run.examples_per_s,
                loss_ratio=worst_ratio(parts["ratios"])[1], eval_step=eval_step,
                eval_lag=None if eval_step is None or step is None else max(0, step - eval_step),
                backlog=parts["backlog"], errors=run.errors or 0, last_ts=run.last_ts,
            ))
        rows.sort(key=lambda r: (-(r.last_ts or 0.0), r.name))
        return RunsSnapshot(tuple(rows), now, version,
                            note=None if rows else "nothing under the watched roots; start a run with `traceml run`")

    def _run_parts(self, run_id: int, ranks: list[dict]) -> dict[str, Any]:
        """Per-run facts that only change when the run's data changes (cached on its updated_version)."""
        manifest = receipt_step = None
        requests = receipts = 0
        for kind, content in self._sql(
            "SELECT kind, content FROM side_files WHERE run_id = ? AND kind IN ('manifest', 'request', 'receipt')",
            (run_id,)
        ):
            if kind == "manifest":
                manifest = _loads(content)
            elif kind == "request":
                requests += 1
            else:
                receipts += 1
                step = (_loads(content) or {}).get("step")
                if isinstance(step, int):
                    receipt_step = max(step, receipt_step or 0)
        workload, declared = manifest_facts(manifest)
        timed = sorted(r["median_step_ms"] for r in ranks if r["median_step_ms"] is not None)
        trend: tuple[float, ...] = ()
        if ranks:
            rank0 = min(r["rank"] for r in ranks)
            tail = self._sql(
                "SELECT step_ms_sum, step_ms_n FROM series WHERE run_id = ? AND rank = ? ORDER BY bucket DESC LIMIT ?",
                (run_id, rank0, TREND_BUCKETS))
            trend = tuple(s / n for s, n in reversed(tail) if n)
        ratios = None
        for r in sorted(ranks, key=lambda r: r["rank"]):
            ratios = _loads(r["ratios"])
            if ratios:
                break
        erow = self._sql(
            "SELECT max(step) FROM events WHERE run_id = ? AND kind = 'eval' AND body LIKE '%\"status\":\"completed\"%'",
            (run_id,))
        return {"workload": workload, "declared": declared,
                "median_step_ms": statistics.median(timed) if timed else None, "trend": trend, "ratios": ratios,
                "eval_step": erow[0][0] if erow else None, "receipt_step": receipt_step,
                "backlog": max(0, requests - receipts)}

    # -- one run
    def run_detail(self, run_id: int, runs: Optional[RunsSnapshot] = None) -> Optional[RunDetail]:
        reader = self._db()
        if reader is None:
            return None
        now = self.clock()
        row = next((r for r in (runs or self.runs()).rows if r.run_id == run_id), None)
        if row is None:
            return None
        base = reader.run_detail(run_id, now=now)
        if base is None:
            return None
        latest = [r for r in base.ranks if r.latest]
        interval = dict(self._sql("SELECT run_id, median_interval_s FROM runs WHERE run_id = ?", (run_id,))).get(run_id)
        silent = set(find_silent([{"rank": r.rank, "last_ts": r.last_ts, "last_seen": r.last_seen, "ended": r.ended}
                                  for r in latest], now, interval))
        nodes_of = self._rank_nodes(run_id)
        timed = [r.median_step_ms for r in latest if r.median_step_ms is not None]
        median = statistics.median(timed) if timed else None
        rank_rows = []
        for r in latest:
            ms, wait = r.median_step_ms, r.median_input_wait_ms
            rank_rows.append(RankRow(
                rank=r.rank, attempt=r.attempt, node=nodes_of.get(r.rank), step=r.last_step, step_ms=ms,
                input_wait_ms=wait, compute_ms=None if ms is None else ms - (wait or 0.0),
                delta_pct=None if ms is None or not median else (ms / median - 1.0) * 100.0,
                silent_s=None if r.last_ts is None else max(0.0, now - r.last_ts), silent=r.rank in silent,
                ended=r.ended))
        step_series = [_points_series(f"rank {r.rank}", reader.series(run_id, r.rank, "step_ms")) for r in latest]
        ratio_name, _ = worst_ratio(dict(next((r.ratios for r in latest if r.ratios), ())))
        loss_ratio = train = None
        if latest:
            rank0 = latest[0].rank
            if ratio_name is not None:
                loss_ratio = _points_series(ratio_name, reader.series(run_id, rank0, "ratio/" + ratio_name))
            train = _points_series("train loss", reader.series(run_id, rank0, "loss"))
        evals, eval_name = self._evals(run_id)
        heat, heat_steps = _heatmap(step_series, HEAT_COLUMNS)
        return RunDetail(
            run=row, ranks=tuple(rank_rows), step_time=tuple(step_series), loss_ratio=loss_ratio,
            ratio_name=ratio_name, train_metric=train if train is not None and train.x else None,
            eval_metric_name=eval_name, evals=evals, heatmap=heat, heat_steps=heat_steps,
            nodes=self._nodes(reader, run_id), outcomes=_outcomes(base.outcomes),
            errors=tuple(IngestError(e.path, e.offset, e.message)
                         for e in reversed(reader.errors(run_id, limit=MAX_ERRORS))),
            fields=field_verdicts(reader.events(run_id, kind="field_stats", limit=MAX_FIELD_EVENTS)),
            now=now)

    def _rank_nodes(self, run_id: int) -> dict[int, int]:
        """rank → node from the stream headers (node_rank) the ingester stored."""
        out = {}
        for rank, header in self._sql(
            "SELECT rank, header FROM files WHERE run_id = ? AND stream = 'steps' AND header IS NOT NULL", (run_id,)
        ):
            node = (_loads(header) or {}).get("node_rank")
            if isinstance(rank, int) and isinstance(node, int):
                out[rank] = node
        return out

    def _evals(self, run_id: int) -> tuple[tuple[EvalPoint, ...], Optional[str]]:
        bodies = [_loads(b) or {} for (b,) in self._sql(
            "SELECT body FROM events WHERE run_id = ? AND kind = 'eval' ORDER BY step DESC LIMIT ?",
            (run_id, MAX_EVALS))]
        names: dict[str, int] = {}
        for b in bodies:
            for k in (b.get("metrics") or {}):
                names[k] = names.get(k, 0) + 1
        name = "loss" if "loss" in names else (max(names, key=names.get) if names else None)
        points = []
        for b in reversed(bodies):
            value = _num((b.get("metrics") or {}).get(name)) if name else None
            points.append(EvalPoint(step=int(b.get("step") or 0), value=value, status=str(b.get("status")),
                                    checkpoint=b.get("checkpoint")))
        return tuple(points), name

    def _nodes(self, reader: Any, run_id: int) -> tuple[NodeMetrics, ...]:
        latest: dict[int, Any] = {}
        for sample in reader.node_samples(run_id, limit=1):
            latest[sample.node] = sample
        out = []
        for node in sorted(latest):
            s = latest[node]
            gpus = tuple((int(g.get("index", 0)), _num(g.get("util_pct")), g.get("mem_used"), g.get("mem_total"))
                         for g in s.gpus if isinstance(g, dict))
            out.append(NodeMetrics(node, s.ts, s.cpu_pct, s.ram_used, s.ram_total, gpus))
        return tuple(out)

    # -- backlog
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
        owners = self._claim_owners(run_id)
        for run in sorted(runs, key=lambda r: r.name):
            run_items = [_backlog_item(run.name, b, owners.get((run.run_id, b.checkpoint)), now)
                         for b in reader.backlog(run.run_id, now=now)]
            items += run_items
            done = [i for i in run_items if i.state == "completed" and i.step is not None]
            if done:
                best = max(done, key=lambda i: i.step)
                if newest is None or (best.step or 0) > (newest[2] or 0):
                    newest = (run.name, best.checkpoint, best.step)
                    if run.last_step is not None:
                        train_step, lag = run.last_step, max(0, run.last_step - best.step)
            elif run.last_step is not None and run_id is not None:
                train_step = run.last_step
        counts = {s: 0 for s in ("pending", "claimed", "completed", "failed")}
        for i in items:
            counts[i.state] = counts.get(i.state, 0) + 1
        stuck = sum(1 for i in items if i.stuck)
        count_list = list(counts.items()) + ([("stuck", stuck)] if stuck else [])
        label = runs[0].name if run_id is not None and runs else None
        return BacklogSnapshot(tuple(items), tuple(count_list), newest, lag, train_step, now, run=label)

    def _claim_owners(self, run_id: Optional[int]) -> dict[tuple[int, str], str]:
        """(run, checkpoint) → "host:pid" of its claim's owner (the reader's backlog item has no owner)."""
        where = "AND run_id = ?" if run_id is not None else ""
        out = {}
        for rid, key, content in self._sql(
            f"SELECT run_id, key, content FROM side_files WHERE kind = 'claim' AND content IS NOT NULL {where}",
            (run_id,) if run_id is not None else ()
        ):
            owner = (_loads(content) or {}).get("owner")
            if isinstance(owner, dict):
                out[(rid, str(key))] = f"{owner.get('host', '?')}:{owner.get('pid', '?')}"
        return out

    # -- compare
    def summary(self, spec: str) -> tuple[dict, str]:
        from traceml_tui.compare.load import parse_summary_bytes, read_summary

        path = Path(spec)
        if path.is_dir():
            path = path / "final_summary.json"
        if path.is_file():
            return read_summary(path), path.parent.name if path.name == "final_summary.json" else path.name
        reader = self._db()
        run = reader.find_run(spec) if reader is not None else None
        if run is not None:
            rows = self._sql("SELECT content FROM side_files WHERE run_id = ? AND kind = 'summary'"
                             " AND content IS NOT NULL", (run.run_id,))
            if rows:
                return parse_summary_bytes(rows[0][0].encode("utf-8")), run.name
        raise FileNotFoundError(f"no final summary for {spec!r} (not a file, a run directory, or a run in the index)")


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


def _backlog_item(run: str, b: Any, owner: Optional[str], now: float) -> BacklogItem:
    """A reader backlog item in the screen's terms (a stale claim is a claimed item that is stuck)."""
    stuck = b.state == "stale-claim"
    state = "claimed" if stuck else b.state
    return BacklogItem(
        run=run, checkpoint=b.checkpoint, step=b.step, state=state,
        age_s=None if b.created is None else now - b.created, owner=owner if state == "claimed" else None,
        heartbeat_age_s=None if b.heartbeat is None or state != "claimed" else now - b.heartbeat,
        lease_s=b.lease_s if state == "claimed" else None, retries=b.failures, stuck=stuck,
        last_error=None if b.last_error is None else b.last_error[:120])


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
