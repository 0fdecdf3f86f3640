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

    def run_detail(self, run_id: int) -> Optional[RunDetail]:
        """Everything the Run screen shows for one run (None when the run is gone)."""

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
    """Ranks (latest attempt) that have not ended and have written nothing for too long.

    The threshold adapts to the run's pace, so a slow model is not called
    stalled, and a rank is only silent relative to the clock, never to other
    ranks (all ranks of a hung collective go silent together).
    """
    limit = silent_after(median_interval_s)
    out = []
    for r in ranks:
        if r.get("ended") or r.get("last_ts") is None:
            continue
        if now - float(r["last_ts"]) > limit:
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


def backlog_items(
    run: str,
    requests: list[dict],
    claims: dict[str, dict],
    receipts: dict[str, dict],
    failures: dict[str, list[dict]],
    now: float,
) -> list[BacklogItem]:
    """Derive each request's state from the backlog files' contents.

    completed: a receipt exists; claimed: a claim exists (stuck when its
    heartbeat is older than its lease); failed: failures and no claim;
    pending otherwise. A failure is never a result.
    """
    items = []
    for req in requests:
        ckpt = str(req.get("checkpoint"))
        created = _num(req.get("created"))
        fails = failures.get(ckpt, [])
        step = req.get("step") if isinstance(req.get("step"), int) else None
        base = dict(run=run, checkpoint=ckpt, step=step, age_s=None if created is None else now - created,
                    retries=len(fails), last_error=str(fails[-1].get("error"))[:120] if fails else None)
        if ckpt in receipts:
            items.append(BacklogItem(state="completed", **base))
            continue
        claim = claims.get(ckpt)
        if claim is not None:
            owner = claim.get("owner") if isinstance(claim.get("owner"), dict) else {}
            who = f"{owner.get('host', '?')}:{owner.get('pid', '?')}"
            beat = _num(claim.get("heartbeat"))
            lease = _num(claim.get("lease_s"))
            age = None if beat is None else now - beat
            stuck = age is not None and lease is not None and age > lease
            items.append(BacklogItem(state="claimed", owner=who, heartbeat_age_s=age, lease_s=lease, stuck=stuck,
                                     **base))
            continue
        items.append(BacklogItem(state="failed" if fails else "pending", **base))
    return items


