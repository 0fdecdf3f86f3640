"""Who writes the index, and whether what it holds is current (docs/daemon.md, "Writer health").

The index is only as fresh as its writer: a ``traceml daemon``, or the
ingester a ``traceml watch`` embeds. When nobody writes, the ranks' records go
on landing in the run folders unread, so a run whose ranks are alive would read
``stalled`` and then ``lost`` if its states were decided at ``now``. Every
reader of the index therefore decides states *as of* the time the index was
last current. This module owns those facts, once, for ``traceml status`` and
``traceml watch``:

* the probe — who holds the writer lock (:func:`daemon.lock.find_running_daemon`)
  and when the index was last committed (``Reader.last_commit``);
* coverage — whether that writer indexes the roots asked for;
* catching up — a writer that took the lock after the newest commit has not
  read the files written while nobody did, until it commits or has run for
  :data:`NEW_WRITER_GRACE_S`;
* takeover — :class:`Coverage`, a watch's memory of when its roots were last
  indexed and which roots the writer that left indexed.

Pure but for :func:`probe` (which reads the lock file); the clock is passed in.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from traceml_tui.core.jsonsafe import finite_number

from .lock import DaemonInfo, find_running_daemon

#: Who writes the index: this process's own (embedded) ingester, a ``traceml daemon``, another ``traceml watch``,
#: or nobody. The words every surface shows (the watch header, ``traceml status --json``'s ``writer.kind``).
WRITER_EMBEDDED, WRITER_DAEMON, WRITER_WATCH, WRITER_NONE = "this watch", "daemon", "watch", "none"

#: A writer that has just taken the lock is catching up until it commits, or for this long (docs/watch.md).
NEW_WRITER_GRACE_S = 10.0


def under(path: str, roots: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``roots`` or inside one (real paths, as the ingester keeps them)."""
    real = os.path.realpath(path)
    return any(real == r or real.startswith(os.path.realpath(r).rstrip(os.sep) + os.sep) for r in roots)


def _time(value: Any) -> Optional[float]:
    return finite_number(value)


@dataclass(frozen=True)
class WriterHealth:
    """Who writes the index now and whether the index is current for the roots asked for.

    ``writer`` is one of the ``WRITER_*`` words; ``pid`` and ``roots`` those of
    the lock holder (``roots`` the ones it indexes); ``unwatched`` the roots
    asked for that it does not index; ``started`` when it took the lock (None:
    not known); ``last_commit`` when the index last stored a change to any run
    (None: nothing yet); ``catching_up`` that it took the lock after that and
    has not read the backlog yet; ``covers`` that it indexes at least one of the
    roots asked for (or none were asked for).
    """

    writer: str
    pid: Optional[int] = None
    roots: tuple[str, ...] = ()
    unwatched: tuple[str, ...] = ()
    started: Optional[float] = None
    last_commit: Optional[float] = None
    catching_up: bool = False
    covers: bool = False

    @property
    def running(self) -> bool:
        """Whether anybody holds the writer lock."""
        return self.writer != WRITER_NONE

    @property
    def current(self) -> bool:
        """Whether the index is current now for the roots asked for: a writer indexes them and has caught up."""
        return self.running and self.covers and not self.catching_up

    def who(self) -> str:
        """``this watch``, ``daemon pid 4242``, ``watch pid 4242`` or ``no writer``."""
        if not self.running:
            return "no writer"
        if self.writer == WRITER_EMBEDDED or self.pid is None:
            return self.writer
        return f"{self.writer} pid {self.pid}"

    def as_of(self, now: float) -> float:
        """When states are decided by a reader with no memory of earlier looks (``traceml status``): ``now`` while
        the index is current, else its last commit — a silent writer is not a silent rank."""
        if self.current or self.last_commit is None:
            return now
        return min(now, self.last_commit)

    def status_line(self) -> Optional[str]:
        """The one line ``traceml status`` prints when states are not decided at now (None when they are):
        ``no writer — states as of 14:02:31`` (local time of the last commit)."""
        if self.current:
            return None
        if self.running and not self.covers:
            what = f"{self.who()} indexes other roots"
        elif self.running:
            what = f"{self.who()} catching up"
        else:
            what = "no writer"
        if self.last_commit is None:
            return f"{what} — nothing committed yet"
        return f"{what} — states as of {time.strftime('%H:%M:%S', time.localtime(self.last_commit))}"

    def to_json(self, now: float) -> dict:
        """The same facts for ``traceml status --json`` (``decided_at``: the time states were decided at)."""
        return {"kind": self.writer, "pid": self.pid, "roots": list(self.roots), "unwatched": list(self.unwatched),
                "started": self.started, "last_commit": self.last_commit, "catching_up": self.catching_up,
                "current": self.current, "decided_at": self.as_of(now)}


