"""Failure forensics: who failed first, where, and why — from records and a stderr tail (pure).

A failed run usually ends with every rank failed: the one that broke and the
peers that died in their next collective because of it. This module names the
first (the culprit) and labels the others (victims, ``aborted after r1``),
using the same rule as the rank states (:func:`traceml_tui.core.state.first_failure`),
then reads the node's stderr tail for the rank's exception line or the signal
that ended it, and classifies the cause into a small closed set of words
(:data:`CAUSES`). The launcher writes the result as the ``failure`` section of
``final_summary.json`` (docs/run.md "Failure forensics"); ``traceml watch``
shows the same section on the Run screen.

Nothing here reads a file: callers hand in each rank's trail (:class:`RankTrail`)
and each node's stderr tail (:class:`NodeLog`). An exception line is scrubbed of
absolute paths and host addresses and capped at :data:`MAX_LINE` characters,
so the section can be stored in an artifact (docs/run.md: no host names, no
absolute paths).

Where a line comes from: ``traceml run`` prefixes every line a rank writes
with ``[rank<N>]:`` (docs/run.md "Training logs"; torch's excepthook already
tags an uncaught exception's lines); a one-process run's unprefixed lines are its only rank's;
torchrun's own ``ChildFailedError`` report names each failed rank with its exit
code and signal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Optional, Sequence

from traceml_tui.core import records
from traceml_tui.core.hang import current_hang, fact_of, hang_report
from traceml_tui.core.state import (
    CRASH_SIGNALS,
    RankFacts,
    RankState,
    RunFacts,
    crashed_in_teardown,
    decide_ranks,
    first_failure,
    self_inflicted_exit,
    with_exit_codes,
)

#: The cause words, in the order they are tried. ``cuda-oom``: CUDA out of memory; ``comm-timeout``: an
#: NCCL/gloo collective timed out; ``peer-lost``: a peer's connection closed or reset (NCCL/gloo);
#: ``exception``: any other Python exception; ``killed``: SIGKILL with no exception (the host's OOM killer,
#: or ``kill -9``); ``crash``: a fatal signal of the process itself (SIGSEGV, SIGBUS, SIGABRT, SIGILL,
#: SIGFPE); ``signal``: another signal from outside (SIGTERM, SIGHUP, …); ``exit-code``: the script exited
#: with a non-zero code and no exception (``sys.exit(3)``); ``launcher-lost``: the launcher died before it
#: finalized the run; ``teardown-crash``: every rank's script returned and a process then crashed while shutting
#: down (:func:`traceml_tui.core.state.crashed_in_teardown`); ``unknown``: no evidence.
CAUSES: tuple[str, ...] = ("cuda-oom", "comm-timeout", "peer-lost", "exception", "killed", "crash", "signal",
                           "exit-code", "launcher-lost", "hang", "teardown-crash", "unknown")
#: One-phrase meaning of each cause word (the summary card and the Run screen show it beside the word).
CAUSE_TEXT: dict[str, str] = {
    "cuda-oom": "CUDA out of memory",
    "comm-timeout": "a collective (NCCL/gloo) timed out",
    "peer-lost": "a peer's connection closed (NCCL/gloo)",
    "exception": "Python exception",
    "killed": "no exception: the host's OOM killer or kill -9",
    "crash": "the process crashed (fatal signal)",
    "signal": "stopped by a signal from outside",
    "exit-code": "the script exited with a non-zero code, no exception (sys.exit)",
    "launcher-lost": "the launcher died before finalizing the run",
    "hang": "it never reached the collective its peers waited in",
    "teardown-crash": "training completed: every rank's script returned, then the process crashed while shutting "
                      "down",
    "unknown": "no exception or signal found",
}
#: Causes that say only how a hang's culprit was stopped, not why the run failed (then the cause is ``hang``).
_WEAK_CAUSES = frozenset({"signal", "unknown", "comm-timeout", "peer-lost", "launcher-lost"})
#: The longest exception line kept (characters, after scrubbing).
MAX_LINE = 200
#: The most stderr a caller needs to hand in per node (bytes from the end of the log).
TAIL_BYTES = 64 * 1024

_CRASH_SIGNALS = frozenset(s.name for s in CRASH_SIGNALS)
_SIGNAL_NUMBERS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
                   11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}

_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:\s?(.*)$")
_TRACEBACK = "Traceback (most recent call last):"
# An exception line: a dotted class name at column 0, then ": message" or nothing.
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)(?::\s*(.*))?$")
_BLOCK_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_BLOCK_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)(?:.*\((SIG[A-Z]+)\))?")
_SIGNAL_NAME = re.compile(r"\b(SIG(?:KILL|TERM|SEGV|BUS|ABRT|ILL|FPE|HUP|INT|PIPE))\b")

_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|out of memory.*CUDA|CUDA error: out of memory|"
                  r"HIP out of memory", re.IGNORECASE)
_TIMEOUT = re.compile(r"timed?[ -]?out|timeout|deadline exceeded", re.IGNORECASE)
_COMM = re.compile(r"nccl|gloo|collective|processgroup|c10d|watchdog|distbackend|allreduce|all_reduce|barrier",
                   re.IGNORECASE)
_PEER = re.compile(r"connection (?:closed|reset)|closed by peer|reset by peer|broken pipe|"
                   r"remote (?:process|worker|peer)|peer (?:closed|lost|disconnected|died)|socket closed|"
                   r"NCCL communicator was aborted", re.IGNORECASE)

# Scrubbing: absolute paths (POSIX and Windows) keep only their last component; addresses become <host>.
_PATH = re.compile(r"(?<![\w.])(?:[A-Za-z]:\\|/)(?:[^\s/\\:\]\[\"',()]+[/\\])+([^\s/\\:\]\[\"',()]*)")
_IPV4 = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b")
_IPV6 = re.compile(r"\[[0-9A-Fa-f:]*:[0-9A-Fa-f:]+\]")
_HOSTPORT = re.compile(r"\b[A-Za-z0-9][\w-]*(?:\.[\w-]+)+:\d{2,5}\b")  # host.domain:port
#: ``file.ext:line`` is a source location, not ``host.domain:port``.
_SOURCE_EXT = frozenset({"py", "pyx", "c", "cc", "cpp", "cxx", "h", "hpp", "cu", "cuh", "so", "rs", "go", "java"})


@dataclass(frozen=True)
class RankTrail:
    """What one rank's newest attempt recorded: its node, last step, last record time and end record."""

    rank: int
    node: Optional[int] = None
    last_step: Optional[int] = None  # newest completed step (from step records or the end record)
    last_ts: Optional[float] = None  # record time of its newest record
    end_status: Optional[str] = None  # the rank_end record's status; None: no end record
    end_exit_code: Optional[int] = None
    end_ts: Optional[float] = None
    hang: Optional[records.Hang] = None  # its watchdog's newest hang record in that attempt (core/hang.py)


