"""The state words of traceml and the pure rules that decide them.

Every surface — ``traceml status`` (table, ``--json``, ``--oneline``), the
Runs and Run screens of ``traceml watch``, its alerts, ``traceml validate
status``, the index and the summary — shows the words these functions return.
No other module decides a run's, a rank's or a validation request's state.

The rules (docs/contracts.md, "state rules"):

* A rank whose ``rank_end`` says ``exited`` or ``completed`` with no non-zero
  exit code ended cleanly (the SDK writes ``exited`` after a normal return: it
  cannot see ``sys.exit(n)``; the launcher records the real code).
* A rank that ended ``failed`` (an exception), with a non-zero exit code or a
  signal, failed; ``interrupted`` (Ctrl-C) is its own word, and so is a rank
  the SDK saw get SIGTERM (``terminated``: stopped from outside).
* A rank with no end record is **lost** once nothing more can come from it:
  the run is final (manifest or summary), its node's outcome is written, or
  every other rank ended and it stayed silent for the stall limit after that.
* When several ranks failed or were lost, the first of them — by its end
  record's time, else (no end record) by its newest record's time — keeps
  ``failed``/``lost``; the others are **aborted** (they died because of it,
  e.g. in their next collective), and so are ranks stopped from outside after
  it (torchrun tearing them down). A rank SIGKILLed without an end record is so
  the culprit and not its peers that failed in the all-reduce after it.
* Hang forensics (:func:`hang_roles`): among the ranks that stopped, those whose
  watchdog's ``hang`` record puts them inside a collective (or ahead by
  collective count) and behind none wait for the others, the culprits; while
  silent they are **waiting** (the culprit ``stalled``), once ended
  ``aborted``, and the culprit is the first failure (``failed`` even when
  torchrun stopped it after their collective timed out).
* A run with no final word whose ranks all ended, one of them by SIGTERM, and
  stayed so for the stall limit has lost its launcher: it is ``lost``.
* Runs whose launchers keep a lease (``nodes/node_<k>/launcher.lease``,
  core/lease.py; :class:`LeaseFacts`) are judged by it instead: without a final
  word, a run whose every lease expired (none live, none done) is ``lost``,
  with or without rank records; a rank without an end record on a node whose
  lease expired is ``lost``; while a lease lives the launcher is at work, so
  the ranks alone never give the run a final word it did not write: ranks
  that all ended cleanly or were stopped from outside, or a failure that came
  only after a rank was stopped from outside (a dying launcher's SIGTERM),
  leave the run ``running`` until the launcher's word or the lease's expiry;
  a lost rank leaves it ``stalled`` (another node's launcher lives, so it is
  not over); and a silent rank whose peers all ended is ``stalled``, not
  ``lost``. A node
  whose lease expired while another's did not is named
  (:func:`lost_nodes`). Runs without a lease file (written before leases, or
  by a bare ``traceml.init()``) keep the rules above.
* A rank that has not ended is **stalled** when it has been silent for the
  stall limit — ``max(STALL_FLOOR_S, STALL_INTERVALS × median step interval)`` —
  measured by record time against the run's newest record (the others go on
  without it), or against now when the ingester too has seen nothing new for
  that long, or already found the rank that silent when it read its file to the
  end (a hung collective silences every rank at once; an ingest backlog is not
  a stall, an old hung run found by a fresh index is).

Nothing hides (docs/watch.md): marks beside the word, decided here too —
a rank still running but silent for several of its own step intervals is
*quiet* (:func:`quiet_ranks`); a stall names the rank that stopped first, not
every rank its stop silenced (:func:`stopped_first`); blocked or missing
validation is a mark that needs attention (:func:`validation_mark`,
:func:`needs_attention`); an interrupted run says by what (:func:`interruption`);
:func:`marks_text` prints them for every surface.
"""

from __future__ import annotations

import enum
import signal
import sys
import time
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Optional, Sequence

if sys.version_info >= (3, 11):
    StrEnum = enum.StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        def __str__(self) -> str:
            return str(self.value)


class RunStatus(StrEnum):
    """What a run is doing, or how it ended."""

    RUNNING = "running"
    STALLED = "stalled"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    LOST = "lost"
    MISSING = "missing"  # its folder is gone from disk; the index keeps its rows


class RankState(StrEnum):
    """One rank (its newest attempt)."""

    RUNNING = "running"
    STALLED = "stalled"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    LOST = "lost"
    ABORTED = "aborted"  # ended in failure after another rank failed first: a victim, not the cause
    WAITING = "waiting"  # silent inside a collective a hung peer never reached (hang forensics): not the cause


class BacklogState(StrEnum):
    """One validation request of the backlog (one checkpoint)."""

    PENDING = "pending"
    CLAIMED = "claimed"
    STALE_CLAIM = "stale-claim"
    COMPLETED = "completed"
    FAILED = "failed"  # an attempt failed; a retry is left
    BLOCKED = "blocked"  # every allowed attempt failed


