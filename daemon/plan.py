"""Pass planning: which streams a pass reads, and when (docs/daemon.md rule 1 and "Live path").

Polling is primary and inotify only hints. The :class:`Planner` holds the runs and streams the ingester
knows (mirrors of the ``runs`` and ``files`` rows, updated only after their commit), the paths the
watcher named since the last pass, and the timed poll's rounds; it answers with *targets* — the
``(run, file)`` pairs a pass should look at — and never reads a file, writes the index or calls back into
the service. :func:`next_hint` spaces the hint-driven passes with the load.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import NamedTuple, Optional

from traceml_tui.core import rundir

MIN_PASS_GAP_S = 0.05  # hint-driven passes start at least this far apart: events of a burst share one pass
PASS_PACE = 2.0  # ... and this many times the last pass's duration apart (a burst's events share a pass) …
PASS_GAP_PER_STREAM_S = 0.001  # … and this much per stream the last pass read, from its start (see next_hint) …
MAX_PASS_GAP_S = 0.5  # … but never more than this: under a heavy load the lag stays bounded
QUIET_AFTER_S = 60.0  # a stream unchanged this long is re-stat'ed once per rescan, spread over the polls
HINTED_WITHIN_S = 60.0  # … as is one that inotify named this recently (its appends are seen by inotify)
#: Hinted paths outside every known stream that may be a new one: logs, temp files and checkpoints are not.
_STREAM_SUFFIXES = ("", ".json", ".jsonl")


def next_hint(start: float, done: float, streams: int) -> float:
    """When the next hint-driven pass may start, after a pass that ran from ``start`` to ``done`` (monotonic)
    and read ``streams`` streams (docs/daemon.md, "Live path").

    At least MIN_PASS_GAP_S and PASS_PACE times the pass's duration after it ended (a burst's events share
    one pass), and PASS_GAP_PER_STREAM_S per stream read after it began: the more streams a load keeps
    changing, the further apart its passes, so that each pass brings more lines of each rank and its fixed
    costs (the commit, the run rollups) are paid less often. Never more than MAX_PASS_GAP_S after the pass
    began (MIN_PASS_GAP_S after it ended, for a pass longer than that), so that the lag stays bounded.
    """
    paced = done + max(MIN_PASS_GAP_S, PASS_PACE * (done - start))
    cap = max(start + MAX_PASS_GAP_S, done + MIN_PASS_GAP_S)
    return min(cap, max(paced, start + PASS_GAP_PER_STREAM_S * streams))


class File:
    """In-memory mirror of one ``files`` row (its cursor updated only after its commit)."""

    __slots__ = ("file_id", "run_id", "rel", "path", "stream", "rank", "attempt", "node", "identity",
                 "generation", "offset", "skipping", "tail", "size", "mtime_ns", "ino", "gone", "changed", "hinted")

    def __init__(self, **kw) -> None:
        for k in self.__slots__:
            setattr(self, k, kw.get(k))
        self.gone = False
        self.changed = time.monotonic()  # last seen changing (monotonic): a known stream starts as active
        self.hinted = -math.inf  # last named by an inotify hint (monotonic)

    def take(self, cursor: dict) -> None:
        """Take a committed read's cursor (its ``identity`` … ``offset`` … ``ino`` keys, see ``stream.CURSOR``)."""
        if len(cursor) == 8:  # a read's whole cursor (the live case): eight stores, not eight setattr calls
            self.identity, self.generation, self.offset, self.skipping, self.tail, self.size, self.mtime_ns, \
                self.ino = (cursor["identity"], cursor["generation"], cursor["offset"], cursor["skipping"],
                            cursor["tail"], cursor["size"], cursor["mtime_ns"], cursor["ino"])
            return
        for k, v in cursor.items():
            setattr(self, k, v)


class Run:
    """In-memory mirror of one ``runs`` row: its folder, root, streams (by relative path) and the
    (size, mtime_ns) of each side file as last read."""

    __slots__ = ("run_id", "dir", "root", "files", "sides", "missing")

    def __init__(self, run_id: int, run_dir: str, root: str, missing: bool) -> None:
        self.run_id = run_id
        self.dir = run_dir
        self.root = root
        self.files: dict[str, File] = {}
        self.sides: dict[str, tuple[int, int]] = {}
        self.missing = missing


class Hinted(NamedTuple):
    """What the waiting hints name: known streams, run folders where a new file may have appeared (to be
    scanned, then all of their streams read), and whether a path outside every known run changed."""

    targets: list
    rescan: list
    unknown: bool