@dataclass(frozen=True)
class NodeLog:
    """The tail of one node's training stderr and its path relative to the run directory."""

    node: int
    path: str  # relative, e.g. nodes/node_0/training.stderr.log
    text: str


@dataclass(frozen=True)
class RankReport:
    """What a node's stderr says about one rank: its exception lines (oldest first) and how it exited."""

    exceptions: tuple[str, ...] = ()
    signal: Optional[str] = None
    exit_code: Optional[int] = None


@dataclass(frozen=True)
class Failure:
    """The facts of a failed run, as stored in ``final_summary.json`` ``failure`` (see :meth:`to_dict`)."""

    cause: str
    rank: Optional[int] = None  # the first failing rank (None: no rank recorded anything, e.g. an import error)
    node: Optional[int] = None
    step: Optional[int] = None  # the step it was in: one past its last completed step
    last_step: Optional[int] = None
    state: Optional[str] = None  # its RankState word: failed | lost
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    exception: Optional[str] = None  # scrubbed, capped
    victims: tuple[int, ...] = ()  # ranks that ended in failure after it (aborted after r<rank>)
    log: Optional[str] = None  # relative path of the stderr log that holds its lines
    detail: tuple[str, ...] = field(default=())  # the rank's other exception lines (scrubbed), oldest first
    # (rank, code) of every rank whose state its launcher's exit code decided (core.state.with_exit_codes)
    exit_codes: tuple[tuple[int, int], ...] = ()
    hang: Optional[dict] = None  # core.hang.HangReport.to_dict() when the run failed because a rank hung

    def to_dict(self) -> dict:
        """The JSON section (plain values)."""
        return {"rank": self.rank, "node": self.node, "step": self.step, "last_step": self.last_step,
                "state": self.state, "cause": self.cause, "cause_text": CAUSE_TEXT.get(self.cause, ""),
                "exit_code": self.exit_code, "signal": self.signal, "exception": self.exception,
                "victims": list(self.victims), "log": self.log,
                "exit_codes": {str(rank): code for rank, code in self.exit_codes}, "hang": self.hang}


