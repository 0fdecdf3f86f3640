"""The read side's runs room: the ``runs`` and ``rank_live`` rows, with every state decided by core.

:class:`daemon.reader.Reader` lists runs through it (``list_runs``, ``run``, ``rank_rows``); each run's word,
its ranks' states and the hang its watchdogs recorded are decided by :func:`traceml_tui.core.state.decide_run`,
its step time and straggler verdict by the one straggler rule (docs/contracts.md, "One set of figures") over the
run's one statistic: each rank's rolling median while it is live, the final summary's own per-rank rows once that
summary is current (``views.step_statistic``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from traceml_tui.core import artifacts, records, straggler
from traceml_tui.core import hang as hangs_mod
from traceml_tui.core.state import (
    LIVE_RUN_STATES,
    STOPPED_RANK_STATES,
    LeaseFacts,
    RankFacts,
    RankState,
    RunFacts,
    RunStatus,
    crashed_in_teardown,
    decide_run,
    describe,
    final_word,
    interruption,
    lost_nodes,
    marks_text,
    needs_attention,
    quiet_ranks,
    stopped_first,
    summary_is_current,
    validation_mark,
    with_exit_codes,
)

from . import rates, sidefiles, views
from .leases import lease_facts
from .read_query import Rows, loads

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
    # The run's step time (its statistic's value of its median rank) and the straggler rule's verdict on its ranks
    # (core/straggler.py): slowest_rank and straggler_score above come from the same spread. The statistic is the
    # rolling median while the run is live, its current final summary's per-rank means once it has one
    # (views.step_statistic); rank_step_ms is each rank's value of it.
    step_ms: Optional[float] = None
    straggler_pct: Optional[float] = None
    straggler: bool = False
    # Nothing hides (docs/watch.md): ranks still running but silent for several of their own step intervals,
    # (rank, seconds silent) (core.state.quiet_ranks); the rank(s) that stopped first among the stalled ones
    # (core.state.stopped_first); the validation mark (core.state.validation_mark: `2 blocked`); what
    # interrupted an interrupted run and when (core.state.interruption; the manifest's end, else the last end).
    quiet_ranks: tuple[tuple[int, float], ...] = ()
    stopped_first: tuple[int, ...] = ()
    validation_mark: Optional[str] = None
    validation_blocked: int = 0  # the blocked validation requests behind a `2 blocked` mark
    interrupted_by: Optional[str] = None
    interrupted_at: Optional[float] = None
    # a failed run whose ranks all returned from their scripts before one crashed (core.state.crashed_in_teardown)
    teardown_crash: bool = False
    # The run's first step record (unix s), its age (now − its newest record) and duration (from its start to its
    # end, or to now while it is live): every surface's Age and Duration (views.run_times).
    first_ts: Optional[float] = None
    age_s: Optional[float] = None
    duration_s: Optional[float] = None
    # (rank, steps/s, examples/s) of each rank's newest attempt by the rate rule (daemon/rates.py) as of the
    # decision time: steps_per_s / examples_per_s above are the run's by the same rule
    rank_rates: tuple[tuple[int, Optional[float], Optional[float]], ...] = ()
    step_statistic: views.StepStatistic = views.ROLLING
    rank_step_ms: tuple[tuple[int, Optional[float]], ...] = ()

    @property
    def marks(self) -> str:
        """What every surface prints after the word and its ranks (core.state.marks_text): ``SIGINT``,
        ``r1 silent 12s``, ``⚠ 2 blocked``."""
        return marks_text(self.validation_mark, self.quiet_ranks, self.interrupted_by, self.interrupted_at,
                          self.teardown_crash)

    @property
    def status_text(self) -> str:
        """The run's word and what explains it, as every surface prints it (``failed r0 · lost node 1``,
        ``completed ⚠ 2 blocked``)."""
        return describe(self.status, self.explaining_ranks, self.lost_nodes, self.marks)

    @property
    def attention(self) -> bool:
        """Whether the run needs attention (core.state.needs_attention): an alert word or a validation mark."""
        return needs_attention(self.status, self.validation_mark)

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
        aborted peers are not named: they died because of it); of a stalled run only the rank(s) that stopped
        first (core.state.stopped_first: behind the others, or silent first), not the peers it stopped."""
        if self.status is RunStatus.STALLED and self.stopped_first:
            return self.stopped_first
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