#: Attention order: the states a user must look at first come first (Runs table sort).
RUN_ATTENTION: tuple[RunStatus, ...] = (
    RunStatus.FAILED, RunStatus.LOST, RunStatus.STALLED, RunStatus.INTERRUPTED, RunStatus.RUNNING,
    RunStatus.COMPLETED, RunStatus.MISSING,
)
#: Run states an alert (bell, notification) announces when a run enters them.
#: Run states of a run still going (its duration runs up to now; always exported as a metric).
LIVE_RUN_STATES: frozenset[RunStatus] = frozenset({RunStatus.RUNNING, RunStatus.STALLED})
ALERT_STATES: frozenset[RunStatus] = frozenset({RunStatus.FAILED, RunStatus.LOST, RunStatus.STALLED})
#: Run states that are over: nothing more will be written.
FINAL_RUN_STATES: frozenset[RunStatus] = frozenset({
    RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.INTERRUPTED, RunStatus.LOST})
BACKLOG_ORDER: tuple[BacklogState, ...] = (
    BacklogState.STALE_CLAIM, BacklogState.BLOCKED, BacklogState.FAILED, BacklogState.CLAIMED,
    BacklogState.PENDING, BacklogState.COMPLETED,
)

#: A silent rank is stalled after at least this many seconds …
STALL_FLOOR_S = 30.0
#: … and this many of its run's median step intervals.
STALL_INTERVALS = 10.0
#: Validation attempts per checkpoint before a request is blocked (``hygiene.validation.max_attempts``).
DEFAULT_MAX_ATTEMPTS = 3
#: Seconds a failed request waits before its first retry (``hygiene.validation.retry_backoff_s``);
#: each further failure doubles the wait, up to :data:`RETRY_BACKOFF_CAP_S` (docs/hygiene.md).
DEFAULT_RETRY_BACKOFF_S = 5.0
RETRY_BACKOFF_CAP_S = 600.0
#: Seconds one validation worker may run on one request before it counts as a failed attempt
#: (``hygiene.validation.timeout_s``).
DEFAULT_WORKER_TIMEOUT_S = 3600.0
#: Claim lease of a validation drainer (``hygiene.validation.lease_s``).
DEFAULT_LEASE_S = 60.0

#: ``rank_end`` statuses the SDK writes after a normal end of the script.
_CLEAN_ENDS = frozenset({"exited", "completed"})
#: ``rank_end`` statuses of a rank stopped from outside (Ctrl-C; SIGTERM, written by the SDK as ``terminated``).
_STOPPED_ENDS = frozenset({"interrupted", "terminated"})
#: Manifest/summary run statuses that mean the launcher is done.
_FINAL_WORDS = {"completed": RunStatus.COMPLETED, "failed": RunStatus.FAILED,
                "interrupted": RunStatus.INTERRUPTED}


def stall_limit_s(median_interval_s: Optional[float], floor_s: float = STALL_FLOOR_S) -> float:
    """Seconds of silence after which a rank that has not ended is stalled."""
    interval = median_interval_s if median_interval_s and median_interval_s > 0 else 0.0
    return max(floor_s, STALL_INTERVALS * interval)


def rank_end_state(status: Optional[str], exit_code: Optional[int]) -> RankState:
    """The state a ``rank_end`` record (its status word and exit code) stands for.

    ``terminated`` (the SDK got SIGTERM: torchrun stopping its ranks, a dying
    launcher, a scheduler) is stopped from outside, like Ctrl-C: ``interrupted``.
    """
    if status in _STOPPED_ENDS:
        return RankState.INTERRUPTED
    if status in _CLEAN_ENDS and (exit_code is None or exit_code == 0):
        return RankState.COMPLETED
    return RankState.FAILED


def with_exit_codes(ranks: Sequence[RankFacts], codes: Mapping[int, Optional[int]]) -> tuple[RankFacts, ...]:
    """``ranks`` with the exit codes their launcher saw, where a rank's own end record could not know one.

    A script that ends with ``sys.exit(3)`` leaves ``rank_end`` ``exited`` without a code (``SystemExit``
    never reaches an exception hook), which alone reads as a clean end; torchrun's report (or the one
    process's exit status) has the code. A non-zero code there makes that end a failure
    (:func:`rank_end_state`), so the rank that really failed first is named, not the peer torchrun then
    stopped. A code the process gave itself stands in: its script's (1–127) or a crash in its own teardown
    (:data:`CRASH_SIGNALS`, e.g. gloo aborting a process that left mid-collective). A stop signal (SIGTERM,
    SIGKILL, SIGINT…) means it was stopped from outside after it had ended and does not make it the
    culprit. End records with a code of their own, and codes of 0 or unknown, are left as they are.
    """
    return tuple(
        replace(r, end_exit_code=codes[r.rank])
        if r.end_status in _CLEAN_ENDS and r.end_exit_code is None and self_inflicted_exit(codes.get(r.rank)) else r
        for r in ranks)


#: Signals a process raises on itself when it crashes (torchrun reports them as exit code -N).
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE})


def crash_exit(code: Optional[int]) -> bool:
    """Whether an exit code is death by a crash signal (:data:`CRASH_SIGNALS`; torchrun says -N, a shell 128+N)."""
    if not code or 0 < code < 128:
        return False
    number = -code if code < 0 else code - 128
    return number in {int(s) for s in CRASH_SIGNALS}