def scrub(line: str, hosts: Iterable[str] = (), limit: int = MAX_LINE) -> str:
    """``line`` without absolute paths (kept: the file name), addresses or the given host names; capped."""
    text = " ".join(str(line).split())
    for host in sorted({h for h in hosts if h and len(h) > 1}, key=len, reverse=True):
        text = re.sub(re.escape(host), "<host>", text, flags=re.IGNORECASE)
    text = _PATH.sub(lambda m: m.group(1) or "…", text)
    text = _IPV6.sub("<host>", text)
    text = _IPV4.sub("<host>", text)
    text = _HOSTPORT.sub(lambda m: m.group(0) if m.group(0).split(":")[0].rsplit(".", 1)[-1].lower() in _SOURCE_EXT
                         else "<host>", text)
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def _exception_lines(lines: Sequence[str]) -> list[str]:
    """The exception line of every Python traceback in ``lines`` (oldest first)."""
    found = error_lines([(None, line) for line in lines])
    return [lines[i].strip() for i in found if not lines[i].startswith(_TRACEBACK)]


def rank_of_line(line: str) -> tuple[Optional[int], str]:
    """The rank torch's launcher prefixed ``line`` with (``[rank1]: …`` → ``(1, "…")``), else ``(None, line)``."""
    match = _RANK_PREFIX.match(line)
    return (int(match.group(1)), match.group(2)) if match else (None, line)


def error_lines(lines: Sequence[tuple[Optional[int], str]], inside: Optional[dict] = None) -> list[int]:
    """Indices of the error lines among ``(rank, text)`` lines (text without its rank prefix), in order.

    An error line is a traceback's first line (``Traceback (most recent call
    last):``) or its exception line — the same lines :func:`parse_stderr` reads
    a rank's exception from. Each rank's traceback is followed on its own, so
    ranks writing to one log at once do not cut each other's tracebacks.
    ``inside`` carries each rank's traceback state from one call to the next
    (a log read piece by piece); it is updated in place.
    """
    out = []
    inside = {} if inside is None else inside
    for i, (rank, line) in enumerate(lines):
        if line.startswith(_TRACEBACK):
            inside[rank] = True
            out.append(i)
            continue
        if not inside.get(rank) or not line.strip() or line[0].isspace():
            continue
        if _EXCEPTION.match(line.rstrip()):
            out.append(i)
        inside[rank] = False
    return out


def parse_stderr(text: str, *, single_rank: Optional[int] = None) -> dict[int, RankReport]:
    """Each rank's exception lines and exit signal from one node's stderr tail.

    Lines prefixed ``[rank<N>]:`` are rank N's; unprefixed lines are
    ``single_rank``'s when the node ran one process, else torchrun's own, whose
    ``ChildFailedError`` report gives each failed rank's exit code and signal.
    Unreadable or foreign text yields an empty mapping, never an error.
    """
    per_rank: dict[int, list[str]] = {}
    launcher: list[str] = []
    for raw in text.splitlines():
        match = _RANK_PREFIX.match(raw)
        if match:
            per_rank.setdefault(int(match.group(1)), []).append(match.group(2))
        elif single_rank is not None:
            per_rank.setdefault(single_rank, []).append(raw)
        else:
            launcher.append(raw)
    exits: dict[int, tuple[Optional[int], Optional[str]]] = {}
    current: Optional[int] = None
    for line in launcher:  # torchrun: "rank : 1 (local_rank: 1)" then "exitcode : -9 (pid: …) (SIGKILL)"
        rank_match = _BLOCK_RANK.match(line)
        if rank_match:
            current = int(rank_match.group(1))
            continue
        exit_match = _BLOCK_EXIT.match(line)
        if exit_match and current is not None:
            code = int(exit_match.group(1))
            sig = exit_match.group(2) or (_SIGNAL_NUMBERS.get(-code) if code < 0 else None)
            exits[current] = (code, sig)  # an appended log (a resumed run) holds older reports: the newest wins
            current = None
    out: dict[int, RankReport] = {}
    for rank in set(per_rank) | set(exits):
        lines = per_rank.get(rank, [])
        code, sig = exits.get(rank, (None, None))
        if sig is None and single_rank is not None:
            found = [m.group(1) for ln in lines if "received" in ln or "Signal" in ln for m in [_SIGNAL_NAME.search(ln)] if m]
            sig = found[-1] if found else None
        out[rank] = RankReport(exceptions=tuple(_exception_lines(lines)), signal=sig, exit_code=code)
    return out