_RUN_COLS = ("run_id", "name", "dir", "root", "missing", "ranks_total", "ranks_ended", "last_step",
             "last_ts", "last_seen", "records", "errors", "manifest_status", "training_status", "summary_status",
             "outcomes_total", "outcomes_failed", "nnodes", "nproc_per_node", "world_size", "started_at", "ended_at", "updated_version",
             "median_interval_s", "outcome_nodes", "launcher_exit_codes")
_RANK_COLS = ("rank", "attempt", "records", "first_step", "last_step", "last_ts", "last_seen", "median_step_ms",
              "median_input_wait_ms", "median_interval_s", "steps_per_s", "examples_per_s", "loss", "ratios", "ended",
              "exit_code", "end_ts", "node", "step_parts")
_VERSION, _MISSING = _RUN_COLS.index("updated_version"), _RUN_COLS.index("missing")
_MANIFEST_STATUS, _SUMMARY_STATUS = _RUN_COLS.index("manifest_status"), _RUN_COLS.index("summary_status")
#: Up to this many runs to (re)decide, their rank rows are read by run id; more, and every rank row is read.
_FEW_RUNS = 200
_LATEST = ("attempt = (SELECT max(attempt) FROM rank_live WHERE run_id = r.run_id AND rank = r.rank)")

#: Each rank's newest hang records that still explain its silence, given (run_id, {rank: (attempt, last step)})
#: (the events room's ``current_hangs``).
CurrentHangs = Callable[[int, dict[int, tuple[int, Optional[int]]]], dict[int, records.Hang]]


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


@dataclass(frozen=True)
class _Marks:
    """Per run: blocked validation requests, whether its final summary says validation is missing, and its final
    summary's step-time rows (``core.straggler.SummaryWindow``; whether the summary is current is the caller's
    check)."""

    blocked: dict[int, int] = field(default_factory=dict)
    missing: set[int] = field(default_factory=set)
    windows: dict[int, straggler.SummaryWindow] = field(default_factory=dict)


@dataclass(frozen=True)
class _SummaryFacts:
    """What the runs room reads of a run's final summary, decoded once per run data version."""

    missing: bool = False  # its ``validation`` section says ``missing``
    window: Optional[straggler.SummaryWindow] = None  # its step-time rows (views.step_statistic)


def _rates_now(latest: list[dict], status: RunStatus, states: dict[int, RankState], now: float
               ) -> tuple[tuple[int, Optional[float], Optional[float]], ...]:
    """Each rank's (rank, steps/s, examples/s) as of ``now`` by the rate rule (daemon/rates.py): in a live run a
    running rank falls while the ingester has seen nothing of it past its grace (the core's quiet threshold for its
    own step interval; its silence on the ingester's clock, ``last_seen``: a slow ingester is not a pause) and a rank
    the core calls stopped (stalled, waiting, lost) is at 0; other ranks keep their last records' rates."""
    live = status in LIVE_RUN_STATES
    out = []
    for r in latest:
        state = states.get(r["rank"])
        if live and r["ended"] is None and state in rates.STOPPED:
            out.append((r["rank"], *rates.stopped(r["steps_per_s"], r["examples_per_s"])))
            continue
        silent = max(0.0, now - r["last_seen"]) if live and r["ended"] is None and r["last_seen"] is not None else None
        out.append((r["rank"], *rates.rank_rates(r["steps_per_s"], r["examples_per_s"], silent,
                                                 r["median_interval_s"])))
    return tuple(out)


