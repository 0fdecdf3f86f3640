"""Read-only API over the index: the only code that reads it with SQL.

Every method returns frozen dataclasses with states already decided by
:mod:`traceml_tui.core.state` (no Textual, no SQLite rows), and costs what it
returns: aggregates and downsampled series were computed at ingest time
(:mod:`daemon.live`). :meth:`Reader.data_version` is one primary-key lookup,
cheap enough to poll several times a second; when it moved,
:meth:`Reader.changes_since` names the runs that changed.

``traceml status``, ``traceml watch`` and its alerts all read runs through
:meth:`Reader.list_runs`, so they show the same word for the same run; they
read a run's figures (step time, Δ, straggler, steps/s, eval lag, the
early-stopping best) from the views of :mod:`daemon.views`
(:meth:`Reader.runs_view`, :meth:`Reader.figures`, :meth:`Reader.run_view`,
:meth:`Reader.backlog_view`), so they show the same number too.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from traceml_tui.core import artifacts, coverage, freshness, hygiene_files, stopping, straggler
from traceml_tui.core import backlog as core_backlog
from traceml_tui.core import hang as hangs_mod
from traceml_tui.core.rundir import RunDir
from traceml_tui.core.state import (
    BACKLOG_ORDER,
    STALL_FLOOR_S,
    STOPPED_RANK_STATES,
    BacklogState,
    LeaseFacts,
    RankFacts,
    RankState,
    RunFacts,
    RunStatus,
    decide_run,
    describe,
    lost_nodes,
    summary_is_current,
    with_exit_codes,
)

from . import index as idx
from . import views
from .leases import lease_facts

#: Which rank states explain a run's word (RunSummary.explaining_ranks).
_EXPLAINED_BY = {RunStatus.STALLED: (RankState.STALLED, RankState.LOST), RunStatus.LOST: (RankState.LOST,),
                 RunStatus.FAILED: (RankState.FAILED, RankState.LOST)}


@dataclass(frozen=True)
class RunSummary:
    """One run as listed by ``traceml status`` and the Runs screen."""

    run_id: int
    name: str
    dir: str
    root: str
    status: RunStatus
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
    median_interval_s: Optional[float] = None
    rank_states: tuple[tuple[int, RankState], ...] = ()  # (rank, state) of each rank's newest attempt
    # Nodes whose launcher lease expired while another node's did not (core.state.lost_nodes): `lost node 1`.
    lost_nodes: tuple[int, ...] = ()
    # The hang its ranks' watchdogs recorded, when core.state.hang_roles names a culprit (core/hang.py)
    hang: Optional[hangs_mod.HangReport] = None
    # The run's step time (views.STEP_STATISTIC of its median rank) and the straggler rule's verdict on its ranks
    # (core/straggler.py): slowest_rank and straggler_score above come from the same spread.
    step_ms: Optional[float] = None
    straggler_pct: Optional[float] = None
    straggler: bool = False

    @property
    def status_text(self) -> str:
        """The run's word and what explains it, as every surface prints it (``failed r0 · lost node 1``)."""
        return describe(self.status, self.explaining_ranks, self.lost_nodes)

    def ranks_in(self, *states: RankState) -> tuple[int, ...]:
        """The ranks whose newest attempt is in one of ``states``."""
        return tuple(r for r, s in self.rank_states if s in states)

    @property
    def first_failed(self) -> Optional[int]:
        """The rank that failed first: the core marks every later failure ``aborted``, so it is the one failed or
        lost rank of a failed or lost run (None: not failed, or no single such rank)."""
        if self.status not in (RunStatus.FAILED, RunStatus.LOST):
            return None
        first = self.ranks_in(RankState.FAILED, RankState.LOST)
        return first[0] if len(first) == 1 else None

    @property
    def silent_ranks(self) -> tuple[int, ...]:
        """Ranks that stopped writing without an end: stalled or lost."""
        return self.ranks_in(RankState.STALLED, RankState.LOST)

    @property
    def explaining_ranks(self) -> tuple[int, ...]:
        """The ranks every surface names beside the run's word (``stalled r1``, ``failed r1``): the stalled
        ranks of a stalled run, the lost ones of a lost run, the failed or lost one of a failed run (its
        aborted peers are not named: they died because of it)."""
        return self.ranks_in(*_EXPLAINED_BY.get(self.status, ()))