def crashed_in_teardown(ranks: Sequence[RankFacts]) -> bool:
    """Whether a run's failure is a crash after its training completed (docs/run.md "Failure forensics").

    ``ranks`` as :func:`with_exit_codes` returns them. True when every rank's script returned — its end record
    ``completed``, which ``traceml run``'s bootstrap writes the moment the script's body returns (or the script's
    own ``traceml.finish()``), or another clean end with no failing code — and the ranks that failed did so only
    by a crash signal their launcher reported after that end: the process died while shutting down (e.g. gloo
    aborting at interpreter exit, docs/trainers.md "Limits"), not in training. An ``exited`` end (written at
    exit, which also follows ``sys.exit(3)``) with a crash code stays a failure: it cannot tell a clean end from
    a script that left early and was aborted for it.
    """
    crashed = [r for r in ranks if r.end_status == "completed" and crash_exit(r.end_exit_code)]
    return bool(crashed) and all(
        any(r is c for c in crashed) or rank_end_state(r.end_status, r.end_exit_code) is RankState.COMPLETED
        for r in ranks)


def self_inflicted_exit(code: Optional[int]) -> bool:
    """Whether an exit code is the process's own doing: a script's code, or death by a crash signal (not a stop
    signal such as torchrun's SIGTERM, which says who stopped it, not why it ended)."""
    return bool(code) and (0 < code < 128 or crash_exit(code))


def final_run_word(status: Optional[str]) -> Optional[RunStatus]:
    """The run status a manifest's or summary's ``status`` word stands for, when it is final."""
    return _FINAL_WORDS.get(status) if isinstance(status, str) else None


def summary_is_current(manifest_status: Optional[str]) -> bool:
    """Whether the run's ``final_summary.json`` speaks for it now (its word, failure section and exit codes).

    Not while the manifest says ``running``: a launcher is at work on the run again (``--resume``), and the
    summary is the previous attempt's — the launcher writes the manifest's final word before a new summary.
    """
    return manifest_status != "running"


def final_word(manifest_status: Optional[str], summary_status: Optional[str]) -> Optional[RunStatus]:
    """The launcher's final word on a run: the manifest's, else a current summary's; None while it runs.

    Once a run has one, :func:`decide_run` no longer reads ``now``: its status and its ranks' states are
    settled (a rank without an end record is ``lost``), so a reader may keep them until the run's data changes.
    """
    summary = final_run_word(summary_status) if summary_is_current(manifest_status) else None
    return final_run_word(manifest_status) or summary


def _final_word(facts: RunFacts) -> Optional[RunStatus]:
    return final_word(facts.manifest_status, facts.summary_status)


@dataclass(frozen=True)
class LeaseFacts:
    """One node launcher's lease as its reader (the daemon) saw it, by the reader's own clock (core/lease.py)."""

    node: int
    done: bool  # its last beat says the launcher finished (it wrote its final word)
    changed_at: float  # when the reader last saw the lease's bytes change
    checked_at: float  # when the reader last looked at them
    lease_s: float  # the lease length its launcher declared

    @property
    def expired(self) -> bool:
        """Not seen to change for longer than its lease (and not done): the launcher or its node is gone.

        Both times are the reader's own, so no clock of another node is involved; and a reader that stopped
        looking (a stopped daemon) never makes a lease expire.
        """
        return not self.done and self.checked_at - self.changed_at > self.lease_s


#: What the leases of a run say about its launchers (None: the run has no lease; see :func:`launchers`).
LAUNCHERS_LIVE = "live"  # at least one launcher still beats: the launcher is at work
LAUNCHERS_GONE = "gone"  # none beats and none finished cleanly … at least one expired
LAUNCHERS_DONE = "done"  # every launcher finished


def launchers(leases: Sequence[LeaseFacts]) -> Optional[str]:
    """:data:`LAUNCHERS_LIVE`, :data:`LAUNCHERS_GONE` or :data:`LAUNCHERS_DONE` for a run's leases; None for none.

    Gone: no lease lives and one expired (a finished node 1 does not keep a run whose node 0 died alive).
    """
    if not leases:
        return None
    if any(not lease.done and not lease.expired for lease in leases):
        return LAUNCHERS_LIVE
    if any(lease.expired for lease in leases):
        return LAUNCHERS_GONE
    return LAUNCHERS_DONE


def lost_nodes(leases: Sequence[LeaseFacts]) -> tuple[int, ...]:
    """The nodes whose lease expired while another node's did not (ascending): named beside the run's word.

    When every lease expired, none is named: the run's own word (``lost``) says it.
    """
    expired = sorted({lease.node for lease in leases if lease.expired})
    if not expired or len(expired) == len({lease.node for lease in leases}):
        return ()
    return tuple(expired)


def describe(status: str, ranks: Sequence[int] = (), nodes: Sequence[int] = (), marks: str = "") -> str:
    """A run's word with what explains it, as every surface prints it: ``failed r0 · lost node 1``.

    ``ranks`` are the ranks named beside the word (``RunSummary.explaining_ranks``), ``nodes`` the
    :func:`lost_nodes`, ``marks`` what :func:`marks_text` adds (``completed ⚠ 2 blocked``).
    """
    text = str(status)
    if ranks:
        text += " " + ",".join(f"r{r}" for r in ranks)
    if nodes:
        text += " · " + lost_nodes_text(nodes)
    if marks:
        text += " " + marks
    return text


def lost_nodes_text(nodes: Sequence[int]) -> str:
    """``lost node 1``, ``lost nodes 1,2`` ("" for none)."""
    if not nodes:
        return ""
    return ("lost node " if len(nodes) == 1 else "lost nodes ") + ",".join(str(n) for n in nodes)


