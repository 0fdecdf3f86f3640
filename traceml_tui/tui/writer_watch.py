"""Who writes the index `traceml watch` reads, as the watch sees it, and its takeover when the writer is gone.

The facts (probe, coverage, catching up) are :mod:`daemon.writer_health`'s;
this module remembers what one watch saw of them (its roots' coverage, its own
embedded ingester, a takeover under way) and turns them into the header's
:class:`~traceml_tui.tui.snapshots.SourceHealth` (docs/watch.md, "Data source").
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional

from daemon import writer_health
from daemon.writer_health import WriterHealth
from traceml_tui.core.state import RunStatus, commit_overdue
from traceml_tui.tui.snapshots import WRITER_EMBEDDED, WRITER_NONE, SourceHealth


class WriterWatch:
    """One watch's view of its index's writer: this watch's own ingester first, else whoever holds the lock.

    ``probe()`` says who holds the writer lock (a ``daemon.lock.DaemonInfo`` or
    None); without it (and without an ingester) no health is reported.
    ``takeover(roots)`` starts this watch's own ingester and returns
    ``(ingester, None)``, or ``(None, info)`` of a writer that won the race.
    """

    def __init__(self, *, clock: Callable[[], float], lock: threading.RLock, ingester: Any = None,
                 probe: Optional[Callable[[], Any]] = None,
                 takeover: Optional[Callable[[list[str]], tuple[Any, Any]]] = None,
                 ingest_roots: Optional[list[str]] = None, poll_s: float = 0.5) -> None:
        self.clock = clock
        self.probe = probe
        self.takeover = takeover
        self.ingest_roots = [os.path.realpath(r) for r in (ingest_roots or ())]
        self.poll_s = poll_s
        self.ingester = ingester  # an embedded daemon.service.Ingester we own (stopped on close)
        self.coverage = writer_health.Coverage()  # when this watch's roots were last indexed; the writer's roots
        self._started: Optional[float] = None  # when this watch took over (None: given an ingester)
        self._taking_over = False
        self._lock = lock  # the source's: a takeover finishing never races its close()
        self.closed = False

    def observe(self, reader: Any, now: float) -> WriterHealth:
        """Who writes the index now and whether it indexes this watch's roots, caught up (remembered)."""
        last = reader.last_commit()
        if self.ingester is not None:
            health = writer_health.embedded(os.getpid(), self.ingest_roots, self._started, last, now)
        else:
            info = self.probe() if self.probe is not None else None
            health = writer_health.of_holder(info, last, now, self.ingest_roots)
        self.coverage.observe(health, now)
        return health

    def decide_at(self, now: float) -> float:
        """When states are decided: now, or when this watch's roots were last indexed (docs/watch.md)."""
        return self.coverage.decide_at(now)

    def can_take_over(self) -> bool:
        """Whether this watch may start its own ingester now (it has roots, a way to, and none running)."""
        return (self.takeover is not None and not self.closed and self.ingester is None
                and not self._taking_over and bool(self.ingest_roots))

    def take_over(self) -> tuple[str, Optional[int]]:
        """Start this watch's own ingester (the writer is gone); returns (who writes now, its pid).

        It indexes this watch's roots and those of the writer that left (another watch on other roots would
        else find its runs frozen). Called on a worker thread, never the UI's: opening the index and loading
        the ingester's state take a while, and refreshes go on meanwhile. A writer that took the lock first is
        joined instead. Raises what the ingester raises (the App says so).
        """
        if not self.can_take_over():
            return WRITER_EMBEDDED if self.ingester is not None else WRITER_NONE, None
        roots = self.coverage.takeover_roots(self.ingest_roots)
        self._taking_over = True
        started = self.clock()
        try:
            ingester, running = self.takeover(roots)
        finally:
            self._taking_over = False
        if ingester is not None:
            with self._lock:
                if self.closed:  # closed while it started: nobody would stop it
                    ingester.stop()
                    return WRITER_NONE, None
                self.ingester = ingester
                self._started = started
            return WRITER_EMBEDDED, os.getpid()
        return writer_health.kind_of(running), running.pid

    def health(self, writer: WriterHealth, runs: Any, now: float) -> Optional[SourceHealth]:
        """The header's source line facts (None: a plain reader, who writes is not known)."""
        if self.probe is None and self.ingester is None:
            return None
        age = None if writer.last_commit is None else max(0.0, now - writer.last_commit)
        live = [r.median_interval_s for r in runs if r.status is RunStatus.RUNNING]
        return SourceHealth(
            writer=writer.writer, pid=writer.pid, commit_age_s=age,
            overdue=writer.running and commit_overdue(age, self.poll_s, live),
            stale_since=self.coverage.covered_at if self.coverage.frozen else None, unwatched=writer.unwatched,
            taking_over=not writer.running and self._taking_over)

    def close(self) -> None:
        """Stop this watch's own ingester (if any); no takeover after this."""
        self.closed = True
        if self.ingester is not None:
            try:
                self.ingester.stop()
            finally:
                self.ingester = None