#: One step row's time by its key: every arm of the ``steps`` view is searched by its primary key.
FIRST_STEP_TS_SQL = "SELECT ts FROM steps WHERE run_id = ? AND rank = ? AND attempt = ? AND step = ?"


class RunsReader:
    """The runs of the index with their states decided (the reader's ``list_runs``, ``run``, ``rank_rows``).

    ``stall_floor_s`` is the least silence after which a rank that has not ended counts as stalled;
    ``current_hangs`` reads the hang records that may explain a stopped rank (the events room);
    ``blocked`` counts each run's blocked validation requests at a time (the backlog room) and ``manifest``
    reads a run's typed manifest (the files room), for the marks of :attr:`RunSummary.marks`.
    """

    def __init__(self, rows: Rows, stall_floor_s: float, current_hangs: CurrentHangs,
                 blocked: Optional[Callable[[float], dict[int, int]]] = None,
                 manifest: Optional[Callable[[int, Optional[int]], Any]] = None):
        self._rows = rows
        self.stall_floor_s = stall_floor_s
        self._current_hangs = current_hangs
        self._blocked = blocked
        self._manifest = manifest
        self._summaries: dict[int, tuple[int, _SummaryFacts]] = {}  # run_id -> (data version, what its summary says)
        self._firsts: dict[int, tuple[int, Optional[float]]] = {}  # run_id -> (data version, first step time)
        # run_id -> (what it was decided from, summary) for runs with a final word: their decision no longer reads
        # the clock (core.state.final_word), so a refresh recomputes only their age until their data changes.
        self._settled: dict[int, tuple[tuple, RunSummary]] = {}

    def _summary_facts(self, run_id: int, version: int) -> _SummaryFacts:
        """What the run's final summary says (validation missing, its step-time rows), decoded by the typed sections
        (``artifacts.decode_validation`` as ``reader.files.validation``; ``artifacts.decode_step_time`` read by
        ``core.straggler.summary_window``) once per run data version (a summary that changes bumps it)."""
        cached = self._summaries.get(run_id)
        if cached is None or cached[0] != version:
            missing, window = False, None
            for content, in self._rows("SELECT content FROM side_files WHERE run_id = ? AND kind = 'summary'"
                                       " AND content IS NOT NULL", (run_id,)):
                data = content.encode("utf-8")
                section = artifacts.decode_validation(data)
                missing = missing or (section is not None and section.status == "missing")
                window = window or straggler.summary_window(artifacts.decode_step_time(data))
            cached = self._summaries[run_id] = (version, _SummaryFacts(missing, window))
        return cached[1]

    def _with_summary(self) -> dict[int, _SummaryFacts]:
        """Every run with a final summary, and what it says (whether it is current is the caller's check:
        core.state.summary_is_current)."""
        return {run_id: self._summary_facts(run_id, version) for run_id, version in self._rows(
            "SELECT r.run_id, r.updated_version FROM runs r WHERE EXISTS (SELECT 1 FROM side_files f"
            " WHERE f.run_id = r.run_id AND f.kind = 'summary' AND f.content IS NOT NULL)")}

    def window(self, run: RunSummary) -> Optional[straggler.SummaryWindow]:
        """The summary rows ``run``'s figures are by (None: its statistic is the rolling one)."""
        if run.step_statistic.kind != "summary":
            return None
        return self._summary_facts(run.run_id, run.version).window

    def _first_ts(self, run_id: int, version: int) -> Optional[float]:
        """A run's first step record time: the first step of each rank's attempts (primary-key lookups), kept until
        the run's data version moves."""
        cached = self._firsts.get(run_id)
        if cached is None or cached[0] != version:
            # One keyed lookup per rank with bound values: SQLite pushes constants into both arms of the ``steps``
            # view, but a correlated subquery over the view scans the whole step table (docs/daemon.md "Live path").
            firsts = [row[0] for rank, attempt, first in self._rows(
                "SELECT rank, attempt, first_step FROM rank_live WHERE run_id = ? AND first_step IS NOT NULL",
                (run_id,))
                for row in self._rows(FIRST_STEP_TS_SQL, (run_id, rank, attempt, first)) if row[0] is not None]
            cached = self._firsts[run_id] = (version, min(firsts) if firsts else None)
        return cached[1]

    def _interruption(self, d: dict, latest: list[dict]) -> tuple[Optional[str], Optional[float]]:
        """What interrupted an interrupted run and when: the manifest's exit code and end (typed), else the ranks'
        end records (core.state.interruption)."""
        manifest = self._manifest(d["run_id"], d["updated_version"]) if self._manifest is not None else None
        code = manifest.exit_code if manifest is not None else None
        ends = [r["end_ts"] for r in latest if r["end_ts"] is not None]
        at = manifest.ended_at if manifest is not None and manifest.ended_at is not None else (
            max(ends) if ends else d["last_ts"])
        return interruption(code, (r["ended"] for r in latest)), at

    def _rank_dicts(self, where: str, params: tuple) -> dict[int, list[dict]]:
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

    def _decide(self, d: dict, latest: list[dict], now: float, leases: tuple[LeaseFacts, ...] = ()
                ) -> tuple[RunStatus, tuple[tuple[int, RankState], ...], Optional[hangs_mod.HangReport],
                           tuple[tuple[int, float], ...], tuple[int, ...]]:
        outcome_nodes = _nodes_of(d.get("outcome_nodes"))
        ranks = tuple(
            RankFacts(rank=r["rank"], last_ts=r["last_ts"], end_status=r["ended"], end_exit_code=r["exit_code"],
                      end_ts=r["end_ts"], node_outcome_written=r["node"] is not None and r["node"] in outcome_nodes,
                      last_seen=r["last_seen"], node=r["node"], last_step=r["last_step"],
                      median_interval_s=r["median_interval_s"])
            for r in latest)
        if d["launcher_exit_codes"] and summary_is_current(d["manifest_status"]):  # codes end records lacked
            ranks = with_exit_codes(ranks, _exit_codes_of(d["launcher_exit_codes"]))
        def facts_of(ranks: tuple[RankFacts, ...]) -> RunFacts:
            return RunFacts(
                ranks=ranks, now=now, median_interval_s=d["median_interval_s"], last_ingest=d["last_seen"],
                manifest_status=d["manifest_status"], summary_status=d["summary_status"],
                guard_training_status=d["training_status"], outcome_failed=d["outcomes_failed"] or 0,
                missing=bool(d["missing"]), stall_floor_s=self.stall_floor_s, leases=leases)

        def decide(ranks: tuple[RankFacts, ...]):
            return decide_run(facts_of(ranks))

        verdict, report = decide(ranks), None
        # Hang forensics only where it can matter: several ranks, one of them stopped (a query per such run).
        if len(ranks) > 1 and any(s in STOPPED_RANK_STATES for s in verdict.ranks):
            hangs = self._current_hangs(d["run_id"], {r["rank"]: (r["attempt"], r["last_step"]) for r in latest})
            if hangs:
                ranks = tuple(replace(f, hang=hangs_mod.fact_of(hangs[f.rank])) if f.rank in hangs else f
                              for f in ranks)
                verdict = decide(ranks)
                report = hangs_mod.hang_report(ranks, verdict.ranks, hangs)
        quiet = tuple((ranks[i].rank, silent) for i, silent in quiet_ranks(facts_of(ranks), verdict.ranks))
        first = tuple(ranks[i].rank for i in stopped_first(ranks, verdict.ranks, d["median_interval_s"]))
        teardown = verdict.status is RunStatus.FAILED and crashed_in_teardown(ranks)
        return (verdict.status, tuple((f.rank, s) for f, s in zip(ranks, verdict.ranks)), report, quiet, first,
                teardown)

    def _summary(self, row: tuple, latest: list[dict], now: float, leases: tuple[LeaseFacts, ...] = (),
                 marks: Optional["_Marks"] = None) -> RunSummary:
        d = dict(zip(_RUN_COLS, row))
        status, rank_states, hang, quiet, first, teardown = self._decide(d, latest, now, leases)
        marks = marks or _Marks()
        interrupted_by = interrupted_at = None
        if status is RunStatus.INTERRUPTED:
            interrupted_by, interrupted_at = self._interruption(d, latest)
        missing = d["run_id"] in marks.missing and summary_is_current(d["manifest_status"])
        first_ts = self._first_ts(d["run_id"], d["updated_version"])
        age, took = views.run_times(status, first_ts, d["last_ts"], now, sidefiles.time_of_text(d["started_at"]),
                                    sidefiles.time_of_text(d["ended_at"]))
        # One statistic, one rule (docs/contracts.md "One set of figures"): not the ingest-time roll-up's score. Once
        # the run's final summary is current, the summary's own rows, by the function its STRAGGLER verdict called.
        window = marks.windows.get(d["run_id"]) if summary_is_current(d["manifest_status"]) else None
        statistic, rank_step, found = views.step_statistic(((r["rank"], r["median_step_ms"]) for r in latest), window)
        step_ms, slowest, score, skew, verdict = views.step_figures(found)
        rank_rates = _rates_now(latest, status, dict(rank_states), now)
        steps_per_s, examples_per_s = rates.run_rates((s, e) for _, s, e in rank_rates)
        return RunSummary(
            run_id=d["run_id"], name=d["name"], dir=d["dir"], root=d["root"], status=status,
            missing=bool(d["missing"]), ranks=d["ranks_total"], ranks_ended=d["ranks_ended"],
            last_step=d["last_step"], last_ts=d["last_ts"], last_seen=d["last_seen"], steps_per_s=steps_per_s,
            examples_per_s=examples_per_s, slowest_rank=slowest,
            straggler_score=score, records=d["records"], errors=d["errors"],
            manifest_status=d["manifest_status"], training_status=d["training_status"],
            outcomes_total=d["outcomes_total"], outcomes_failed=d["outcomes_failed"], nnodes=d["nnodes"],
            nproc_per_node=d["nproc_per_node"], world_size=d["world_size"], started_at=d["started_at"],
            ended_at=d["ended_at"], version=d["updated_version"], median_interval_s=d["median_interval_s"],
            rank_states=rank_states, lost_nodes=lost_nodes(leases), hang=hang,
            step_ms=step_ms, straggler_pct=skew, straggler=verdict, quiet_ranks=quiet, stopped_first=first,
            validation_mark=validation_mark(blocked=marks.blocked.get(d["run_id"], 0), summary_missing=missing),
            validation_blocked=marks.blocked.get(d["run_id"], 0),
            interrupted_by=interrupted_by, interrupted_at=interrupted_at, teardown_crash=teardown, first_ts=first_ts,
            age_s=age,
            duration_s=took,
            rank_rates=rank_rates, step_statistic=statistic, rank_step_ms=rank_step,
        )

    def _marks(self, now: float) -> "_Marks":
        """The facts behind the runs' validation marks, for every run in one go (each kept per run version)."""
        blocked = self._blocked(now) if self._blocked is not None else {}
        summaries = self._with_summary()
        return _Marks(blocked=blocked, missing={run_id for run_id, f in summaries.items() if f.missing},
                      windows={run_id: f.window for run_id, f in summaries.items() if f.window is not None})

    def all(self, roots: Optional[list[str]], now: float) -> tuple[RunSummary, ...]:
        """All runs (optionally only those under ``roots``), most recently active first, with states decided."""
        rows = self._rows(f"SELECT {', '.join(_RUN_COLS)} FROM runs"
                          " ORDER BY coalesce(last_ts, first_seen) DESC, run_id DESC")
        if roots:
            real = [os.path.realpath(r).rstrip("/") for r in roots]
            rows = [r for r in rows if any(r[2] == p or r[2].startswith(p + "/") for p in real)]
        leases = self._leases()
        marks = self._marks(now)
        keys = {r[0]: (r[_VERSION], r[_MISSING], marks.blocked.get(r[0], 0), r[0] in marks.missing, leases.get(r[0], ()))
                for r in rows}
        stale = [r[0] for r in rows if self._settled.get(r[0], (None,))[0] != keys[r[0]]]
        if len(stale) > _FEW_RUNS:
            latest = self._rank_dicts(_LATEST, ())
        else:
            latest = self._rank_dicts(f"run_id IN ({', '.join('?' * len(stale))}) AND {_LATEST}", tuple(stale))
        out = []
        for r in rows:
            settled = self._settled.get(r[0])
            if settled is not None and settled[0] == keys[r[0]]:
                run = settled[1]
                age, took = views.run_times(run.status, run.first_ts, run.last_ts, now,
                                            sidefiles.time_of_text(run.started_at), sidefiles.time_of_text(run.ended_at))
                out.append(replace(run, age_s=age, duration_s=took))
                continue
            run = self._summary(r, latest.get(r[0], []), now, leases.get(r[0], ()), marks)
            if final_word(r[_MANIFEST_STATUS], r[_SUMMARY_STATUS]) is not None:
                self._settled[r[0]] = (keys[r[0]], run)
            else:
                self._settled.pop(r[0], None)
            out.append(run)
        return tuple(out)

    def one(self, run_id: int, now: float) -> Optional[RunSummary]:
        """One run's summary, or None."""
        rows = self._rows(f"SELECT {', '.join(_RUN_COLS)} FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            return None
        latest = self._rank_dicts(f"run_id = ? AND {_LATEST}", (run_id,))
        return self._summary(rows[0], latest.get(run_id, []), now, self._leases(run_id).get(run_id, ()),
                             self._marks(now))

    def attempts(self, run_id: int, run: Optional[RunSummary]) -> tuple[RankRow, ...]:
        """Per (rank, attempt) rows, ordered by rank then attempt; the newest attempt carries ``run``'s state."""
        states = dict(run.rank_states) if run is not None else {}
        now_rates = {rank: (sps, eps) for rank, sps, eps in run.rank_rates} if run is not None else {}
        rows = self._rank_dicts("run_id = ?", (run_id,)).get(run_id, [])
        latest: dict[int, int] = {}
        for d in rows:
            latest[d["rank"]] = max(latest.get(d["rank"], d["attempt"]), d["attempt"])
        out = []
        for d in rows:
            is_latest = latest[d["rank"]] == d["attempt"]
            if is_latest and d["rank"] in now_rates:  # the rate rule as of the run's decision time
                d = {**d, "steps_per_s": now_rates[d["rank"]][0], "examples_per_s": now_rates[d["rank"]][1]}
            ratios = loads(d["ratios"]) or {}
            parts = loads(d["step_parts"])
            out.append(RankRow(latest=is_latest, state=states.get(d["rank"]) if is_latest else None,
                               ratios=tuple(sorted(ratios.items())),
                               step_parts=parts if isinstance(parts, dict) else None,
                               **{k: v for k, v in d.items() if k not in ("ratios", "step_parts")}))
        return tuple(out)

    def latest_ratios(self, run_id: int) -> Optional[dict]:
        """The scale-free ratios of the first rank whose newest attempt has any (the run's loss ratio)."""
        latest = self._rank_dicts(f"run_id = ? AND {_LATEST}", (run_id,)).get(run_id, [])
        return next((r for r in (loads(d["ratios"]) for d in latest) if r), None)