@dataclass(frozen=True)
class RankFacts:
    """What is known about one rank's newest attempt (from its records and the files around it)."""

    rank: int
    last_ts: Optional[float]  # record time of its newest record
    end_status: Optional[str] = None  # the rank_end record's status, when it ended
    end_exit_code: Optional[int] = None
    end_ts: Optional[float] = None
    node_outcome_written: bool = False  # its node's guard outcome exists (the launcher of that node is done)
    last_seen: Optional[float] = None  # when the ingester stored its newest record (it had read the file to its end)
    node: Optional[int] = None  # the node it ran on (its stream header's node_rank), when known
    hang: Optional["HangFact"] = None  # its watchdog's record of the step it is silent in (core.hang.current_hang)
    last_step: Optional[int] = None  # its newest step (who stopped first: the rank behind, see stopped_first)
    median_interval_s: Optional[float] = None  # its own median step interval (how long a silence is quiet)


@dataclass(frozen=True)
class RunFacts:
    """What is known about a run: the facts :func:`decide_run` turns into words."""

    ranks: tuple[RankFacts, ...]
    now: float
    median_interval_s: Optional[float] = None
    last_ingest: Optional[float] = None  # when the ingester last stored anything of this run (None: not known)
    manifest_status: Optional[str] = None
    summary_status: Optional[str] = None
    guard_training_status: Optional[str] = None  # the collected guard outcome: completed | incomplete
    outcome_exit_codes: tuple[Optional[int], ...] = ()  # exit codes of the node outcomes written
    outcome_failed: int = 0  # node outcomes that report a failure
    missing: bool = False
    stall_floor_s: float = STALL_FLOOR_S
    leases: tuple[LeaseFacts, ...] = ()  # the node launchers' leases (none: a run written before leases)


@dataclass(frozen=True)
class RunVerdict:
    """A run's status and the state of each of its ranks (same order as ``RunFacts.ranks``)."""

    status: RunStatus
    ranks: tuple[RankState, ...]

    @property
    def silent_ranks(self) -> tuple[int, ...]:
        """Indexes into the facts' ranks that are stalled or lost (use :func:`decide_run`'s facts for rank ids)."""
        return tuple(i for i, s in enumerate(self.ranks) if s in (RankState.STALLED, RankState.LOST))


def decide_ranks(facts: RunFacts) -> tuple[RankState, ...]:
    """The state of every rank of a run (pure; see the module docstring for the rules)."""
    limit = stall_limit_s(facts.median_interval_s, facts.stall_floor_s)
    final = _final_word(facts) is not None
    stamps = [r.last_ts for r in facts.ranks if r.last_ts is not None]
    newest = max(stamps) if stamps else None
    ingest_idle = facts.last_ingest is None or facts.now - facts.last_ingest > limit
    ended = [r for r in facts.ranks if r.end_status is not None]
    state = launchers(facts.leases)
    expired = {lease.node for lease in facts.leases if lease.expired}
    out = []
    for r in facts.ranks:
        if r.end_status is not None:
            out.append(rank_end_state(r.end_status, r.end_exit_code))
            continue
        if final or r.node_outcome_written:
            out.append(RankState.LOST)
            continue
        if r.node in expired or (r.node is None and state == LAUNCHERS_GONE):  # its launcher (or node) is gone
            out.append(RankState.LOST)
            continue
        others = [o for o in ended if o.rank != r.rank]
        # While a launcher beats, torchrun is still waiting on a silent rank: it is stalled, not lost.
        if state != LAUNCHERS_LIVE and others and len(others) == len(facts.ranks) - 1:
            since = max([o.end_ts or o.last_ts or 0.0 for o in others] + [r.last_ts or 0.0])
            if facts.now - since > limit and ingest_idle:
                out.append(RankState.LOST)
                continue
        silent = False
        if r.last_ts is not None and newest is not None:
            # Silent against now only when the ingester is not merely behind: it has seen nothing of the run for
            # the limit, or it already found the rank that silent when it read the rank's file to its end.
            read_late = r.last_seen is not None and r.last_seen - r.last_ts > limit
            silent = newest - r.last_ts > limit or (facts.now - r.last_ts > limit and (ingest_idle or read_late))
        out.append(RankState.STALLED if silent else RankState.RUNNING)
    return tuple(_mark_aborted(facts.ranks, _hang_states(facts.ranks, out)))


# --------------------------------------------------------------------------- nothing hides (docs/watch.md)

#: A rank still ``running`` is *quiet* — greyed with its silence age — after this many of its own step intervals …
QUIET_INTERVALS = 3.0
#: … and at least this many seconds (the ingester's own delay, a poll or two, stays well below it).
QUIET_FLOOR_S = 5.0


def quiet_limit_s(own_interval_s: Optional[float], stall_limit: float) -> float:
    """Seconds of silence after which a running rank is quiet: ``max(QUIET_FLOOR_S, 3 × its own median step
    interval)``, never past the stall limit (a quiet rank is one that may be stalling, before it is declared)."""
    interval = own_interval_s if own_interval_s and own_interval_s > 0 else 0.0
    return min(max(QUIET_FLOOR_S, QUIET_INTERVALS * interval), stall_limit)


