"""Read-only API over the index for the TUI and ``traceml status``.

Every method returns plain frozen dataclasses (no Textual, no SQLite rows),
and costs what it returns: aggregates and downsampled series were computed at
ingest time (:mod:`daemon.live`). :meth:`Reader.data_version` is one primary
key lookup, cheap enough to poll several times a second; when it moved,
:meth:`Reader.changes_since` names the runs that changed.

Run status is derived here because "stalled" depends on the clock: a run
with no new record for ``stall_factor`` times its typical step interval (and
at least ``stall_floor_s`` seconds) is stalled.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from . import index as idx

STATUSES = ("running", "stalled", "failed", "completed", "missing")


@dataclass(frozen=True)
class RunSummary:
    """One run as listed on the Runs screen."""

    run_id: int
    name: str
    dir: str
    root: str
    status: str  # running | stalled | failed | completed | missing
    missing: bool
    ranks: int
    ranks_ended: int
    last_step: Optional[int]
    last_ts: Optional[float]
    last_seen: Optional[float]
    steps_per_s: Optional[float]
    examples_per_s: Optional[float]
    slowest_rank: Optional[int]
    straggler_score: Optional[float]
    records: int
    errors: int
    manifest_status: Optional[str]
    training_status: Optional[str]
    outcomes_total: int
    outcomes_failed: int
    nnodes: Optional[int]
    nproc_per_node: Optional[int]
    world_size: Optional[int]
    started_at: Optional[str]
    ended_at: Optional[str]
    version: int


@dataclass(frozen=True)
class RankRow:
    """One (rank, attempt) of a run with its rolling figures."""

    rank: int
    attempt: int
    latest: bool  # the newest attempt of this rank
    records: int
    first_step: Optional[int]
    last_step: Optional[int]
    last_ts: Optional[float]
    last_seen: Optional[float]
    median_step_ms: Optional[float]
    median_input_wait_ms: Optional[float]
    median_interval_s: Optional[float]
    steps_per_s: Optional[float]
    examples_per_s: Optional[float]
    loss: Optional[float]
    ratios: tuple[tuple[str, float], ...]
    ended: Optional[str]
    exit_code: Optional[int]
    stalled: bool


@dataclass(frozen=True)
class Outcome:
    """One node's guard outcome (``nodes/node_<k>/guard_outcome.json``)."""

    node: Optional[int]
    status: Optional[str]
    exit_code: Optional[int]
    completed_at: Optional[str]
    error: Optional[str]


@dataclass(frozen=True)
class RunDetail:
    """Everything the Run detail screen shows above its charts."""

    run: RunSummary
    ranks: tuple[RankRow, ...]
    outcomes: tuple[Outcome, ...]
    manifest: Optional[dict]
    summary_status: Optional[str]
    nodes: tuple[int, ...]
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class SeriesPoint:
    step_lo: int
    step_hi: int
    vmin: float
    vmax: float
    mean: float
    n: int


@dataclass(frozen=True)
class Series:
    """A downsampled series: each point is one bucket of steps with its min, max and mean."""

    run_id: int
    rank: int
    metric: str
    width: int
    points: tuple[SeriesPoint, ...]


@dataclass(frozen=True)
class NodeSample:
    node: int
    ts: float
    cpu_pct: Optional[float]
    ram_used: Optional[int]
    ram_total: Optional[int]
    gpus: tuple[dict, ...]


@dataclass(frozen=True)
class BacklogItem:
    """One checkpoint of the validation backlog and where it stands."""

    checkpoint: str
    state: str  # pending | claimed | stale-claim | completed | failed
    step: Optional[int]
    created: Optional[float]
    claimed: Optional[float]
    heartbeat: Optional[float]
    lease_s: Optional[float]
    completed: Optional[float]
    failures: int
    last_error: Optional[str]
    metrics: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class IngestError:
    error_id: int
    run_id: int
    path: str
    offset: int
    length: Optional[int]
    message: str
    seen: float