@dataclass(frozen=True)
class RankRow:
    """One (rank, attempt) of a run with its rolling figures; ``state`` is decided for the newest attempt."""

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
    end_ts: Optional[float]
    node: Optional[int]
    state: Optional[RankState]  # None for an older attempt (superseded by a resume)
    # The window's step time and its parts, averaged over the same steps by core.steptime.average_parts:
    # {"whole": ms, "data_wait": ms | None, "between_steps": …, "h2d", "forward", "backward", "optimizer",
    # "residual" (None: not measured), "traced": ms, "steps": n, "steps_without_gap": n, "clock": "cpu" | "gpu"};
    # None when no step had a traced time. median_step_ms / median_input_wait_ms are on the same clock.
    step_parts: Optional[dict[str, Any]] = field(default=None, hash=False)

    @property
    def stalled(self) -> bool:
        return self.state is RankState.STALLED


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
    """Everything the Run screen shows above its charts."""

    run: RunSummary
    ranks: tuple[RankRow, ...]
    outcomes: tuple[Outcome, ...]
    manifest: Optional[artifacts.Manifest]
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


#: One checkpoint of the validation backlog and where it stands (assembled once, in core: docs/contracts.md).
BacklogItem = core_backlog.BacklogEntry


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
class LogFile:
    """One node's training log: ``stream`` is ``stdout`` or ``stderr``; ``rel`` is relative to the run directory."""

    node: int
    stream: str
    rel: str


@dataclass(frozen=True)
class Changes:
    version: int
    run_ids: tuple[int, ...]


_RUN_COLS = ("run_id", "name", "dir", "root", "missing", "ranks_total", "ranks_ended", "last_step",
             "last_ts", "last_seen", "steps_per_s", "examples_per_s", "slowest_rank", "straggler_score", "records",
             "errors", "manifest_status", "training_status", "summary_status", "outcomes_total", "outcomes_failed",
             "nnodes", "nproc_per_node", "world_size", "started_at", "ended_at", "updated_version",
             "median_interval_s", "outcome_nodes", "launcher_exit_codes")
_RANK_COLS = ("rank", "attempt", "records", "first_step", "last_step", "last_ts", "last_seen", "median_step_ms",
              "median_input_wait_ms", "median_interval_s", "steps_per_s", "examples_per_s", "loss", "ratios", "ended",
              "exit_code", "end_ts", "node", "step_parts")
_LATEST = ("attempt = (SELECT max(attempt) FROM rank_live WHERE run_id = r.run_id AND rank = r.rank)")