def quiet_ranks(facts: RunFacts, states: Sequence[RankState]) -> tuple[tuple[int, float], ...]:
    """``(index, seconds silent)`` of the ranks still ``running`` whose newest record is older than their
    :func:`quiet_limit_s` at ``facts.now`` (pure).

    Long before a stall is declared (``max(30 s, 10 × the run's median interval)``, and only once the ingester
    too has seen nothing of the run), a rank at 5 steps/s silent for 12 s is not ``running`` as the others are:
    every surface greys it and says ``r1 silent 12s``. Its state word stays ``running``: quiet is a mark beside
    the word, not a state. Ended, stalled, lost and waiting ranks are never quiet (their word says more).
    """
    if _final_word(facts) is not None:
        return ()
    limit = stall_limit_s(facts.median_interval_s, facts.stall_floor_s)
    out = []
    for i, (r, s) in enumerate(zip(facts.ranks, states)):
        if s is not RankState.RUNNING or r.end_status is not None or r.last_ts is None:
            continue
        silent = facts.now - r.last_ts
        if silent > quiet_limit_s(r.median_interval_s, limit):
            out.append((i, silent))
    return tuple(out)


def stopped_first(ranks: Sequence[RankFacts], states: Sequence[RankState], tie_s: Optional[float] = None
                  ) -> tuple[int, ...]:
    """Indexes of the rank(s) that stopped first among the stalled and lost ones: named beside ``stalled``.

    A rank that stops (SIGSTOP, a deadlock outside any collective) stops its peers at their next collective, so
    every rank ends up silent; the one to look at is the one that stopped first: the lowest newest step (it is
    behind the others), and among those the one whose newest record — a step, or its watchdog's ``hang``
    record: a rank that still runs writes one, a SIGSTOPped one cannot — is older than the others' by more than
    ``tie_s`` (the run's median step interval: ranks in lock-step write the same step within it, so a smaller
    gap says nothing). Ranks that cannot be told apart are named together; a rank without a step counts as
    behind every rank with one. (When the hang records tell who waits inside a collective, :func:`hang_roles`
    makes those ``waiting``: they are not stalled at all.)
    """
    silent = [i for i, s in enumerate(states) if s in (RankState.STALLED, RankState.LOST)]
    if len(silent) < 2:
        return tuple(silent)

    def step(i: int) -> float:
        return float("-inf") if ranks[i].last_step is None else float(ranks[i].last_step)

    def newest(i: int) -> Optional[float]:
        stamps = [t for t in (ranks[i].last_ts, ranks[i].hang.ts if ranks[i].hang is not None else None)
                  if t is not None]
        return max(stamps) if stamps else None

    low = min(step(i) for i in silent)
    behind = [i for i in silent if step(i) == low]
    stamps = [t for i in behind if (t := newest(i)) is not None]
    if len(behind) < 2 or not stamps:
        return tuple(behind)
    margin = tie_s if tie_s is not None and tie_s > 0 else 0.0
    oldest = min(stamps)
    return tuple(i for i in behind if (t := newest(i)) is None or t <= oldest + margin)


def validation_mark(*, blocked: int, summary_missing: bool) -> Optional[str]:
    """The mark beside a run's word when its validation needs a look: ``2 blocked`` (requests whose every
    allowed attempt failed: no drainer will take them again), else ``validation missing`` (its current final
    summary says ``Validation: MISSING``: requests left without a receipt, or none published); None when fine.

    A run with a mark needs attention (:func:`needs_attention`) whatever its word: ``✓ completed ⚠ 2 blocked``.
    """
    if blocked > 0:
        return f"{blocked} blocked"
    if summary_missing:
        return "validation missing"
    return None


def needs_attention(status: RunStatus, mark: Optional[str] = None) -> bool:
    """Whether a run needs the user's attention: an alert state (failed, lost, stalled) or a validation mark
    (:func:`validation_mark`). The Runs screen counts these (``3 need attention``) and ``traceml status --json``
    says ``attention``."""
    return status in ALERT_STATES or mark is not None


#: Exit codes and rank ends that say how a run was stopped from outside (``interrupted``): the signal's name.
_STOP_ENDS = {"interrupted": "SIGINT", "terminated": "SIGTERM"}


def signal_name(code: Optional[int]) -> Optional[str]:
    """``SIGINT`` for an exit code that reports a signal (a shell's 128+N, torchrun's −N); None otherwise."""
    if not isinstance(code, int) or isinstance(code, bool) or code == 0:
        return None
    number = -code if code < 0 else code - 128 if code > 128 else None
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def interruption(exit_code: Optional[int], rank_ends: Iterable[Optional[str]]) -> Optional[str]:
    """What stopped an ``interrupted`` run: the signal its launcher's exit code reports (the manifest's
    ``exit_code``, 130 = SIGINT), else what its ranks' end records say (``interrupted``: a KeyboardInterrupt,
    SIGINT; ``terminated``: SIGTERM, SIGTERM first); None when nothing tells."""
    name = signal_name(exit_code)
    if name is not None:
        return name
    ends = {e for e in rank_ends if e in _STOP_ENDS}
    if "terminated" in ends:
        return _STOP_ENDS["terminated"]
    return _STOP_ENDS["interrupted"] if ends else None


def compact_age(seconds: float) -> str:
    """``42s``, ``3m``, ``2.1h``, ``5.0d``: a silence as the marks print it (the watch's ages read alike)."""
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.0f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


#: The mark of a failed run whose failure came after its training (:func:`crashed_in_teardown`).
TEARDOWN_MARK = "after training"