def classify(exceptions: Sequence[str], signal: Optional[str] = None, exit_code: Optional[int] = None) -> str:
    """The cause word (one of :data:`CAUSES`) for a rank's exception lines and exit signal."""
    text = "\n".join(exceptions)
    if text:
        if _OOM.search(text):
            return "cuda-oom"
        if _TIMEOUT.search(text) and _COMM.search(text):
            return "comm-timeout"
        if _PEER.search(text):
            return "peer-lost"
        if any(_EXCEPTION.match(e) for e in exceptions):
            return "exception"
    if signal == "SIGKILL":
        return "killed"
    if signal in _CRASH_SIGNALS:
        return "crash"
    if signal:
        return "signal"
    if text:
        return "exception"
    if exit_code:
        return "exit-code"
    return "unknown"


def _signal_of_exit(exit_code: Optional[int]) -> Optional[str]:
    if exit_code is None:
        return None
    if exit_code < 0:
        return _SIGNAL_NUMBERS.get(-exit_code)
    if exit_code > 128:
        return _SIGNAL_NUMBERS.get(exit_code - 128)
    return None


def diagnose(trails: Sequence[RankTrail], logs: Sequence[NodeLog], *, exit_code: Optional[int] = None,
             hosts: Iterable[str] = (), launcher_lost: bool = False) -> Optional[Failure]:
    """The failure of a finished run, or None when no rank failed and the launch exit code is 0.

    The first failing rank is the one :func:`traceml_tui.core.state.first_failure`
    names (the rank states say ``failed``/``lost`` for it and ``aborted`` for the
    others); its exception and signal come from its node's stderr. With no rank
    records at all, the node logs' first exception (e.g. an import error before
    ``traceml.init()``) is the evidence. ``exit_code`` is the launch's.
    """
    hosts = tuple(hosts)
    by_node = {log.node: log for log in logs}
    single = len(trails) == 1
    reports: dict[int, tuple[RankReport, NodeLog]] = {}
    for log in logs:
        only = trails[0].rank if single else None
        for rank, report in parse_stderr(log.text, single_rank=only).items():
            reports.setdefault(rank, (report, log))
    # The exit codes torchrun reported (or the one process's): a rank whose script called sys.exit(3) wrote
    # rank_end `exited` without a code, and only these say it failed (core.state.with_exit_codes).
    # Only for a launch that failed: a resumed run's appended stderr still holds the crashed attempt's report.
    codes = {rank: report.exit_code for rank, (report, _) in reports.items()} if exit_code else {}
    if single and exit_code and codes.get(trails[0].rank) is None:  # its stderr may hold warnings, no report
        codes[trails[0].rank] = exit_code
    hangs = {t.rank: t.hang for t in trails
             if t.hang is not None and current_hang(t.hang, t.hang.attempt, t.last_step)}
    ranks = with_exit_codes(tuple(RankFacts(rank=t.rank, last_ts=t.last_ts, end_status=t.end_status,
                                            end_exit_code=t.end_exit_code, end_ts=t.end_ts,
                                            hang=fact_of(hangs[t.rank]) if t.rank in hangs else None)
                                  for t in trails), codes)
    stood_in = tuple((t.rank, r.end_exit_code) for t, r in zip(trails, ranks) if t.end_exit_code != r.end_exit_code)
    trails = [replace(t, end_exit_code=r.end_exit_code) for t, r in zip(trails, ranks)]
    facts = RunFacts(ranks=ranks, now=0.0, manifest_status="failed")
    states = decide_ranks(facts)
    first = first_failure(facts.ranks, states)
    failing = [s in (RankState.FAILED, RankState.LOST, RankState.ABORTED) for s in states]
    if first is None and not any(failing) and not exit_code and not launcher_lost:
        return None
    if first is None:
        # No rank's records say which failed: the first rank the logs blame, else no rank.
        blamed = sorted(reports.items(), key=lambda kv: (not kv[1][0].exceptions, kv[0]))
        if blamed:
            rank, (report, log) = blamed[0]
            trail = next((t for t in trails if t.rank == rank), None)
            return _failure(rank, trail, None, report, log, (), hosts, exit_code, launcher_lost)
        log = next((lg for lg in logs if lg.text.strip()), None)
        report = RankReport(exceptions=tuple(_exception_lines(log.text.splitlines()))) if log else RankReport()
        return _failure(None, None, None, report, log, (), hosts, exit_code, launcher_lost)
    trail = trails[first]
    victims = tuple(sorted(t.rank for t, s in zip(trails, states) if s is RankState.ABORTED))
    report, log = reports.get(trail.rank, (RankReport(), by_node.get(trail.node) if trail.node is not None else None))
    if log is None and len(logs) == 1:
        log = logs[0]
    failure = _failure(trail.rank, trail, states[first], report, log, victims, hosts, exit_code, launcher_lost)
    if crashed_in_teardown(ranks):  # not in a step: after its last one, once every rank's script had returned
        return replace(failure, cause="teardown-crash", step=None, exit_codes=stood_in)
    hung = hang_report(ranks, states, hangs)
    if hung is not None and trail.rank in hung.culprits:  # its peers waited for it: their timeout was a symptom
        # A culprit that crashed, raised or was killed keeps that cause (the hang line still says who waited);
        # one stopped from outside after its peers' timeout, or with no evidence of its own, hung.
        cause = "hang" if failure.cause in _WEAK_CAUSES else failure.cause
        failure = replace(failure, cause=cause, hang=hung.to_dict())
    return replace(failure, exit_codes=stood_in)