def _series_from_rows(name: str, rows: list[tuple]) -> Series:
    """rows: (step_lo, step_hi, vmin, vmax, vsum, n) per bucket."""
    xs, ys, lo, hi = [], [], [], []
    for step_lo, step_hi, vmin, vmax, vsum, n in rows:
        if not n:
            continue
        xs.append((step_lo + step_hi) / 2.0)
        ys.append(vsum / n)
        lo.append(vmin)
        hi.append(vmax)
    return Series(name, tuple(xs), tuple(ys), tuple(lo), tuple(hi))


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
    """:class:`Source` over the daemon's SQLite index (opened read-only, lazily)."""

    def __init__(self, index_path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time,
                 ingester: Any = None) -> None:
        self.index_path = Path(index_path)
        self.clock = clock
        self.ingester = ingester  # an embedded daemon.service.Ingester we own (stopped on close)
        self._conn: Optional[sqlite3.Connection] = None
        self._lock = threading.Lock()
        self._row_cache: dict[int, tuple[int, Any]] = {}  # run_id -> (updated_version, cached parts)

    # -- plumbing
    def _db(self) -> Optional[sqlite3.Connection]:
        if self._conn is None:
            if not self.index_path.exists():
                return None
            from daemon import index as idx

            try:
                conn = idx.connect_reader(self.index_path)
                conn.execute("SELECT v FROM version WHERE id = 1").fetchone()
            except sqlite3.Error:
                return None  # created but not initialised yet: try again next poll
            self._conn = conn
        return self._conn

    def now(self) -> float:
        return self.clock()

    def close(self) -> None:
        if self.ingester is not None:
            try:
                self.ingester.stop()
            finally:
                self.ingester = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def data_version(self) -> int:
        db = self._db()
        if db is None:
            return -1
        try:
            row = db.execute("SELECT v FROM version WHERE id = 1").fetchone()
        except sqlite3.Error:
            return -1
        return int(row[0]) if row else -1

    # -- runs
    def runs(self) -> RunsSnapshot:
        now = self.clock()
        db = self._db()
        if db is None:
            return RunsSnapshot((), now, -1, index_ready=False, note=f"waiting for the index {self.index_path.name}")
        version = self.data_version()
        cols = ("run_id", "name", "missing", "manifest_status", "training_status", "summary_status", "nnodes",
                "nproc_per_node", "world_size", "steps_per_s", "examples_per_s", "ranks_total", "ranks_ended",
                "ranks_failed", "last_step", "last_ts", "median_interval_s", "errors", "outcomes_failed",
                "updated_version")
        runs = [dict(zip(cols, r)) for r in db.execute(f"SELECT {', '.join(cols)} FROM runs")]
        live_rows: dict[int, list[dict]] = {}
        lcols = ("run_id", "rank", "attempt", "last_step", "last_ts", "median_step_ms", "ratios", "ended")
        for r in db.execute(
            f"SELECT {', '.join(lcols)} FROM rank_live r WHERE attempt ="
            " (SELECT max(attempt) FROM rank_live WHERE run_id = r.run_id AND rank = r.rank)"
        ):
            d = dict(zip(lcols, r))
            live_rows.setdefault(d["run_id"], []).append(d)
        side = self._side_counts(db)
        rows = []
        for run in runs:
            rid = run["run_id"]
            ranks = live_rows.get(rid, [])
            cached = self._row_cache.get(rid)
            if cached is None or cached[0] != run["updated_version"] or cached[1] is None:
                parts = self._run_parts(db, rid, ranks)
                self._row_cache[rid] = (run["updated_version"], parts)
            else:
                parts = cached[1]
            silent = find_silent(ranks, now, run["median_interval_s"])
            status = run_status(
                missing=bool(run["missing"]), manifest_status=parts["manifest_status"],
                summary_status=run["summary_status"], training_status=run["training_status"],
                ranks_total=run["ranks_total"] or 0, ranks_ended=run["ranks_ended"] or 0,
                ranks_failed=run["ranks_failed"] or 0, outcomes_failed=run["outcomes_failed"] or 0, silent=silent)
            counts = side.get(rid, {})
            eval_step = max([s for s in (parts["eval_step"], counts.get("receipt_step")) if s is not None],
                            default=None)
            step = run["last_step"]
            rows.append(RunRow(
                run_id=rid, name=run["name"], status=status, silent_ranks=silent if status == "stalled" else (),
                workload=parts["workload"], nodes=run["nnodes"],
                procs_per_node=run["nproc_per_node"] or (len(ranks) if ranks else None),
                step=step, declared_steps=parts["declared"], median_step_ms=parts["median_step_ms"],
                trend=parts["trend"], steps_per_s=run["steps_per_s"], examples_per_s=run["examples_per_s"],
                loss_ratio=worst_ratio(parts["ratios"])[1], eval_step=eval_step,
                eval_lag=None if eval_step is None or step is None else max(0, step - eval_step),
                backlog=max(0, counts.get("request", 0) - counts.get("receipt", 0)), errors=run["errors"] or 0,
                last_ts=run["last_ts"],
            ))
        rows.sort(key=lambda r: (-(r.last_ts or 0.0), r.name))
        return RunsSnapshot(tuple(rows), now, version, note=None if rows else "nothing under the watched roots; start a run with `traceml run`")

    def _side_counts(self, db: sqlite3.Connection) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for rid, kind, n in db.execute(
            "SELECT run_id, kind, count(*) FROM side_files WHERE kind IN ('request', 'receipt') GROUP BY run_id, kind"
        ):
            out.setdefault(rid, {})[kind] = n
        for rid, content in db.execute(
            "SELECT run_id, content FROM side_files WHERE kind = 'receipt' AND content IS NOT NULL"
        ):
            step = (_loads(content) or {}).get("step")
            if isinstance(step, int):
                d = out.setdefault(rid, {})
                d["receipt_step"] = max(step, d.get("receipt_step") or 0)
        return out

    def _run_parts(self, db: sqlite3.Connection, run_id: int, ranks: list[dict]) -> dict[str, Any]:
        """Per-run facts that only change when the run's data changes (cached on updated_version)."""
        manifest = None
        row = db.execute("SELECT content FROM side_files WHERE run_id = ? AND kind = 'manifest'", (run_id,)).fetchone()
        if row:
            manifest = _loads(row[0])
        workload, declared = manifest_facts(manifest)
        timed = sorted(r["median_step_ms"] for r in ranks if r["median_step_ms"] is not None)
        median = statistics.median(timed) if timed else None
        trend: tuple[float, ...] = ()
        if ranks:
            rank0 = min(r["rank"] for r in ranks)
            tail = db.execute(
                "SELECT step_ms_sum, step_ms_n FROM series WHERE run_id = ? AND rank = ? ORDER BY bucket DESC LIMIT ?",
                (run_id, rank0, TREND_BUCKETS)).fetchall()
            trend = tuple(s / n for s, n in reversed(tail) if n)
        ratios = None
        for r in sorted(ranks, key=lambda r: r["rank"]):
            ratios = _loads(r["ratios"])
            if ratios:
                break
        erow = db.execute(
            "SELECT max(step) FROM events WHERE run_id = ? AND kind = 'eval' AND body LIKE '%\"status\":\"completed\"%'",
            (run_id,)).fetchone()
        return {"manifest_status": manifest.get("status") if isinstance(manifest, dict) else None,
                "workload": workload, "declared": declared, "median_step_ms": median, "trend": trend,
                "ratios": ratios, "eval_step": erow[0] if erow else None}

    # -- one run
    def run_detail(self, run_id: int) -> Optional[RunDetail]:
        db = self._db()
        if db is None:
            return None
        snap_rows = [r for r in self.runs().rows if r.run_id == run_id]
        if not snap_rows:
            return None
        run = snap_rows[0]
        now = self.clock()
        lcols = ("rank", "attempt", "node", "last_step", "last_ts", "median_step_ms", "median_input_wait_ms",
                 "ended", "ratios")
        ranks = [dict(zip(lcols, r)) for r in db.execute(
            f"SELECT {', '.join(lcols)} FROM rank_live r WHERE run_id = ? AND attempt ="
            " (SELECT max(attempt) FROM rank_live WHERE run_id = r.run_id AND rank = r.rank) ORDER BY rank",
            (run_id,))]
        interval = db.execute("SELECT median_interval_s FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0]
        limit = silent_after(interval)
        timed = [r["median_step_ms"] for r in ranks if r["median_step_ms"] is not None]
        median = statistics.median(timed) if timed else None
        rank_rows = []
        for r in ranks:
            ms, wait = r["median_step_ms"], r["median_input_wait_ms"]
            age = None if r["last_ts"] is None else max(0.0, now - r["last_ts"])
            rank_rows.append(RankRow(
                rank=r["rank"], attempt=r["attempt"], node=r["node"], step=r["last_step"], step_ms=ms,
                input_wait_ms=wait, compute_ms=None if ms is None else ms - (wait or 0.0),
                delta_pct=None if ms is None or not median else (ms / median - 1.0) * 100.0,
                silent_s=age, silent=bool(not r["ended"] and age is not None and age > limit), ended=r["ended"]))
        step_series = []
        loss_rows: list[tuple] = []
        for r in ranks:
            rows = db.execute(
                "SELECT step_lo, step_hi, step_ms_min, step_ms_max, step_ms_sum, step_ms_n, loss_min, loss_max,"
                " loss_sum, loss_n FROM series WHERE run_id = ? AND rank = ? ORDER BY bucket", (run_id, r["rank"])
            ).fetchall()
            step_series.append(_series_from_rows(f"rank {r['rank']}", [x[:6] for x in rows]))
            if not loss_rows:
                loss_rows = [(x[0], x[1], x[6], x[7], x[8], x[9]) for x in rows]
        ratio_name, _ = worst_ratio(next((_loads(r["ratios"]) for r in ranks if r["ratios"]), None))
        loss_ratio = None
        if ratio_name is not None:
            rank0 = ranks[0]["rank"]
            rows = db.execute(
                "SELECT step_lo, step_hi, vmin, vmax, vsum, n FROM series_extra WHERE run_id = ? AND rank = ?"
                " AND metric = ? ORDER BY bucket", (run_id, rank0, "ratio/" + ratio_name)).fetchall()
            loss_ratio = _series_from_rows(ratio_name, rows)
        evals, eval_name = self._evals(db, run_id)
        heat, heat_steps = _heatmap(step_series, HEAT_COLUMNS)
        return RunDetail(
            run=run, ranks=tuple(rank_rows), step_time=tuple(step_series), loss_ratio=loss_ratio,
            ratio_name=ratio_name, train_metric=_series_from_rows("train loss", loss_rows) if loss_rows else None,
            eval_metric_name=eval_name, evals=evals, heatmap=heat, heat_steps=heat_steps,
            nodes=self._nodes(db, run_id), outcomes=self._outcomes(db, run_id), errors=self._errors(db, run_id),
            now=now)

    def _evals(self, db: sqlite3.Connection, run_id: int) -> tuple[tuple[EvalPoint, ...], Optional[str]]:
        bodies = [_loads(b) or {} for (b,) in db.execute(
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

    def _nodes(self, db: sqlite3.Connection, run_id: int) -> tuple[NodeMetrics, ...]:
        out = []
        for node, ts, cpu, used, total, gpus in db.execute(
            "SELECT s.node, s.ts, s.cpu_pct, s.ram_used, s.ram_total, s.gpus FROM system s JOIN"
            " (SELECT node, max(ts) AS ts FROM system WHERE run_id = ? GROUP BY node) m"
            " ON s.node = m.node AND s.ts = m.ts WHERE s.run_id = ? ORDER BY s.node", (run_id, run_id)
        ):
            g = []
            for item in _loads(gpus) or []:
                if isinstance(item, dict):
                    g.append((int(item.get("index", 0)), _num(item.get("util_pct")), item.get("mem_used"),
                              item.get("mem_total")))
            out.append(NodeMetrics(node, ts, cpu, used, total, tuple(g)))
        return tuple(out)

    def _outcomes(self, db: sqlite3.Connection, run_id: int) -> tuple[Outcome, ...]:
        out = []
        for key, content, error in db.execute(
            "SELECT key, content, error FROM side_files WHERE run_id = ? AND kind = 'outcome' ORDER BY key",
            (run_id,)
        ):
            o = _loads(content) or {}
            t = o.get("training") if isinstance(o.get("training"), dict) else {}
            node = o.get("node_rank") if isinstance(o.get("node_rank"), int) else int(key or 0)
            status = str(t.get("status") or ("invalid" if error else "unknown"))
            reasons = ("node_training_failed",) if status == "failed" else (("node_outcome_invalid",) if error else ())
            out.append(Outcome(node, status, t.get("exit_code"), reasons))
        return tuple(out)

    def _errors(self, db: sqlite3.Connection, run_id: int) -> tuple[IngestError, ...]:
        return tuple(IngestError(p, o, m) for p, o, m in db.execute(
            "SELECT path, offset, message FROM errors WHERE run_id = ? ORDER BY error_id DESC LIMIT ?",
            (run_id, MAX_ERRORS)))

    # -- backlog
    def backlog(self, run_id: Optional[int] = None) -> BacklogSnapshot:
        now = self.clock()
        db = self._db()
        if db is None:
            return BacklogSnapshot((), (), None, None, None, now)
        where, args = ("WHERE s.run_id = ?", (run_id,)) if run_id is not None else ("", ())
        per_run: dict[int, dict[str, Any]] = {}
        names: dict[int, tuple[str, Optional[int]]] = {
            rid: (name, step) for rid, name, step in db.execute("SELECT run_id, name, last_step FROM runs")}
        for rid, kind, key, content in db.execute(
            f"SELECT s.run_id, s.kind, s.key, s.content FROM side_files s {where}"
            f"{' AND' if where else ' WHERE'} s.kind IN ('request', 'claim', 'receipt', 'failure')", args
        ):
            body = _loads(content)
            if not isinstance(body, dict):
                continue
            d = per_run.setdefault(rid, {"request": [], "claim": {}, "receipt": {}, "failure": {}})
            ckpt = str(body.get("checkpoint") or key)
            if kind == "request":
                d["request"].append(body)
            elif kind == "failure":
                d["failure"].setdefault(ckpt, []).append(body)
            else:
                d[kind][ckpt] = body
        items: list[BacklogItem] = []
        newest = None
        lag = train_step = None
        for rid, d in sorted(per_run.items()):
            name, step = names.get(rid, (str(rid), None))
            d["request"].sort(key=lambda r: (r.get("step") or 0, str(r.get("checkpoint"))))
            for f in d["failure"].values():
                f.sort(key=lambda x: x.get("attempt") or 0)
            run_items = backlog_items(name, d["request"], d["claim"], d["receipt"], d["failure"], now)
            items += run_items
            done = [i for i in run_items if i.state == "completed" and i.step is not None]
            if done:
                best = max(done, key=lambda i: i.step)
                if newest is None or (best.step or 0) > (newest[2] or 0):
                    newest = (name, best.checkpoint, best.step)
                    if step is not None:
                        train_step, lag = step, max(0, step - best.step)
            elif step is not None and run_id is not None:
                train_step = step
        counts = {s: 0 for s in ("pending", "claimed", "completed", "failed")}
        for i in items:
            counts[i.state] = counts.get(i.state, 0) + 1
        stuck = sum(1 for i in items if i.stuck)
        count_list = list(counts.items()) + ([("stuck", stuck)] if stuck else [])
        label = names.get(run_id, (None, None))[0] if run_id is not None else None
        return BacklogSnapshot(tuple(items), tuple(count_list), newest, lag, train_step, now, run=label)

    # -- compare
    def summary(self, spec: str) -> tuple[dict, str]:
        from traceml_tui.compare.load import read_summary

        path = Path(spec)
        if path.is_dir():
            path = path / "final_summary.json"
        if path.is_file():
            return read_summary(path), path.parent.name if path.name == "final_summary.json" else path.name
        db = self._db()
        if db is not None:
            row = db.execute(
                "SELECT s.content FROM side_files s JOIN runs r ON r.run_id = s.run_id"
                " WHERE r.name = ? AND s.kind = 'summary' AND s.content IS NOT NULL ORDER BY r.run_id DESC LIMIT 1",
                (spec,)).fetchone()
            if row:
                from traceml_tui.compare.load import parse_summary_bytes

                return parse_summary_bytes(row[0].encode("utf-8")), spec
        raise FileNotFoundError(f"no final summary for {spec!r} (not a file, a run directory, or a run in the index)")