def marks_text(mark: Optional[str] = None, quiet: Sequence[tuple[int, float]] = (),
               interrupted_by: Optional[str] = None, interrupted_at: Optional[float] = None,
               teardown: bool = False) -> str:
    """The marks every surface prints after a run's word (:func:`describe`): ``SIGINT 21:14`` (what interrupted
    it and when, UTC), ``r1 silent 12s`` (quiet ranks: ``(rank, seconds)``, the longest silence), ``after training``
    (a crash in teardown, after every rank's script returned: :func:`crashed_in_teardown`), ``⚠ 2 blocked``
    (validation)."""
    parts = [TEARDOWN_MARK] if teardown else []
    if interrupted_by:
        when = time.strftime(" %H:%M", time.gmtime(interrupted_at)) if interrupted_at is not None else ""
        parts.append(interrupted_by + when)
    if quiet:
        parts.append(",".join(f"r{r}" for r, _ in quiet) + f" silent {compact_age(max(s for _, s in quiet))}")
    if mark:
        parts.append(f"⚠ {mark}")
    return " ".join(parts)


# --------------------------------------------------------------------------- hang forensics


@dataclass(frozen=True)
class HangFact:
    """What a rank's hang watchdog recorded about the step it went silent in (records.Hang, reduced).

    ``collective``: the ``torch.distributed`` function its main thread was inside (None: not in one);
    ``seq``: the process group's count of collectives it had issued (None: not known).
    """

    collective: Optional[str] = None
    seq: Optional[int] = None
    ts: Optional[float] = None  # when the watchdog wrote it (a record of a rank that still runs: who stopped first)


#: Rank states of a rank that stopped making progress (hang forensics looks only at these).
STOPPED_RANK_STATES = frozenset({RankState.STALLED, RankState.WAITING, RankState.FAILED, RankState.LOST,
                                    RankState.ABORTED, RankState.INTERRUPTED})


def hang_roles(ranks: Sequence[RankFacts], states: Sequence[RankState]) -> tuple[frozenset[int], frozenset[int]]:
    """(culprits, waiting): indexes into ``ranks`` of a hang's culprit(s) and of the ranks waiting for them.

    Among the ranks that stopped (stalled, or ended in failure or by a stop
    signal), a rank *waits* when its watchdog found it inside a collective, or
    ahead of a peer by collective count, and not behind any; every other
    stopped rank — outside the collective, behind in count, or with no hang
    record at all (a process that cannot run its watchdog, e.g. SIGSTOPped) —
    is a *culprit*. Both sets are empty unless at least one rank waits and at
    least one is a culprit (peers that all wait in the same collective name no
    one: the cause is elsewhere).
    """
    stopped = [i for i, s in enumerate(states) if s in STOPPED_RANK_STATES]
    facts = {i: ranks[i].hang for i in stopped if ranks[i].hang is not None}
    if not facts:
        return frozenset(), frozenset()
    seqs = [h.seq for h in facts.values() if h.seq is not None]
    top = max(seqs) if seqs else None
    apart = bool(seqs) and min(seqs) < top  # type: ignore[operator]

    def waits(h: HangFact) -> bool:
        if h.seq is not None and top is not None and h.seq < top:
            return False  # behind: its peers issued a collective it never did
        return h.collective is not None or (apart and h.seq == top)

    waiting = frozenset(i for i, h in facts.items() if waits(h))
    culprits = frozenset(i for i in stopped if i not in waiting)
    if not waiting or not culprits:
        return frozenset(), frozenset()
    return culprits, waiting


def _hang_states(ranks: Sequence[RankFacts], states: list[RankState]) -> list[RankState]:
    """A hang's words: its waiting ranks ``waiting`` while silent, ``aborted`` once they ended (a collective
    timeout is their failure, not the cause); a culprit stopped from outside (torchrun's SIGTERM after the
    timeout) ``failed``: it is why the run failed. Other states are left as they are."""
    culprits, waiting = hang_roles(ranks, states)
    if not waiting:
        return states
    out = list(states)
    for i in waiting:
        if out[i] is RankState.STALLED:
            out[i] = RankState.WAITING
        elif out[i] in (RankState.FAILED, RankState.LOST, RankState.INTERRUPTED):
            out[i] = RankState.ABORTED
    for i in culprits:
        if out[i] in (RankState.INTERRUPTED, RankState.ABORTED):
            out[i] = RankState.FAILED
    return out


#: Rank states of a rank that ended in failure (the first one keeps failed/lost; see :func:`first_failure`).
FAILING_RANK_STATES: frozenset[RankState] = frozenset({RankState.FAILED, RankState.LOST, RankState.ABORTED})


def failure_time(rank: RankFacts) -> Optional[float]:
    """When a rank failed, as far as its records tell: its end record's time, else its newest record's."""
    if rank.end_status is not None and rank.end_ts is not None:
        return rank.end_ts
    return rank.last_ts