@dataclass(frozen=True)
class Event:
    """A non-step record of a rank stream: eval, checkpoint, field_stats, rank_end."""

    kind: str
    rank: Optional[int]
    attempt: Optional[int]
    step: Optional[int]
    ts: Optional[float]
    body: dict


@dataclass(frozen=True)
class Changes:
    version: int
    run_ids: tuple[int, ...]


def derive_status(row: dict, now: float, stall_factor: float, stall_floor_s: float) -> str:
    """Status of a run from its stored signals (pure; see module docstring for "stalled")."""
    if row.get("missing"):
        return "missing"
    failed_words = {"failed", "interrupted", "incomplete"}
    signals = [row.get("manifest_status"), row.get("training_status"), row.get("summary_status")]
    total, ended, failed_ranks = row.get("ranks_total") or 0, row.get("ranks_ended") or 0, row.get("ranks_failed") or 0
    if row.get("outcomes_failed") or any(s in failed_words for s in signals) or (total and ended == total and failed_ranks):
        return "failed"
    if any(s == "completed" for s in signals) or (total and ended == total):
        return "completed"
    if is_stalled(row.get("last_seen"), row.get("median_interval_s"), now, stall_factor, stall_floor_s):
        return "stalled"
    return "running"


def is_stalled(last_seen: Optional[float], interval: Optional[float], now: float, factor: float, floor: float) -> bool:
    """True when nothing arrived for ``factor`` typical intervals (and at least ``floor`` seconds)."""
    if last_seen is None:
        return False
    limit = max(floor, factor * interval) if interval else floor
    return now - last_seen > limit


_RUN_COLS = ("run_id", "name", "dir", "root", "missing", "ranks_total", "ranks_ended", "ranks_failed", "last_step",
             "last_ts", "last_seen", "steps_per_s", "examples_per_s", "slowest_rank", "straggler_score", "records",
             "errors", "manifest_status", "training_status", "summary_status", "outcomes_total", "outcomes_failed",
             "nnodes", "nproc_per_node", "world_size", "started_at", "ended_at", "updated_version",
             "median_interval_s")
_RANK_COLS = ("rank", "attempt", "records", "first_step", "last_step", "last_ts", "last_seen", "median_step_ms",
              "median_input_wait_ms", "median_interval_s", "steps_per_s", "examples_per_s", "loss", "ratios", "ended",
              "exit_code")