class Planner:
    """The known runs and streams, the watcher's hints, and the timed poll's rounds.

    ``rescan_interval`` / ``poll_interval`` rounds make up one cycle of the quiet streams' turns.
    ``watcher`` is the ``daemon.watcher.Watcher`` the service started (None: polling only).
    """

    def __init__(self, poll_interval: float, rescan_interval: float) -> None:
        self.poll_interval = poll_interval
        self.rescan_interval = rescan_interval
        self.runs: dict[str, Run] = {}  # run folder -> run
        self.paths: dict[str, tuple[Run, File]] = {}  # stream path -> (run, file)
        self.watcher = None
        self.wake = threading.Event()  # set by every hint: the serve loop's wait ends
        self.poll_round = 0
        self._dirty: set[str] = set()
        self._dirty_lock = threading.Lock()
        self._losses_seen = 0  # the watcher's lost-events count at the last timed poll

    # ----------------------------------------------------------------- what is known
    def clear(self) -> None:
        """Forget every run and stream (before the index's state is loaded again)."""
        self.runs.clear()
        self.paths.clear()

    def add_run(self, run: Run) -> None:
        """Know ``run``."""
        self.runs[run.dir] = run

    def add_file(self, run: Run, f: File) -> None:
        """Know ``f``, a stream of ``run`` (its ``path`` set)."""
        run.files[f.rel] = f
        self.paths[f.path] = (run, f)

    def streams_of(self, run_dir: str) -> list:
        """The targets of every stream of the run at ``run_dir``."""
        return [self.paths[f.path] for f in self.runs[run_dir].files.values()]

    def everything(self) -> list:
        """The targets of every known stream (``--once``, a cold start)."""
        return list(self.paths.values())

    # ----------------------------------------------------------------- hints
    def mark_dirty(self, paths: set[str]) -> None:
        """The watcher's hints: the paths that changed, one call per read of the inotify queue."""
        with self._dirty_lock:
            self._dirty |= paths
        self.wake.set()

    def take_dirty(self) -> set[str]:
        """The paths hinted since the last call (and no more)."""
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        return dirty

    def pending(self) -> bool:
        """True when hints wait for a pass."""
        with self._dirty_lock:
            return bool(self._dirty)

    def dirty_paths(self) -> frozenset[str]:
        """The paths hinted since the last pass took them (left waiting)."""
        with self._dirty_lock:
            return frozenset(self._dirty)

    def hinted(self, now: Optional[float] = None) -> Hinted:
        """The streams the waiting hints name (remembered as hinted at ``now``, monotonic), the runs where a
        new file may have appeared, and whether a path outside every known run changed."""
        dirty = self.take_dirty()
        if not dirty:
            return Hinted([], [], False)
        now = time.monotonic() if now is None else now
        targets = []
        rescan = set()
        unknown = False
        for path in dirty:
            hit = self.paths.get(path)
            if hit is not None:
                hit[1].hinted = now
                targets.append(hit)
                continue
            if os.path.splitext(path)[1] not in _STREAM_SUFFIXES:
                continue  # logs, temp files, checkpoints: nothing we index
            run_dir = rundir.run_dir_of(path, self.runs)
            if run_dir is not None:
                rescan.add(run_dir)
            else:
                unknown = True
        return Hinted(targets, sorted(rescan), unknown)

    # ----------------------------------------------------------------- the timed poll
    def poll_targets(self, now: Optional[float] = None) -> list:
        """The streams a timed poll re-stats: every one that changed lately, and a share of the quiet ones.

        A stream unchanged for QUIET_AFTER_S is re-stat'ed once per rescan interval, its turn spread over
        the polls in between, so a hundred quiet runs cost a fraction of their stat calls (docs/daemon.md,
        "Live path"). Inotify hints still reach a quiet stream at once. So is a stream inotify named in the
        last HINTED_WITHIN_S: its writer is on this machine, where inotify sees every append (a stream
        written from another node over NFS is never named, and keeps its poll). After lost events the next
        poll looks at every active stream again.
        """
        now = time.monotonic() if now is None else now
        rounds = max(1, int(self.rescan_interval / self.poll_interval))
        self.poll_round = turn = (self.poll_round + 1) % rounds
        trust = False
        if self.watcher is not None:  # hints are trusted while the watcher can say it lost none since last time
            losses = self.watcher.losses
            trust = self.watcher.reports_losses and losses == self._losses_seen
            self._losses_seen = losses
        out = []
        for i, hit in enumerate(self.paths.values()):
            f = hit[1]
            if i % rounds == turn or (now - f.changed < QUIET_AFTER_S
                                      and not (trust and now - f.hinted < HINTED_WITHIN_S)):
                out.append(hit)
        return out

    @staticmethod
    def merge(targets: list, more: list) -> list:
        """``targets`` and those of ``more`` not among them (a stream both hinted and polled is looked at once)."""
        if more:
            seen = {f.path for _, f in targets}
            targets.extend(hit for hit in more if hit[1].path not in seen)
        return targets