def first_failure(ranks: Sequence[RankFacts], states: Sequence[RankState]) -> Optional[int]:
    """Index (into ``ranks``) of the rank that failed first, among those failed, lost or aborted; None if none.

    A hang's culprit (:func:`hang_roles`) first: its peers' collective timed out
    before torchrun stopped it. Then earliest :func:`failure_time` (a rank with no time last); at the same
    time a rank without an end record (it died silently) before one with, then
    the lower rank.
    """
    candidates = [i for i, s in enumerate(states) if s in FAILING_RANK_STATES]
    if not candidates:
        return None
    culprits, _ = hang_roles(ranks, states)  # a hang's culprit failed first, whatever the times say

    def key(i: int) -> tuple:
        t = failure_time(ranks[i])
        return (i not in culprits, t is None, t or 0.0, ranks[i].end_status is not None, ranks[i].rank)

    return min(candidates, key=key)


def _mark_aborted(ranks: Sequence[RankFacts], states: list[RankState]) -> list[RankState]:
    first = first_failure(ranks, states)
    if first is None:
        return states
    since = failure_time(ranks[first])

    def stopped_after(i: int) -> bool:  # torchrun tore it down (SIGTERM) after the first failure
        t = failure_time(ranks[i])
        return states[i] is RankState.INTERRUPTED and since is not None and t is not None and t >= since

    return [RankState.ABORTED if i != first and (s in FAILING_RANK_STATES or stopped_after(i)) else s
            for i, s in enumerate(states)]


def launcher_lost(facts: RunFacts) -> bool:
    """Whether the launcher died before finalizing: no final word, every rank ended, one by SIGTERM, long ago.

    A dying launcher's training gets SIGTERM (core/lifeline.py), and the SDK
    records it (``rank_end`` ``terminated``); a live launcher writes its final
    word within seconds of the last rank's end. So a run whose ranks all ended,
    one of them terminated, with no final word for the stall limit after the
    last end (and nothing new ingested meanwhile) has lost its launcher.
    """
    if _final_word(facts) or not facts.ranks or launchers(facts.leases) == LAUNCHERS_LIVE:
        return False
    if any(r.end_status is None for r in facts.ranks) or not any(r.end_status == "terminated" for r in facts.ranks):
        return False
    limit = stall_limit_s(facts.median_interval_s, facts.stall_floor_s)
    last_end = max((r.end_ts or r.last_ts or 0.0) for r in facts.ranks)
    ingest_idle = facts.last_ingest is None or facts.now - facts.last_ingest > limit
    return ingest_idle and facts.now - last_end > limit


def decide_run(facts: RunFacts) -> RunVerdict:
    """A run's status from its facts, and its ranks' states (pure).

    Order of the rules: a folder gone from disk is ``missing``; a final word of
    the launcher (manifest, else summary) is kept, but a ``completed`` launch
    whose guard outcomes are incomplete or failed, or with a failed rank, is
    ``failed``; without a final word, a launcher that died
    (:func:`launcher_lost`) makes the run ``lost``, a failed rank ``failed``
    at once, a lost rank ``lost``, every rank ended cleanly ``completed``, a
    silent rank ``stalled``; otherwise it is ``running``.
    """
    ranks = decide_ranks(facts)
    if facts.missing:
        return RunVerdict(RunStatus.MISSING, ranks)
    word = _final_word(facts)
    guard_bad = (facts.guard_training_status not in (None, "completed")) or facts.outcome_failed > 0
    if word is not None:
        if word is RunStatus.COMPLETED and (guard_bad or RankState.FAILED in ranks or RankState.ABORTED in ranks):
            return RunVerdict(RunStatus.FAILED, ranks)
        return RunVerdict(word, ranks)
    state = launchers(facts.leases)
    if state == LAUNCHERS_GONE:  # every launcher died without a final word, whether ranks wrote or not
        return RunVerdict(RunStatus.LOST, ranks)
    if state == LAUNCHERS_LIVE:
        return RunVerdict(_while_launcher_lives(facts, ranks), ranks)
    if launcher_lost(facts):
        return RunVerdict(RunStatus.LOST, ranks)
    if RankState.FAILED in ranks or RankState.ABORTED in ranks or facts.outcome_failed > 0:
        return RunVerdict(RunStatus.FAILED, ranks)
    if RankState.LOST in ranks:
        return RunVerdict(RunStatus.LOST, ranks)
    if RankState.INTERRUPTED in ranks and all(s in (RankState.INTERRUPTED, RankState.COMPLETED) for s in ranks):
        return RunVerdict(RunStatus.INTERRUPTED, ranks)
    if ranks and all(s is RankState.COMPLETED for s in ranks):
        return RunVerdict(RunStatus.COMPLETED, ranks)
    if RankState.STALLED in ranks:
        return RunVerdict(RunStatus.STALLED, ranks)
    return RunVerdict(RunStatus.RUNNING, ranks)


def _while_launcher_lives(facts: RunFacts, ranks: Sequence[RankState]) -> RunStatus:
    """A run's word while a launcher lease lives and no final word is written (see the module docstring).

    A rank's own failure is ``failed`` at once (the launcher will say so too); a lost rank (its node's lease
    expired) or a silent one makes it ``stalled`` (it cannot go on without them, and it is not over). Ends that only the launcher can judge — every rank ended
    cleanly or stopped from outside, or failures that came after a rank was stopped from outside (its peers
    torn down by the same stop fail in their collectives) — are ``running`` until the launcher's word.
    """
    failing = [i for i, s in enumerate(ranks) if s in (RankState.FAILED, RankState.ABORTED)]
    if failing or facts.outcome_failed > 0:
        first = first_failure(facts.ranks, ranks)
        since = failure_time(facts.ranks[first]) if first is not None else None
        stops = [failure_time(r) for r, s in zip(facts.ranks, ranks) if s is RankState.INTERRUPTED]
        after_stop = since is not None and any(t is not None and t <= since for t in stops)
        if not after_stop or facts.outcome_failed > 0:
            return RunStatus.FAILED
    if RankState.LOST in ranks or RankState.STALLED in ranks:  # the run cannot go on without them; not over yet
        return RunStatus.STALLED
    return RunStatus.RUNNING