def _num(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _loads(text: Optional[str]) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: content stored before nesting was bounded
        return None


def _nodes_of(text: Optional[str]) -> frozenset[int]:
    if not text:
        return frozenset()
    return frozenset(int(p) for p in str(text).split(",") if p.strip().lstrip("-").isdigit())


def _exit_codes_of(text: str) -> dict[int, int]:
    """``runs.launcher_exit_codes`` (JSON rank -> code, written by the index from the summary) as a mapping."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {int(k): v for k, v in data.items() if k.lstrip("-").isdigit() and type(v) is int}


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
        self._manifests: dict[int, tuple[int, Optional[artifacts.Manifest]]] = {}

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
        return _num(rows[0][0]) if rows else None

    def changes_since(self, version: int) -> Changes:
        """The current version and the runs updated after ``version``."""
        current = self.data_version()
        ids = [r[0] for r in self._rows("SELECT run_id FROM runs WHERE updated_version > ? ORDER BY run_id", (version,))]
        return Changes(current, tuple(ids))

    # ------------------------------------------------------------------ runs
    def _rank_rows(self, where: str, params: tuple) -> dict[int, list[dict]]:
        out: dict[int, list[dict]] = {}
        for row in self._rows(f"SELECT run_id, {', '.join(_RANK_COLS)} FROM rank_live r WHERE {where}"
                              " ORDER BY run_id, rank, attempt", params):
            out.setdefault(row[0], []).append(dict(zip(_RANK_COLS, row[1:])))
        return out

    def _leases(self, run_id: Optional[int] = None) -> dict[int, tuple[LeaseFacts, ...]]:
        """The launcher leases of every run (or one), as the core's facts (daemon/leases.py)."""
        rows: dict[int, list[tuple]] = {}
        where, params = ("WHERE run_id = ?", (run_id,)) if run_id is not None else ("", ())
        for row in self._rows(f"SELECT run_id, node, done, lease_s, changed_at, checked_at FROM leases {where}",
                              params):
            rows.setdefault(row[0], []).append(row[1:])
        return {rid: lease_facts(r) for rid, r in rows.items()}

    def _current_hangs(self, run_id: int, latest: list[dict]) -> dict:
        """Each rank's newest hang record that still speaks for its silence (core.hang.current_hang)."""
        newest = {r["rank"]: r for r in latest}
        found: dict = {}
        for body, in self._rows("SELECT body FROM events WHERE run_id = ? AND kind = 'hang' ORDER BY step, ts",
                                (run_id,)):
            rec = hangs_mod.decode_hang(_loads(body) or {})
            row = newest.get(rec.rank) if rec is not None else None
            if row is not None and hangs_mod.current_hang(rec, row["attempt"], row["last_step"]):
                found[rec.rank] = rec
        return found

    def _decide(self, d: dict, latest: list[dict], now: float, leases: tuple[LeaseFacts, ...] = ()
                ) -> tuple[RunStatus, tuple[tuple[int, RankState], ...], Optional[hangs_mod.HangReport]]:
        outcome_nodes = _nodes_of(d.get("outcome_nodes"))
        ranks = tuple(
            RankFacts(rank=r["rank"], last_ts=r["last_ts"], end_status=r["ended"], end_exit_code=r["exit_code"],
                      end_ts=r["end_ts"], node_outcome_written=r["node"] is not None and r["node"] in outcome_nodes,
                      last_seen=r["last_seen"], node=r["node"])
            for r in latest)
        if d["launcher_exit_codes"] and summary_is_current(d["manifest_status"]):  # codes end records lacked
            ranks = with_exit_codes(ranks, _exit_codes_of(d["launcher_exit_codes"]))
        def decide(ranks: tuple[RankFacts, ...]):
            return decide_run(RunFacts(
                ranks=ranks, now=now, median_interval_s=d["median_interval_s"], last_ingest=d["last_seen"],
                manifest_status=d["manifest_status"], summary_status=d["summary_status"],
                guard_training_status=d["training_status"], outcome_failed=d["outcomes_failed"] or 0,
                missing=bool(d["missing"]), stall_floor_s=self.stall_floor_s, leases=leases))

        verdict, report = decide(ranks), None
        # Hang forensics only where it can matter: several ranks, one of them stopped (a query per such run).
        if len(ranks) > 1 and any(s in STOPPED_RANK_STATES for s in verdict.ranks):
            hangs = self._current_hangs(d["run_id"], latest)
            if hangs:
                ranks = tuple(replace(f, hang=hangs_mod.fact_of(hangs[f.rank])) if f.rank in hangs else f
                              for f in ranks)
                verdict = decide(ranks)
                report = hangs_mod.hang_report(ranks, verdict.ranks, hangs)
        return verdict.status, tuple((f.rank, s) for f, s in zip(ranks, verdict.ranks)), report

    def _summary(self, row: tuple, latest: list[dict], now: float, leases: tuple[LeaseFacts, ...] = ()) -> RunSummary:
        d = dict(zip(_RUN_COLS, row))
        status, rank_states, hang = self._decide(d, latest, now, leases)
        # One statistic, one rule (docs/contracts.md "One set of figures"): not the ingest-time roll-up's score.
        step_ms, slowest, score, skew, verdict = views.step_figures(
            straggler.spread((r["rank"], r["median_step_ms"]) for r in latest))
        return RunSummary(
            run_id=d["run_id"], name=d["name"], dir=d["dir"], root=d["root"], status=status,
            missing=bool(d["missing"]), ranks=d["ranks_total"], ranks_ended=d["ranks_ended"],
            last_step=d["last_step"], last_ts=d["last_ts"], last_seen=d["last_seen"], steps_per_s=d["steps_per_s"],
            examples_per_s=d["examples_per_s"], slowest_rank=slowest,
            straggler_score=score, records=d["records"], errors=d["errors"],
            manifest_status=d["manifest_status"], training_status=d["training_status"],
            outcomes_total=d["outcomes_total"], outcomes_failed=d["outcomes_failed"], nnodes=d["nnodes"],
            nproc_per_node=d["nproc_per_node"], world_size=d["world_size"], started_at=d["started_at"],
            ended_at=d["ended_at"], version=d["updated_version"], median_interval_s=d["median_interval_s"],
            rank_states=rank_states, lost_nodes=lost_nodes(leases), hang=hang,
            step_ms=step_ms, straggler_pct=skew, straggler=verdict,
        )

    def list_runs(self, roots: Optional[list[str]] = None, now: Optional[float] = None) -> tuple[RunSummary, ...]:
        """All runs (optionally only those under ``roots``), most recently active first, with states decided."""
        now = time.time() if now is None else now
        rows = self._rows(f"SELECT {', '.join(_RUN_COLS)} FROM runs"
                          " ORDER BY coalesce(last_ts, first_seen) DESC, run_id DESC")
        if roots:
            real = [os.path.realpath(r).rstrip("/") for r in roots]
            rows = [r for r in rows if any(r[2] == p or r[2].startswith(p + "/") for p in real)]
        latest = self._rank_rows(_LATEST, ())
        leases = self._leases()
        return tuple(self._summary(r, latest.get(r[0], []), now, leases.get(r[0], ())) for r in rows)

    def run(self, run_id: int, now: Optional[float] = None) -> Optional[RunSummary]:
        """One run's summary, or None."""
        rows = self._rows(f"SELECT {', '.join(_RUN_COLS)} FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            return None
        latest = self._rank_rows(f"run_id = ? AND {_LATEST}", (run_id,))
        return self._summary(rows[0], latest.get(run_id, []), time.time() if now is None else now,
                             self._leases(run_id).get(run_id, ()))

    def find_run(self, name_or_dir: str) -> Optional[RunSummary]:
        """A run by directory or by name (the newest with that name)."""
        real = os.path.realpath(name_or_dir)
        runs = self.list_runs()
        for run in runs:
            if run.dir == real:
                return run
        for run in runs:
            if run.name == name_or_dir:
                return run
        return None

    def rank_rows(self, run_id: int, now: Optional[float] = None) -> tuple[RankRow, ...]:
        """Per (rank, attempt) rows, ordered by rank then attempt; the newest attempt carries the state."""
        run = self.run(run_id, now)
        states = dict(run.rank_states) if run is not None else {}
        rows = self._rank_rows("run_id = ?", (run_id,)).get(run_id, [])
        latest: dict[int, int] = {}
        for d in rows:
            latest[d["rank"]] = max(latest.get(d["rank"], d["attempt"]), d["attempt"])
        out = []
        for d in rows:
            is_latest = latest[d["rank"]] == d["attempt"]
            ratios = _loads(d["ratios"]) or {}
            parts = _loads(d["step_parts"])
            out.append(RankRow(latest=is_latest, state=states.get(d["rank"]) if is_latest else None,
                               ratios=tuple(sorted(ratios.items())),
                               step_parts=parts if isinstance(parts, dict) else None,
                               **{k: v for k, v in d.items() if k not in ("ratios", "step_parts")}))
        return tuple(out)

    def manifest(self, run_id: int, version: Optional[int] = None) -> Optional[artifacts.Manifest]:
        """The run's manifest, typed (None when absent or unreadable); cached per run data version."""
        cached = self._manifests.get(run_id)
        if cached is not None and version is not None and cached[0] == version:
            return cached[1]
        rows = self._rows("SELECT content FROM side_files WHERE run_id = ? AND kind = 'manifest'"
                          " AND content IS NOT NULL", (run_id,))
        manifest = artifacts.decode_manifest(rows[0][0]) if rows else None
        if version is not None:
            self._manifests[run_id] = (version, manifest)
        return manifest

    def summary_bytes(self, run_id: int) -> Optional[bytes]:
        """The run's ``final_summary.json`` as ingested, or None."""
        rows = self._rows("SELECT content FROM side_files WHERE run_id = ? AND kind = 'summary'"
                          " AND content IS NOT NULL", (run_id,))
        return rows[0][0].encode("utf-8") if rows else None

    def failure(self, run_id: int) -> Optional[artifacts.FailureSection]:
        """The ``failure`` section of the run's final summary as ingested (who, where, why), or None (also
        while a resumed attempt runs: that summary is the previous attempt's, core.state.summary_is_current)."""
        if not summary_is_current(self._run_value(run_id, "manifest_status")):
            return None
        content = self.summary_bytes(run_id)
        return artifacts.decode_failure(content) if content is not None else None

    def validation(self, run_id: int) -> Optional[artifacts.ValidationSection]:
        """The ``validation`` section of the run's final summary as ingested (backlog counts, best checkpoint,
        early-stopping state at the end), or None (no summary yet, or a run without validation)."""
        content = self.summary_bytes(run_id)
        return artifacts.decode_validation(content) if content is not None else None

    def early_stopping(self, run_id: int) -> Optional[stopping.StoppingView]:
        """The early-stopping policy's own state (``early_stopping.json`` as indexed): best value and step, patience
        used, stopped or not and why, ``min_delta`` and warm-up as the policy file says; None when the run has no
        such file or it is damaged (its error row names it)."""
        rows = self._rows("SELECT content FROM side_files WHERE run_id = ? AND kind = 'early_stopping'"
                          " AND content IS NOT NULL AND error IS NULL", (run_id,))
        if not rows:
            return None
        try:
            return stopping.stopping_view(hygiene_files.decode_early_stopping(rows[0][0]))
        except hygiene_files.DamagedFile:
            return None

    def log_files(self, run_id: int) -> tuple[str, tuple[LogFile, ...]]:
        """The run's directory and its nodes' training logs (stdout, stderr; paths from core.rundir).

        The index does not hold the logs: ``traceml watch``'s log view reads
        these files itself, read-only and bounded (docs/watch.md). A node
        folder is listed when it exists; a log that does not exist yet is
        still named (a live run may create it later). Unknown run: ``("", ())``.
        """
        rows = self._rows("SELECT dir FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            return "", ()
        layout = RunDir(rows[0][0])
        out = []
        for node in layout.node_ranks():
            for stream, path in (("stdout", layout.stdout_log(node)), ("stderr", layout.stderr_log(node))):
                out.append(LogFile(node, stream, path.relative_to(layout.path).as_posix()))
        return str(layout.path), tuple(out)

    def run_detail(self, run_id: int, now: Optional[float] = None) -> Optional[RunDetail]:
        """Summary, rank rows, outcomes, manifest and the metric names with series."""
        now = time.time() if now is None else now
        run = self.run(run_id, now)
        if run is None:
            return None
        outcomes = []
        for key, content, error in self._rows(
            "SELECT key, content, error FROM side_files WHERE run_id = ? AND kind = 'outcome'", (run_id,)
        ):
            o = artifacts.decode_outcome(content) if content else None
            node = o.node_rank if o is not None and o.node_rank is not None else (
                int(key) if key and key.isdigit() else None)
            if o is None:
                outcomes.append(Outcome(node, None, None, None, error or "not a node outcome"))
            else:
                outcomes.append(Outcome(node, o.training.status, o.training.exit_code, o.completed_at, error))
        nodes = tuple(r[0] for r in self._rows("SELECT DISTINCT node FROM files WHERE run_id = ? AND node IS NOT NULL"
                                               " ORDER BY node", (run_id,)))
        return RunDetail(run, self.rank_rows(run_id, now),
                         tuple(sorted(outcomes, key=lambda o: (o.node is None, o.node or 0))),
                         self.manifest(run_id, run.version), self._summary_status(run_id), nodes,
                         self.series_metrics(run_id))

    # ------------------------------------------------------------------ views (daemon/views.py)
    def runs_view(self, roots: Optional[list[str]] = None, now: Optional[float] = None) -> views.RunsView:
        """Every run (optionally only those under ``roots``) with its states and step-time figures decided."""
        version = self.data_version()
        return views.RunsView(runs=self.list_runs(roots, now), version=version,
                              backlog_outstanding=tuple(sorted(self.backlog_outstanding().items())),
                              indexing=self.ingest_progress())

    def figures(self, run: RunSummary, now: Optional[float] = None,
                backlog: Optional[tuple[BacklogItem, ...]] = None) -> views.RunFigures:
        """The figures every surface shows for ``run`` (a few queries: the caller caches them per run version)."""
        backlog = self.backlog(run.run_id, now=now) if backlog is None else backlog
        # Eval freshness and the early-stopping best from the reader's functions as they are now; when core holds
        # the typed backlog and eval-freshness rules, these two lines call those instead.
        eval_step = self.newest_evaluated_step(run.run_id)
        manifest = self.manifest(run.run_id, run.version)
        early = views.early_stopping(self.validation(run.run_id), manifest, backlog, self.early_stopping(run.run_id))
        declared = manifest.last_step_ahead(run.last_step) if manifest is not None else None
        latest = self._rank_rows(f"run_id = ? AND {_LATEST}", (run.run_id,)).get(run.run_id, [])
        ratios = next((r for r in (_loads(d["ratios"]) for d in latest) if r), None)
        ratio_name, loss_ratio = views.worst_ratio(ratios)
        return views.RunFigures(
            statistic=views.STEP_STATISTIC, step_ms=run.step_ms, slowest_rank=run.slowest_rank,
            straggler_score=run.straggler_score, straggler_pct=run.straggler_pct, straggler=run.straggler,
            steps_per_s=run.steps_per_s, examples_per_s=run.examples_per_s, eval_step=eval_step,
            eval_lag=freshness.eval_lag(run.last_step, eval_step), early_stopping=early, declared_steps=declared,
            eta_s=views.eta_s(run.status, run.last_step, declared, run.steps_per_s), ratio_name=ratio_name,
            loss_ratio=loss_ratio)

    def rank_views(self, run: RunSummary, rows: tuple[RankRow, ...]) -> tuple[views.RankView, ...]:
        """The newest attempt of each rank with its step time and Δ against the median rank (core/straggler.py)."""
        spread = straggler.spread((r.rank, r.median_step_ms) for r in rows if r.latest)
        return tuple(views.RankView(
            rank=r.rank, attempt=r.attempt, node=r.node, state=r.state, records=r.records, last_step=r.last_step,
            last_ts=r.last_ts, last_seen=r.last_seen, step_ms=r.median_step_ms,
            delta_pct=spread.delta_pct(r.median_step_ms) if spread is not None else None,
            input_wait_ms=r.median_input_wait_ms, steps_per_s=r.steps_per_s, examples_per_s=r.examples_per_s,
            loss=r.loss, ratios=r.ratios, ended=r.ended, exit_code=r.exit_code, parts=r.step_parts)
            for r in rows if r.latest)

    def run_view(self, run_id: int, now: Optional[float] = None) -> Optional[views.RunView]:
        """One run as every surface shows it (None when the index does not hold it)."""
        now = time.time() if now is None else now
        detail = self.run_detail(run_id, now)
        if detail is None:
            return None
        backlog = self.backlog(run_id, now=now)
        current = summary_is_current(detail.run.manifest_status)
        content = self.summary_bytes(run_id) if current else None
        summary = artifacts.decode_summary(content) if content is not None else None
        ranks = self.rank_views(detail.run, detail.ranks)
        figures = self.figures(detail.run, now, backlog)
        preferred = figures.early_stopping.metric if figures.early_stopping is not None else None
        evals, eval_metric = views.eval_points(self.events(run_id, kind="eval", limit=MAX_EVALS), backlog, preferred)
        failure = views.recorded_failure(summary.failure if summary is not None else None)
        return views.RunView(
            run=detail.run, figures=figures, ranks=ranks, attempts=detail.ranks, outcomes=detail.outcomes,
            manifest=detail.manifest, summary_status=detail.summary_status, nodes=detail.nodes,
            metrics=detail.metrics, backlog=backlog, failure=failure or views.inferred_failure(detail.run, ranks),
            diagnosis=views.diagnosis_line(summary), evals=evals, eval_metric=eval_metric)

    def backlog_view(self, run_id: Optional[int] = None, now: Optional[float] = None) -> views.BacklogView:
        """The validation backlog of one run (or of every run), with the newest completed checkpoint and its lag."""
        now = time.time() if now is None else now
        runs = self.list_runs(now=now)
        if run_id is not None:
            runs = tuple(r for r in runs if r.run_id == run_id)
        items: list[tuple[str, BacklogItem]] = []
        newest = lag = train_step = None
        for run in sorted(runs, key=lambda r: r.name):
            run_items = self.backlog(run.run_id, now=now)
            items += [(run.name, b) for b in run_items]
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
                                 run=runs[0].name if run_id is not None and runs else None)

    def _summary_status(self, run_id: int) -> Optional[str]:
        if not summary_is_current(self._run_value(run_id, "manifest_status")):
            return None
        return self._run_value(run_id, "summary_status")

    def _run_value(self, run_id: int, column: str) -> Any:
        """One column of the run's ``runs`` row (None when the run is not indexed)."""
        rows = self._rows(f"SELECT {column} FROM runs WHERE run_id = ?", (run_id,))
        return rows[0][0] if rows else None

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

    def series_tail(self, run_id: int, rank: int, metric: str, buckets: int) -> tuple[float, ...]:
        """Means of the newest ``buckets`` buckets of a wide-table metric, oldest first (sparklines)."""
        if metric not in idx.SERIES_METRICS:
            raise ValueError(f"no wide series for {metric!r}")
        rows = self._rows(f"SELECT {metric}_sum, {metric}_n FROM series WHERE run_id = ? AND rank = ?"
                          " ORDER BY bucket DESC LIMIT ?", (run_id, rank, buckets))
        return tuple(s / n for s, n in reversed(rows) if n)

    # ------------------------------------------------------------------ nodes, backlog, evals, errors
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
        """Validation backlog entries of a run in checkpoint order, each with its decided state.

        Assembled by :func:`traceml_tui.core.backlog.backlog_entries` from the stored bytes of its files, as
        ``traceml validate status`` assembles them from the files; the run's settings from its manifest.
        """
        now = time.time() if now is None else now
        files = [(hygiene_files.FOLDER_OF_KIND[kind], os.path.basename(path), content)
                 for kind, path, content in self._rows(
                     "SELECT kind, path, content FROM side_files WHERE run_id = ? AND kind IN"
                     " ('request', 'claim', 'receipt', 'failure') ORDER BY path", (run_id,))]
        settings = core_backlog.validation_settings(self.manifest(run_id))
        return core_backlog.backlog_entries(files, now, settings=settings)

    def backlog_outstanding(self) -> dict[int, int]:
        """Per run: validation requests without a receipt (the Runs table's backlog column).

        The fast path of ``sum(e.outstanding for e in backlog(run))`` (:func:`traceml_tui.core.backlog.is_outstanding`)
        for every run in one query, without decoding: a stored backlog file decoded when it was indexed
        (``error`` is NULL exactly when :func:`traceml_tui.core.hygiene_files.decode_named` accepted it), and a
        valid file's key is its checkpoint. A test holds the two equal on damaged files.
        """
        out: dict[int, int] = {}
        for run_id, n in self._rows(
            "SELECT q.run_id, count(*) FROM side_files q WHERE q.kind = 'request' AND q.content IS NOT NULL"
            " AND q.error IS NULL AND NOT EXISTS (SELECT 1 FROM side_files c WHERE c.run_id = q.run_id"
            " AND c.kind = 'receipt' AND c.key = q.key AND c.content IS NOT NULL AND c.error IS NULL)"
            " GROUP BY q.run_id"
        ):
            out[run_id] = n
        return out

    def eval_freshness(self, run_id: int, train_step: Optional[int] = None) -> freshness.EvalFreshness:
        """The run's newest completed evaluation — an ``eval`` record or a validation receipt — and its lag behind
        ``train_step`` (default: the run's newest step), by :func:`traceml_tui.core.freshness.eval_freshness`."""
        evaluated = [freshness.Evaluated(step, checkpoint) for step, checkpoint in self._rows(
            "SELECT step, json_extract(body, '$.checkpoint') FROM events WHERE run_id = ? AND kind = 'eval'"
            " AND json_extract(body, '$.status') = 'completed' AND step IS NOT NULL ORDER BY step DESC LIMIT 1",
            (run_id,))]
        for path, content in self._rows("SELECT path, content FROM side_files WHERE run_id = ? AND kind = 'receipt'"
                                        " AND content IS NOT NULL AND error IS NULL", (run_id,)):
            try:
                receipt = hygiene_files.decode_named("receipts", os.path.basename(path), content)
            except hygiene_files.DamagedFile:
                continue  # a damaged receipt is no result
            if receipt.step is not None:
                evaluated.append(freshness.Evaluated(receipt.step, receipt.checkpoint))
        if train_step is None:
            train_step = self._run_value(run_id, "last_step")
        return freshness.eval_freshness(train_step, evaluated)

    def newest_evaluated_step(self, run_id: int) -> Optional[int]:
        """Step of the newest completed evaluation: an ``eval`` record or a validation receipt (:meth:`eval_freshness`)."""
        return self.eval_freshness(run_id).newest_step

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

    def unmeasured(self, run_id: int) -> tuple[dict[str, Any], ...]:
        """The run's dark streams as the summary lists them (``integration.unmeasured``: rank, stream, reason).

        From the ``unmeasured`` records in the ``events`` table (looked up by its ``(run_id, kind)`` index);
        folded by :func:`traceml_tui.core.coverage.unmeasured_entries`, the summary's own rule.
        """
        found = []
        for rank, body in self._rows("SELECT rank, body FROM events WHERE run_id = ? AND kind = 'unmeasured'"
                                     " ORDER BY ts, offset", (run_id,)):
            data = _loads(body)
            if isinstance(rank, int) and isinstance(data, dict):
                found.append((rank, data.get("stream", ""), data.get("reason", "")))
        return tuple(coverage.unmeasured_entries(found))

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

    def step_count(self, run_id: int) -> int:
        """Number of step rows of a run (for tests and diagnostics; cost grows with the run)."""
        return int(self._rows("SELECT count(*) FROM steps WHERE run_id = ?", (run_id,))[0][0])