def _failure(rank: Optional[int], trail: Optional[RankTrail], state: Optional[RankState], report: RankReport,
             log: Optional[NodeLog], victims: tuple[int, ...], hosts: tuple[str, ...], exit_code: Optional[int],
             launcher_lost: bool) -> Failure:
    if trail is not None and trail.end_status is not None and not self_inflicted_exit(report.exit_code):
        # The rank ended on its own (its end record says how); a stop signal torchrun then sent it while it was
        # still tearing down (a loaded machine: its peer's exit was noticed first) is not how it ended.
        report = replace(report, exit_code=None, signal=None if report.exit_code is not None else report.signal)
    code = report.exit_code
    if code is None and trail is not None:
        code = trail.end_exit_code
    if code is None and rank is None:
        code = exit_code
    sig = report.signal or _signal_of_exit(code)
    cause = "launcher-lost" if launcher_lost and not report.exceptions and sig is None else classify(
        report.exceptions, sig, code)
    if cause == "unknown" and state is RankState.LOST:
        cause = "killed" if sig in (None, "SIGKILL") and trail is not None and trail.end_status is None else cause
    last = trail.last_step if trail is not None else None
    scrubbed = tuple(scrub(e, hosts) for e in report.exceptions)
    return Failure(
        cause=cause, rank=rank, node=trail.node if trail is not None else (log.node if log else None),
        step=(last + 1) if last is not None else (1 if trail is not None else None), last_step=last,
        state=str(state) if state is not None else None, exit_code=code, signal=sig,
        exception=scrubbed[-1] if scrubbed else None, victims=victims, log=log.path if log else None,
        detail=scrubbed[:-1])


def victim_label(rank: int, first: Optional[int]) -> str:
    """``"aborted after r1"`` — how a victim is named beside its rank."""
    return f"aborted after r{first}" if first is not None else "aborted"


def section_lines(section: Mapping) -> list[str]:
    """The few lines a failure section reads as (the summary card and the Run screen's failure panel)."""
    rank = section.get("rank")
    cause = section.get("cause") or "unknown"
    where = f"rank {rank}" if rank is not None else ("the launcher" if cause == "launcher-lost" else "no rank recorded")
    if section.get("node") is not None:
        where += f" on node {section['node']}"
    if section.get("step") is not None:
        where += f", in step {section['step']}"
    elif cause == "teardown-crash" and section.get("last_step") is not None:
        where += f", after its last step ({section['last_step']})"
    how = []
    if section.get("signal"):
        how.append(str(section["signal"]))
    elif section.get("exit_code") not in (None, 0):
        how.append(f"exit {section['exit_code']}")
    if section.get("state") == "lost":
        how.append("no end record")
    lines = [f"{where} — {cause} ({section.get('cause_text') or CAUSE_TEXT.get(cause, '')})"]
    hang = section.get("hang")  # the summary's dict, or its text alone (the Run screen's snapshot)
    hang = hang.get("text") if isinstance(hang, Mapping) else hang
    if isinstance(hang, str) and hang:  # r1 in train.py:42 `time.sleep`, not in all_reduce #57; r0 waiting …
        lines.append(hang)
    second = ", ".join(how)
    if section.get("exception"):
        second = f"{second}: {section['exception']}" if second else str(section["exception"])
    if second:
        lines.append(second)
    tail = []
    victims = section.get("victims") or []
    if victims:
        tail.append(", ".join(f"r{v}" for v in victims) + " " + victim_label(victims[0], rank))
    if section.get("log"):
        tail.append(f"log: {section['log']}")
    if tail:
        lines.append(" · ".join(tail))
    return lines