def kind_of(info: Optional[DaemonInfo]) -> str:
    """The ``WRITER_*`` word of a lock holder (None: nobody): a ``traceml watch``'s ingester, else a daemon."""
    if info is None:
        return WRITER_NONE
    return WRITER_WATCH if info.mode == "watch" else WRITER_DAEMON


def _caught_up(started: Optional[float], last_commit: Optional[float], now: float) -> bool:
    """Whether a writer has read what was written before it started: it committed since, or it has run for
    :data:`NEW_WRITER_GRACE_S` (an idle index gives it nothing to commit)."""
    if started is None or now - started > NEW_WRITER_GRACE_S:
        return True
    return last_commit is not None and last_commit >= started


def of_holder(info: Optional[DaemonInfo], last_commit: Optional[float], now: float,
              asked: Iterable[str] = ()) -> WriterHealth:
    """The health of the lock holder ``info`` (None: nobody) for the roots ``asked`` (real paths; none: any)."""
    last = _time(last_commit)
    if info is None:
        return WriterHealth(WRITER_NONE, last_commit=last)
    asked = tuple(asked)
    roots = tuple(str(r) for r in info.roots)
    unwatched = tuple(r for r in asked if roots and not under(r, roots))
    started = _time(info.started)
    return WriterHealth(kind_of(info), info.pid, roots, unwatched, started, last,
                        catching_up=not _caught_up(started, last, now), covers=not asked or len(unwatched) < len(asked))


def embedded(pid: int, roots: Iterable[str], started: Optional[float], last_commit: Optional[float],
             now: float) -> WriterHealth:
    """The health of this process's own ingester over ``roots``, started at ``started`` (None: before we knew)."""
    last = _time(last_commit)
    return WriterHealth(WRITER_EMBEDDED, pid, tuple(roots), (), started, last,
                        catching_up=not _caught_up(started, last, now), covers=True)


def probe(index_path: str | os.PathLike[str], reader: Any, now: float, asked: Iterable[str] = ()) -> WriterHealth:
    """Who writes the index at ``index_path`` now, with ``reader``'s (a ``daemon.reader.Reader``) last commit."""
    asked = [os.path.realpath(r) for r in asked]
    return of_holder(find_running_daemon(index_path), reader.last_commit(), now, asked)


class Coverage:
    """A watch's memory across looks at the writer: when its roots were last indexed by a writer that had caught
    up, and the roots of the lock holder last seen (a takeover indexes them too, so that another watch on other
    roots does not find its runs frozen)."""

    def __init__(self) -> None:
        self.covered_at: Optional[float] = None
        self.last_writer_roots: tuple[str, ...] = ()
        self._current = False

    def observe(self, health: WriterHealth, now: float) -> None:
        """Remember one look at the writer, taken at ``now``."""
        if health.writer in (WRITER_DAEMON, WRITER_WATCH):
            self.last_writer_roots = health.roots
        self._current = health.current
        if self._current:
            self.covered_at = now

    @property
    def frozen(self) -> bool:
        """Whether nobody indexes this watch's roots now (no writer, another root set, or a writer that has not
        caught up yet), though a writer did earlier in this session."""
        return self.covered_at is not None and not self._current

    def decide_at(self, now: float) -> float:
        """The time states are decided at: now, or — when the writer seen earlier is gone — when this watch's
        roots were last indexed, so that the gap before a new writer shows as stale data, not stalled ranks."""
        if self.frozen:
            return min(now, self.covered_at)  # type: ignore[type-var]
        return now

    def takeover_roots(self, roots: Iterable[str]) -> list[str]:
        """The roots a takeover indexes: ``roots`` and those of the writer that left (still folders)."""
        out = list(roots)
        return out + [r for r in self.last_writer_roots if not under(r, out) and os.path.isdir(r)]