def _num(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class Reader:
    """Read-only access to one index file.

    Raises ``FileNotFoundError`` when the index does not exist yet.
    """

    def __init__(self, index_path: str | os.PathLike[str], stall_factor: float = 5.0, stall_floor_s: float = 10.0):
        self.index_path = str(index_path)
        if not Path(self.index_path).is_file():
            raise FileNotFoundError(self.index_path)
        self.conn = idx.connect_reader(self.index_path)
        self.stall_factor = stall_factor
        self.stall_floor_s = stall_floor_s

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _rows(self, sql: str, params=()) -> list:
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []  # an index being created right now
            raise

    # ------------------------------------------------------------------ versions
    def data_version(self) -> int:
        """Monotonic counter bumped by every committed ingest batch."""
        rows = self._rows("SELECT v FROM version WHERE id = 1")
        return int(rows[0][0]) if rows else 0

    def changes_since(self, version: int) -> Changes:
        """The current version and the runs updated after ``version``."""
        current = self.data_version()
        ids = [r[0] for r in self._rows("SELECT run_id FROM runs WHERE updated_version > ? ORDER BY run_id", (version,))]
        return Changes(current, tuple(ids))

    # ------------------------------------------------------------------ runs
    def _summary(self, row: tuple, now: float) -> RunSummary:
        d = dict(zip(_RUN_COLS, row))
        return RunSummary(
            run_id=d["run_id"], name=d["name"], dir=d["dir"], root=d["root"],
            status=derive_status(d, now, self.stall_factor, self.stall_floor_s), missing=bool(d["missing"]),
            ranks=d["ranks_total"], ranks_ended=d["ranks_ended"], last_step=d["last_step"], last_ts=d["last_ts"],
            last_seen=d["last_seen"], steps_per_s=d["steps_per_s"], examples_per_s=d["examples_per_s"],
            slowest_rank=d["slowest_rank"], straggler_score=d["straggler_score"], records=d["records"],
            errors=d["errors"], manifest_status=d["manifest_status"], training_status=d["training_status"],
            outcomes_total=d["outcomes_total"], outcomes_failed=d["outcomes_failed"], nnodes=d["nnodes"],
            nproc_per_node=d["nproc_per_node"], world_size=d["world_size"], started_at=d["started_at"],
            ended_at=d["ended_at"], version=d["updated_version"],
        )

    def list_runs(self, roots: Optional[list[str]] = None, now: Optional[float] = None) -> tuple[RunSummary, ...]:
        """All runs (optionally only those under ``roots``), newest first."""
        now = time.time() if now is None else now
        rows = self._rows(f"SELECT {', '.join(_RUN_COLS)} FROM runs ORDER BY first_seen DESC, run_id DESC")
        runs = [self._summary(r, now) for r in rows]
        if roots:
            real = [os.path.realpath(r).rstrip("/") for r in roots]
            runs = [r for r in runs if any(r.dir == p or r.dir.startswith(p + "/") for p in real)]
        return tuple(runs)

    def run(self, run_id: int, now: Optional[float] = None) -> Optional[RunSummary]:
        """One run's summary, or None."""
        rows = self._rows(f"SELECT {', '.join(_RUN_COLS)} FROM runs WHERE run_id = ?", (run_id,))
        return self._summary(rows[0], time.time() if now is None else now) if rows else None

    def find_run(self, name_or_dir: str) -> Optional[RunSummary]:
        """A run by directory or by name (the newest with that name)."""
        real = os.path.realpath(name_or_dir)
        for run in self.list_runs():
            if run.dir == real:
                return run
        for run in self.list_runs():
            if run.name == name_or_dir:
                return run
        return None

    def rank_rows(self, run_id: int, now: Optional[float] = None) -> tuple[RankRow, ...]:
        """Per (rank, attempt) rows, ordered by rank then attempt."""
        now = time.time() if now is None else now
        rows = self._rows(f"SELECT {', '.join(_RANK_COLS)} FROM rank_live WHERE run_id = ? ORDER BY rank, attempt",
                          (run_id,))
        latest: dict[int, int] = {}
        for r in rows:
            latest[r[0]] = max(latest.get(r[0], r[1]), r[1])
        out = []
        for r in rows:
            d = dict(zip(_RANK_COLS, r))
            ratios = tuple(sorted(json.loads(d["ratios"]).items())) if d["ratios"] else ()
            is_latest = latest[d["rank"]] == d["attempt"]
            stalled = bool(is_latest and not d["ended"] and is_stalled(
                d["last_seen"], d["median_interval_s"], now, self.stall_factor, self.stall_floor_s))
            out.append(RankRow(latest=is_latest, stalled=stalled, ratios=ratios,
                               **{k: v for k, v in d.items() if k != "ratios"}))
        return tuple(out)

    def run_detail(self, run_id: int, now: Optional[float] = None) -> Optional[RunDetail]:
        """Summary, rank rows, outcomes, manifest and the metric names with series."""
        now = time.time() if now is None else now
        run = self.run(run_id, now)
        if run is None:
            return None
        outcomes = []
        manifest = summary_status = None
        for path, kind, key, content, error in self._rows(
            "SELECT path, kind, key, content, error FROM side_files WHERE run_id = ? AND kind IN"
            " ('manifest', 'outcome', 'summary')", (run_id,)
        ):
            body = json.loads(content) if content else {}
            if kind == "manifest":
                manifest = body or None
            elif kind == "summary":
                ctx = body.get("run_context") if isinstance(body.get("run_context"), dict) else {}
                r = ctx.get("run") if isinstance(ctx.get("run"), dict) else {}
                summary_status = r.get("status") if isinstance(r.get("status"), str) else None
            else:
                t = body.get("training") if isinstance(body.get("training"), dict) else {}
                node = body.get("node_rank") if isinstance(body.get("node_rank"), int) else (
                    int(key) if key and key.isdigit() else None)
                outcomes.append(Outcome(node, t.get("status") if isinstance(t.get("status"), str) else None,
                                        t.get("exit_code") if isinstance(t.get("exit_code"), int) else None,
                                        body.get("completed_at") if isinstance(body.get("completed_at"), str) else None,
                                        error))
        nodes = tuple(r[0] for r in self._rows("SELECT DISTINCT node FROM files WHERE run_id = ? AND node IS NOT NULL"
                                               " ORDER BY node", (run_id,)))
        return RunDetail(run, self.rank_rows(run_id, now), tuple(sorted(outcomes, key=lambda o: (o.node is None, o.node or 0))),
                         manifest, summary_status, nodes, self.series_metrics(run_id))

    # ------------------------------------------------------------------ series
    def series_metrics(self, run_id: int) -> tuple[str, ...]:
        """Names of the metrics that have series in this run."""
        names = []
        for m in idx.SERIES_METRICS:
            if self._rows(f"SELECT 1 FROM series WHERE run_id = ? AND {m}_n > 0 LIMIT 1", (run_id,)):
                names.append(m)
        names += [r[0] for r in self._rows("SELECT DISTINCT metric FROM series_extra WHERE run_id = ? ORDER BY metric",
                                           (run_id,))]
        return tuple(names)

    def series(self, run_id: int, rank: int, metric: str, max_points: Optional[int] = None) -> Series:
        """Downsampled series of ``metric`` (e.g. ``step_ms``, ``loss``, ``ratio/<component>``) for one rank."""
        width_rows = self._rows("SELECT width FROM series_width WHERE run_id = ? AND rank = ?", (run_id, rank))
        width = width_rows[0][0] if width_rows else 1
        if metric in idx.SERIES_METRICS:
            rows = self._rows(
                f"SELECT step_lo, step_hi, {metric}_min, {metric}_max, {metric}_sum, {metric}_n FROM series"
                f" WHERE run_id = ? AND rank = ? AND {metric}_n > 0 ORDER BY bucket", (run_id, rank))
        else:
            rows = self._rows("SELECT step_lo, step_hi, vmin, vmax, vsum, n FROM series_extra WHERE run_id = ?"
                              " AND rank = ? AND metric = ? AND n > 0 ORDER BY bucket", (run_id, rank, metric))
        points = [SeriesPoint(lo, hi, vmin, vmax, vsum / n, n) for lo, hi, vmin, vmax, vsum, n in rows]
        if max_points and len(points) > max_points:
            factor = -(-len(points) // max_points)
            merged = []
            for i in range(0, len(points), factor):
                g = points[i:i + factor]
                n = sum(p.n for p in g)
                merged.append(SeriesPoint(g[0].step_lo, g[-1].step_hi, min(p.vmin for p in g), max(p.vmax for p in g),
                                          sum(p.mean * p.n for p in g) / n, n))
            points = merged
            width *= factor
        return Series(run_id, rank, metric, width, tuple(points))

    # ------------------------------------------------------------------ nodes, backlog, errors
    def node_samples(self, run_id: int, node: Optional[int] = None, limit: int = 300) -> tuple[NodeSample, ...]:
        """The newest ``limit`` system samples (per node when ``node`` is None), oldest first."""
        nodes = [node] if node is not None else [r[0] for r in self._rows(
            "SELECT DISTINCT node FROM system WHERE run_id = ?", (run_id,))]
        out = []
        for n in sorted(nodes):
            rows = self._rows("SELECT node, ts, cpu_pct, ram_used, ram_total, gpus FROM system WHERE run_id = ? AND"
                              " node = ? ORDER BY ts DESC LIMIT ?", (run_id, n, limit))
            for nd, ts, cpu, used, total, gpus in reversed(rows):
                out.append(NodeSample(nd, ts, cpu, used, total, tuple(json.loads(gpus)) if gpus else ()))
        return tuple(out)

    def backlog(self, run_id: int, now: Optional[float] = None) -> tuple[BacklogItem, ...]:
        """Validation backlog items of a run, by step (newest last)."""
        now = time.time() if now is None else now
        items: dict[str, dict] = {}
        for kind, key, content in self._rows(
            "SELECT kind, key, content FROM side_files WHERE run_id = ? AND kind IN"
            " ('request', 'claim', 'receipt', 'failure') AND content IS NOT NULL", (run_id,)
        ):
            body = json.loads(content)
            item = items.setdefault(key, {"failures": []})
            if kind == "failure":
                item["failures"].append(body)
            else:
                item[kind] = body
        out = []
        for checkpoint, item in items.items():
            req, claim, receipt = item.get("request") or {}, item.get("claim") or {}, item.get("receipt") or {}
            failures = sorted(item["failures"], key=lambda f: _num(f.get("failed")) or 0)
            heartbeat, lease = _num(claim.get("heartbeat")), _num(claim.get("lease_s"))
            if receipt:
                state = "completed"
            elif claim:
                state = "stale-claim" if heartbeat is not None and lease is not None and now > heartbeat + lease else "claimed"
            elif failures:
                state = "failed"
            else:
                state = "pending"
            step = req.get("step") if isinstance(req.get("step"), int) else (
                receipt.get("step") if isinstance(receipt.get("step"), int) else None)
            metrics = receipt.get("metrics") if isinstance(receipt.get("metrics"), dict) else {}
            out.append(BacklogItem(
                checkpoint=checkpoint, state=state, step=step, created=_num(req.get("created")),
                claimed=_num(claim.get("claimed")), heartbeat=heartbeat, lease_s=lease,
                completed=_num(receipt.get("completed")), failures=len(failures),
                last_error=str(failures[-1].get("error")) if failures else None,
                metrics=tuple(sorted(metrics.items())),
            ))
        out.sort(key=lambda b: (b.step is None, b.step or 0, b.checkpoint))
        return tuple(out)

    def errors(self, run_id: Optional[int] = None, limit: int = 100, after_id: int = 0) -> tuple[IngestError, ...]:
        """Ingest errors (newest ``limit`` after ``after_id``), oldest first."""
        where, params = "error_id > ?", [after_id]
        if run_id is not None:
            where += " AND run_id = ?"
            params.append(run_id)
        rows = self._rows(f"SELECT error_id, run_id, path, offset, length, message, seen FROM errors WHERE {where}"
                          " ORDER BY error_id DESC LIMIT ?", (*params, limit))
        return tuple(IngestError(*r) for r in reversed(rows))

    def events(self, run_id: int, kind: Optional[str] = None, limit: int = 200) -> tuple[Event, ...]:
        """The newest ``limit`` events of a run (optionally one kind), in step order."""
        where, params = "run_id = ?", [run_id]
        if kind is not None:
            where += " AND kind = ?"
            params.append(kind)
        rows = self._rows(f"SELECT kind, rank, attempt, step, ts, body FROM events WHERE {where}"
                          " ORDER BY step DESC, ts DESC LIMIT ?", (*params, limit))
        return tuple(Event(k, r, a, st, ts, json.loads(body)) for k, r, a, st, ts, body in reversed(rows))

    def step_count(self, run_id: int) -> int:
        """Number of step rows of a run (for tests and diagnostics; cost grows with the run)."""
        return int(self._rows("SELECT count(*) FROM steps WHERE run_id = ?", (run_id,))[0][0])