def outcome_failed(status: Optional[str], exit_code: Optional[int]) -> bool:
    """Whether one node's guard outcome reports a failure."""
    return status == "failed" or (isinstance(exit_code, int) and not isinstance(exit_code, bool) and exit_code != 0)


# --------------------------------------------------------------------------- the index's writer

#: The index writer's newest commit is overdue after this many expected commit intervals while runs are live.
COMMIT_OVERDUE_INTERVALS = 3.0


def commit_overdue(age_s: Optional[float], poll_s: float, live_intervals_s: Sequence[Optional[float]]) -> bool:
    """Whether the writer's newest commit is late enough to warn about (the watch header, docs/watch.md).

    Only while runs are live (``live_intervals_s``: the median step interval of
    each running run, None when not known): a live rank writes every step and
    the writer commits what it reads, so a commit is expected every poll
    interval or every step of the fastest live run, whichever is longer. Overdue
    is older than :data:`COMMIT_OVERDUE_INTERVALS` of those. A writer that is
    overdue still holds the lock: this is a warning, never a reason to doubt
    the ranks' own states (a hung collective also stops the commits).
    """
    if not live_intervals_s or age_s is None:
        return False
    known = [i for i in live_intervals_s if i is not None and i > 0]
    expected = max(poll_s, min(known)) if known else poll_s
    return age_s > COMMIT_OVERDUE_INTERVALS * expected


# --------------------------------------------------------------------------- validation backlog


def claim_is_stale(*, heartbeat: Optional[float], lease_s: Optional[float], now: float,
                   owner_alive: Optional[bool]) -> bool:
    """Whether a claim was abandoned.

    ``owner_alive`` is what a process probe on the owner's host said (True or
    False), or None when the owner runs on another host; then only its
    heartbeat tells, and a claim whose heartbeat is older than its lease is
    stale (one without heartbeat or lease cannot prove it is alive).
    """
    if owner_alive is not None:
        return not owner_alive
    if heartbeat is None or lease_s is None:
        return True
    return now - heartbeat > lease_s


def decide_backlog(*, has_receipt: bool, has_claim: bool, claim_stale: bool, failures: int,
                   max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> BacklogState:
    """The state of one validation request from the files around it (pure).

    A receipt is final; a live claim is being worked on, an abandoned one is
    ``stale-claim``; failures with a retry left are ``failed``, with every
    allowed attempt spent ``blocked``; nothing yet is ``pending``.
    """
    if has_receipt:
        return BacklogState.COMPLETED
    if has_claim:
        return BacklogState.STALE_CLAIM if claim_stale else BacklogState.CLAIMED
    if failures >= max(1, max_attempts):
        return BacklogState.BLOCKED
    if failures:
        return BacklogState.FAILED
    return BacklogState.PENDING


def retry_ready_at(*, failures: int, last_failed: Optional[float],
                   backoff_s: float = DEFAULT_RETRY_BACKOFF_S) -> Optional[float]:
    """When a failed request may be tried again (unix seconds); None when nothing holds it back.

    A failure is often transient (a busy GPU, a full disk): retrying at once
    burns every allowed attempt in seconds. The n-th failure holds the request
    back ``backoff_s × 2^(n-1)`` seconds after it (capped at
    :data:`RETRY_BACKOFF_CAP_S`); drainers take other ready requests meanwhile.
    Backoff changes when a request is retried, never its state word.
    """
    if failures <= 0 or last_failed is None or backoff_s <= 0:
        return None
    return last_failed + min(RETRY_BACKOFF_CAP_S, backoff_s * 2.0 ** min(failures - 1, 30))


def count_states(states: Iterable[str], order: Sequence[str]) -> dict[str, int]:
    """How many of each state word, in ``order`` (zero counts left out)."""
    counts = {s: 0 for s in order}
    for s in states:
        counts[s] = counts.get(s, 0) + 1
    return {str(k): v for k, v in counts.items() if v}


class WorkerQcState(StrEnum):
    """A run's heavy QC backlog as a whole (docs/qc.md, "Heavy QC through the backlog")."""

    PASSED = "passed"  # requests exist and every one has its receipt
    PENDING = "pending"  # some wait: pending, claimed, stale-claim or failed with a retry left
    FAILED = "failed"  # at least one is blocked: every allowed attempt failed
    NOT_REQUESTED = "not_requested"  # no QC request was ever written


def decide_worker_qc(states: Iterable[BacklogState]) -> WorkerQcState:
    """The word for a QC backlog from its requests' :func:`decide_backlog` words (pure).

    Pending or failed QC is not passed QC: ``passed`` only when every request is ``completed``.
    """
    words = list(states)
    if not words:
        return WorkerQcState.NOT_REQUESTED
    if BacklogState.BLOCKED in words:
        return WorkerQcState.FAILED
    if any(word is not BacklogState.COMPLETED for word in words):
        return WorkerQcState.PENDING
    return WorkerQcState.PASSED
