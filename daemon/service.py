"""The ingester: scan the roots, tail the streams, one transaction per batch.

:class:`Ingester` is what ``traceml daemon`` runs in the foreground and what
``traceml watch`` embeds in a background thread when no daemon runs for its
roots (``run_once`` / ``start`` / ``stop``). The pieces it drives:

* :mod:`daemon.lock` — the single writer's ``flock`` (:func:`find_running_daemon`);
* :mod:`traceml_tui.core.rundir` — which folders are runs and which files they hold;
* :mod:`daemon.tailer` — complete lines of a stream, decoded;
* :mod:`daemon.sidefiles` — side-file bytes → typed facts;
* :mod:`daemon.aggregates` — ``rank_live``, the run rollup, the series tables;
* :mod:`daemon.index` — the schema and the writer connection.

``IndexLockedError``, ``DaemonInfo``, ``find_running_daemon``, ``acquire_lock``
and ``lock_path`` are re-exported here for callers of the earlier layout.
"""

from __future__ import annotations

import errno
import gc
import hashlib
import json
import logging
import math
import operator
import os
import resource
import sqlite3
import stat
import threading
import time
import weakref
from collections import OrderedDict
from itertools import compress, repeat
from typing import Callable, Optional

import msgspec

from traceml_tui.core import records, rundir

from . import aggregates, leases, live, locations, refusals, sidefiles, tailer, watcher
from . import index as idx
from .lock import DaemonInfo, IndexLockedError, acquire_lock, find_running_daemon, lock_path, release_lock

__all__ = ["Ingester", "IndexLockedError", "DaemonInfo", "find_running_daemon", "acquire_lock", "lock_path",
           "BATCH_ROWS", "MAX_DEPTH", "IndexWriteError"]

log = logging.getLogger("traceml.daemon")

BATCH_ROWS = 10_000  # rows per transaction (measured in docs/daemon.md, "Cold-ingest path")
SMALL_FOLD_ROWS = 64  # a rank's rows up to this many per read join the pass's one series fold (docs/daemon.md, "Live path")
MAX_DEPTH = 4  # run directories are looked for at most this many levels below a root
SIDE_MAX_BYTES = sidefiles.SIDE_MAX_BYTES
_body_encoder = msgspec.json.Encoder()
_NONES = repeat(None)  # map(operator.is_not, row, _NONES): which values of a row are not NULL
_POSITIONS = range(64)  # column positions of a step row (more than it has)


class IndexWriteError(RuntimeError):
    """The index cannot be written (disk full, I/O error, damaged file): nothing of the batch was committed."""


def _index_failure(exc: BaseException) -> bool:
    """True for an error of the index itself (full disk, I/O, corruption), not of one file's rows."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(
        exc, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.DataError))


NUL_GRACE_S = 120.0  # a line starting with NUL bytes is waited for while its file changed this recently
BACKOFF_MAX_S = 60.0  # the live daemon retries a failing index at most this far apart
FIGURES_EVERY_S = 2.0  # the live daemon recomputes a rank's rolling figures at most this often …
FIGURES_NEW_STEPS = live.WINDOW // 2  # … and then once half of its window is new steps …
FIGURES_MAX_S = 10.0  # … or this long after the last time, whichever comes first
WORKER_MIN_BYTES = 64 << 20  # a backlog this large is decoded by a second process while the writer writes
AHEAD_MIN_BYTES = 256 << 10  # blocks smaller than this are decoded by the writer itself
PROGRESS_MIN_BYTES = 16 << 20  # a backlog this large (≈50k records) is reported while it is read
FD_CACHE_MAX = 8192  # open stream descriptors kept between passes (bounded by the open-file limit too)
MIN_PASS_GAP_S = 0.05  # hint-driven passes start at least this far apart: events of a burst share one pass
PASS_PACE = 2.0  # ... and this many times the last pass's duration apart (a burst's events share a pass) …
PASS_GAP_PER_STREAM_S = 0.001  # … and this much per stream the last pass read, from its start (see _next_hint) …
MAX_PASS_GAP_S = 0.5  # … but never more than this: under a heavy load the lag stays bounded
LIVE_CHECKPOINT_PAGES = 8000  # the live daemon's WAL checkpoints (~32 MiB) apart (docs/daemon.md, "Live path")
QUIET_AFTER_S = 60.0  # a stream unchanged this long is re-stat'ed once per rescan, spread over the polls
HINTED_WITHIN_S = 60.0  # … as is one that inotify named this recently (its appends are seen by inotify)


def _next_hint(start: float, done: float, streams: int) -> float:
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


class _FdCache:
    """Open descriptors of active streams, least recently used first (docs/daemon.md, "Live path").

    An entry is the descriptor opened through ``rundir.open_under`` with the
    device and inode it was opened on. :meth:`get` returns it only while the
    path still names that file (the caller's ``stat`` of the path): a file
    replaced, rotated or deleted is closed here, never read again.
    """

    def __init__(self, cap: int) -> None:
        self.cap = max(16, cap)
        self._d: OrderedDict[str, tuple[int, int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, path: str) -> bool:
        return path in self._d

    def get(self, path: str, dev: int, ino: int) -> Optional[int]:
        """The cached descriptor of ``path`` when it is still (``dev``, ``ino``); a stale one is closed."""
        entry = self._d.get(path)
        if entry is None:
            return None
        if entry[1] != dev or entry[2] != ino:
            self.drop(path)
            return None
        self._d.move_to_end(path)
        return entry[0]

    def put(self, path: str, fd: int, dev: int, ino: int) -> None:
        """Keep ``fd`` for ``path`` (closing the least recently used beyond the cap)."""
        self.drop(path)
        self._d[path] = (fd, dev, ino)
        while len(self._d) > self.cap:
            _, (old, _, _) = self._d.popitem(last=False)
            os.close(old)

    def drop(self, path: str) -> None:
        """Close and forget the descriptor of ``path`` (if any)."""
        entry = self._d.pop(path, None)
        if entry is not None:
            os.close(entry[0])

    def paths(self) -> list[str]:
        """Paths with a cached descriptor."""
        return list(self._d)

    def clear(self) -> None:
        """Close every descriptor."""
        while self._d:
            _, (fd, _, _) = self._d.popitem()
            os.close(fd)


class _Progress:
    """A large backlog being read: what a first launch shows (``traceml daemon``'s line, ``watch``'s header).

    Records still to read are estimated from bytes: the bytes left at the mean size of the records read
    so far.
    """

    def __init__(self, files_total: int, bytes_total: int, base: int) -> None:
        self.files_total = files_total
        self.files_done = 0
        self.bytes_total = bytes_total
        self.bytes_done = 0
        self.base = base  # records_ingested when it started
        self.started = time.monotonic()
        self.finished = False

    def snapshot(self, records_now: int) -> dict:
        """``files_done``, ``files_total``, ``records_done``, ``records_total`` (estimate), ``records_per_s``,
        ``eta_s``, ``updated`` (wall clock), ``done``."""
        done = records_now - self.base
        elapsed = max(1e-6, time.monotonic() - self.started)
        total = eta = None
        if self.finished:
            total, eta = done, 0.0
        elif self.bytes_done > 0 and done > 0:
            total = done + round(max(0, self.bytes_total - self.bytes_done) * done / self.bytes_done)
            eta = (total - done) / (done / elapsed)
        return {"files_done": min(self.files_done, self.files_total), "files_total": self.files_total,
                "records_done": done, "records_total": total, "records_per_s": done / elapsed, "eta_s": eta,
                "updated": time.time(), "done": self.finished}


def _core_free() -> bool:
    """True when this machine has a core to spare: two or more, and the load leaves one idle."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return cores >= 2 and load <= cores - 1


def _fd_budget() -> int:
    """How many stream descriptors to keep: the open-file limit raised to its hard cap, half of it, ≤ FD_CACHE_MAX."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = FD_CACHE_MAX * 2 + 256
        if hard == resource.RLIM_INFINITY or hard > soft:
            target = want if hard == resource.RLIM_INFINITY else min(hard, want)
            if target > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
    except (ValueError, OSError):
        return 256
    return max(16, min(FD_CACHE_MAX, soft // 2 - 64))


class _File:
    """In-memory mirror of one ``files`` row (updated only after its commit)."""

    __slots__ = ("file_id", "run_id", "rel", "path", "stream", "rank", "attempt", "node", "identity",
                 "generation", "offset", "skipping", "tail", "size", "mtime_ns", "ino", "gone", "changed", "hinted")

    def __init__(self, **kw) -> None:
        for k in self.__slots__:
            setattr(self, k, kw.get(k))
        self.gone = False
        self.changed = time.monotonic()  # last seen changing (monotonic): a known stream starts as active
        self.hinted = -math.inf  # last named by an inotify hint (monotonic)


class _Run:
    __slots__ = ("run_id", "dir", "root", "files", "sides", "missing")

    def __init__(self, run_id: int, run_dir: str, root: str, missing: bool) -> None:
        self.run_id = run_id
        self.dir = run_dir
        self.root = root
        self.files: dict[str, _File] = {}
        self.sides: dict[str, tuple[int, int]] = {}
        self.missing = missing


class _Batch:
    """What one open transaction has touched; applied to memory after COMMIT."""

    def __init__(self) -> None:
        self.rows = 0
        self.records = 0  # step rows inserted; counted in records_ingested only once committed
        self.file_updates: dict[_File, dict] = {}
        self.ranks: set[tuple[int, int, int]] = set()
        self.runs: set[int] = set()
        self.rebuild: set[tuple[int, int, int]] = set()  # ranks whose rows a new generation re-supplied
        self.series: list[tuple[int, int, list, dict]] = []  # small folds, written together at commit


class Ingester:
    """Tails every run under ``roots`` into the SQLite index at ``index_path``.

    ``poll_interval`` is how often known files are re-stat'ed (primary
    mechanism); ``use_inotify`` adds inotify hints that make changes visible
    sooner; ``rescan_interval`` is how often the roots are walked for new runs
    and files and side files are re-stat'ed.
    """

    def __init__(self, index_path: str | os.PathLike[str], roots: list[str], poll_interval: float = 1.0,
                 use_inotify: bool = True, rescan_interval: Optional[float] = None, max_depth: int = MAX_DEPTH,
                 mounts_path: Optional[str] = None, mode: str = "daemon",
                 clock: Callable[[], float] = time.time) -> None:
        self.index_path = str(index_path)
        self.roots = [os.path.realpath(r) for r in roots]
        self.poll_interval = max(0.01, float(poll_interval))
        self.rescan_interval = float(rescan_interval) if rescan_interval else max(5.0, 2 * self.poll_interval)
        self.use_inotify = use_inotify
        self.max_depth = max_depth
        self.mounts_path = mounts_path
        self.mode = mode
        self.clock = clock  # when a batch was stored ("last seen"); injectable so that tests are deterministic
        self.conn = None
        self._lock_fd: Optional[int] = None
        self._lock_release: Optional[weakref.finalize] = None
        self._runs: dict[str, _Run] = {}
        self._paths: dict[str, tuple[_Run, _File]] = {}
        self._agg: Optional[aggregates.Aggregates] = None
        self._dirty: set[str] = set()
        self._dirty_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._watcher: Optional[watcher.Watcher] = None
        self._batch: Optional[_Batch] = None
        self._quarantine: set[str] = set()
        self.refused = refusals.Refused()  # files refused now: one error row each (docs/daemon.md, "Damaged input")
        self._held_back = False  # the last block stopped at a line of NUL bytes
        self._nul_fresh = True  # the file being read changed within NUL_GRACE_S
        self.records_ingested = 0
        self._fds = _FdCache(256)  # resized at open() once the open-file limit is known
        self._heads: dict[str, tuple[bytes, str]] = {}  # path -> its header line as last read, and its identity
        self._deferred: list[tuple] = []  # (run, file, cur, bytes, offset): small appends decoded together
        self._deferred_bytes = 0
        self._progress: Optional[_Progress] = None
        self._worker = None  # a decode process while a large backlog is read (concurrent.futures)
        self._ahead: dict[int, tuple] = {}  # file_id -> (offset, block, future) handed to the worker
        #: Called after each commit while a large backlog is read, with :meth:`progress`'s dict (last: done).
        self.on_progress: Optional[Callable[[dict], None]] = None
        self._poll_round = 0
        self._losses_seen = 0  # the watcher's lost-events count at the last timed poll (see _poll_targets)
        self._pass_streams = 0  # streams read since the serve loop's pass began (sets the next gap)
        self._leases = leases.LeaseTracker(lambda: self.clock())  # node launchers' heartbeats (daemon/leases.py)

    # ----------------------------------------------------------------- lifecycle
    def open(self) -> None:
        """Refuse network filesystems, take the writer lock, open the index and load file state."""
        if self.conn is not None:
            return
        locations.check_local(self.index_path, self.mounts_path)
        self._lock_fd = acquire_lock(self.index_path, self.roots, self.mode)
        # An ingester dropped without close() must not keep the index locked for the rest of the process
        # (the lock named by the index file's inode would then also refuse a later index reusing that inode).
        self._lock_release = weakref.finalize(self, release_lock, self._lock_fd)
        self._fds.cap = _fd_budget()
        try:
            self.conn = idx.connect_writer(self.index_path)
            self._agg = aggregates.Aggregates(self.conn)
            self._load_state()
            if idx.needs_rederive(self.conn):
                try:
                    self._rederive()
                except Exception as exc:  # the new columns stay NULL until the next open; ingest goes on
                    log.error("traceml daemon: deriving the columns of the upgraded index failed: %s", exc)
                    self._rollback()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release everything (the lock last, so no second writer overlaps)."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        self._stop_worker()
        self._fds.clear()
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None
            self._agg = None
        if self._lock_fd is not None:
            self._lock_release()  # release_lock, once
            self._lock_fd = None

    def run_once(self) -> int:
        """Ingest everything present now and return how many records were added."""
        self.open()
        before = self.records_ingested
        for _ in range(1 + len(self._paths) + 1):  # each failure sets one file aside, so this ends
            try:
                self._scan()
                while self._poll(list(self._paths.values())):
                    pass
                self._commit()
                break
            except Exception as exc:
                self._rollback()
                if _index_failure(exc):  # retrying cannot help; what was committed stays counted
                    raise IndexWriteError(f"cannot write the index {self.index_path}: {exc}") from None
                log.error("traceml daemon: ingest pass failed: %s", exc)
        return self.records_ingested - before

    def request_stop(self) -> None:
        """Ask :meth:`serve` to return after the current batch (safe from a signal handler)."""
        self._stop.set()
        self._wake.set()

    def serve(self) -> None:
        """The loop: rescan every ``rescan_interval``, re-stat every ``poll_interval``, react to hints."""
        self.open()
        stop = self._stop
        if self.use_inotify:
            self._watcher = watcher.Watcher(self.roots, self._mark_dirty)
            if not self._watcher.start():
                log.warning("traceml daemon: inotify unavailable; polling only")
                self._watcher = None
        self.live_settings()
        next_scan = next_poll = next_hint = 0.0
        backoff = 0.0
        while not stop.is_set():
            now = time.monotonic()
            self._pass_streams = 0
            # With hints, a timed poll due between two hint-driven passes waits for the next one and is that
            # pass (it reads the hinted streams too, _timed_pass): one commit where there would be two.
            poll_at = max(next_poll, next_hint) if self._watcher is not None else next_poll
            try:
                if now >= next_scan:
                    self._scan()
                    next_scan = now + self.rescan_interval
                if now >= poll_at:
                    if self._timed_pass():
                        next_scan = 0.0
                    next_poll = now + self.poll_interval
                elif now >= next_hint:
                    if self._poll_dirty():
                        next_scan = 0.0  # something new appeared under a root: look for it now
                self._commit_pass()
                backoff = 0.0
            except Exception as exc:  # keep serving other files; a broken batch is retried from the index
                self._rollback()
                # A full disk or a failing index (nothing was committed), or anything else (damaged input is
                # refused file by file before this): wait, doubling up to a minute, rather than retry every
                # poll, and say so once per wait — never a busy loop of log lines (docs/daemon.md).
                backoff = min(BACKOFF_MAX_S, max(1.0, backoff * 2))
                what = f"cannot write the index {self.index_path}" if _index_failure(exc) else "ingest cycle failed"
                log.error("traceml daemon: %s: %s; retrying in %.0f s", what, exc, backoff)
                stop.wait(backoff)
                next_scan = next_poll = 0.0
                continue
            # Hints arriving while a pass runs, or soon after it, wait for the next pass: every file they
            # name is read once there, in larger batches the busier the daemon is.
            done = time.monotonic()
            next_hint = _next_hint(now, done, self._pass_streams)
            poll_at = max(next_poll, next_hint) if self._watcher is not None else next_poll
            deadline = min(poll_at, next_scan, self._agg.next_stale_due())
            with self._dirty_lock:
                pending = bool(self._dirty)
            if pending:
                deadline = min(deadline, next_hint)
            timeout = deadline - time.monotonic()
            if timeout > 0:
                self._wake.wait(timeout)
                self._wake.clear()
                gap = min(next_hint, poll_at, next_scan) - time.monotonic()
                if gap > 0 and not stop.is_set():
                    stop.wait(gap)  # a hint came early: let the burst gather for one pass
            else:
                self._wake.clear()
        if self._agg.stale:  # ranks whose figures were left for later get them now: nothing may write them again
            try:
                batch = self._begin()
                batch.ranks.update(self._agg.write_stale())
                self._commit()
            except Exception as exc:
                self._rollback()
                log.error("traceml daemon: writing the last rolling figures at stop failed: %s", exc)

    def live_settings(self) -> None:
        """What :meth:`serve` changes for a long-lived ingester (docs/daemon.md, "Live path"); the benchmark
        of a live pass applies it too."""
        # A live rank's last pages of `steps` and the series are rewritten pass after pass: checkpoints further
        # apart copy each of them back once for several passes, not once per pass.
        self.conn.execute(f"PRAGMA wal_autocheckpoint={LIVE_CHECKPOINT_PAGES}")
        # A live rank's medians and rates: at most every 2 s, and at least every 10 s while it writes.
        self._agg.figures_every = FIGURES_EVERY_S
        self._agg.figures_new_steps = FIGURES_NEW_STEPS
        self._agg.figures_max_s = FIGURES_MAX_S

    def start(self) -> None:
        """Serve in a background thread (the TUI's embedded mode)."""
        self.open()
        self._stop.clear()
        self._thread = threading.Thread(target=self.serve, name="traceml-ingester", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the background loop (or ``serve`` on the default event) and close."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.close()

    # ----------------------------------------------------------------- state
    def _load_state(self) -> None:
        self._runs.clear()
        self._paths.clear()
        self._agg.reset()
        for run_id, run_dir, root, missing in self.conn.execute("SELECT run_id, dir, root, missing FROM runs"):
            self._runs[run_dir] = _Run(run_id, run_dir, root, bool(missing))
        by_id = {r.run_id: r for r in self._runs.values()}
        cols = ("file_id", "run_id", "rel", "stream", "rank", "attempt", "node", "identity", "generation", "offset",
                "skipping", "tail", "size", "mtime_ns", "ino")
        for row in self.conn.execute(
            "SELECT file_id, run_id, path, stream, rank, attempt, node, identity, generation, offset, skipping, tail,"
            " size, mtime_ns, ino FROM files"
        ):
            f = _File(**dict(zip(cols, row)))
            run = by_id.get(f.run_id)
            if run is None:
                continue
            f.path = os.path.join(run.dir, f.rel)
            run.files[f.rel] = f
            self._paths[f.path] = (run, f)
        for run_id, rel, size, mtime_ns in self.conn.execute("SELECT run_id, path, size, mtime_ns FROM side_files"):
            run = by_id.get(run_id)
            if run is not None:
                run.sides[rel] = (size, mtime_ns)
        self.refused.load(self.conn, {r.run_id: r.dir for r in self._runs.values()})

    def _mark_dirty(self, paths: set[str]) -> None:
        """The watcher's hints: the paths that changed, one call per read of the inotify queue."""
        with self._dirty_lock:
            self._dirty |= paths
        self._wake.set()

    def _take_dirty(self) -> set[str]:
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        return dirty

    def _timed_pass(self) -> bool:
        """A timed poll: the hinted streams, then every stream changed lately and this round's share of the quiet
        ones (:meth:`_poll_targets`); True when a path outside every known run changed.

        The hints are read here, not dropped: a stream quiet for minutes (a rank in a long evaluation) is not
        among the recent ones, and its hint may be the only news of its append until its turn comes round.
        A stream both hinted and recent is looked at once.
        """
        hinted, unknown = self._hinted()
        targets = self._poll_targets()
        if hinted:
            polled = {f.path for _, f in targets}
            targets.extend(hit for hit in hinted if hit[1].path not in polled)
        self._poll(targets)
        return unknown

    def _poll_dirty(self) -> bool:
        """Handle inotify hints; True when a path outside every known run changed."""
        targets, unknown = self._hinted()
        if targets:
            self._poll(targets)
        return unknown

    def _hinted(self) -> tuple[list[tuple[_Run, _File]], bool]:
        """The streams the waiting hints name (a run's every stream when a new file appeared in it), and
        whether a path outside every known run changed."""
        dirty = self._take_dirty()
        if not dirty:
            return [], False
        targets = []
        rescan_runs = set()
        unknown = False
        now = time.monotonic()
        for path in dirty:
            hit = self._paths.get(path)
            if hit is not None:
                hit[1].hinted = now
                targets.append(hit)
                continue
            suffix = os.path.splitext(path)[1]
            if suffix not in ("", ".json", ".jsonl"):
                continue  # logs, temp files, checkpoints: nothing we index
            run_dir = rundir.run_dir_of(path, self._runs)
            if run_dir is not None:
                rescan_runs.add(run_dir)
            else:
                unknown = True
        for run_dir in rescan_runs:
            self._scan_run(self._runs[run_dir])
            targets.extend(self._paths[f.path] for f in self._runs[run_dir].files.values())
        return targets, unknown

    # ----------------------------------------------------------------- transactions
    def _commit_pass(self) -> None:
        """End a live pass: commit what it read, and the rolling figures of quiet ranks that fell due since
        (their last figures were left for later, docs/daemon.md "Live path"), even when it read nothing."""
        if self._agg.stale and self._agg.due_stale():
            self._begin()  # _commit writes the due ones with the batch
        self._commit()

    def _begin(self) -> _Batch:
        if self._batch is None:
            self.conn.execute("BEGIN IMMEDIATE")
            self._batch = _Batch()
        return self._batch

    def _commit(self) -> None:
        self._flush_deferred()
        batch = self._batch
        if batch is None:
            return
        now = self.clock()
        # Pending folds first: a rank rebuilt below refolds its series from the stored rows (these included).
        self._agg.write_series_many(batch.series)
        for key in batch.rebuild:  # re-supplied rows: recount from the rows that remain, never fold twice
            self._agg.rebuild_rank(key)
            batch.ranks.add(key)
        for run_id, rank in {(k[0], k[1]) for k in batch.rebuild}:
            self._agg.rebuild_series(run_id, rank)
        if self._agg.stale:  # ranks that went quiet with figures older than their last rows
            batch.ranks.update(self._agg.due_stale())
        self._agg.write_rank_live_many(batch.ranks, now)
        batch.runs.update(key[0] for key in batch.ranks)
        if batch.file_updates:  # every file's new offset, in the transaction that holds its rows (rule 2)
            self.conn.executemany(
                "UPDATE files SET identity=?, generation=?, offset=?, skipping=?, tail=?, size=?, mtime_ns=?, ino=?,"
                " missing=0 WHERE file_id=?",
                [(c["identity"], c["generation"], c["offset"], c["skipping"], c["tail"], c["size"], c["mtime_ns"],
                  c["ino"], f.file_id) for f, c in batch.file_updates.items()])
        version = idx.bump_version(self.conn)
        for run_id in batch.runs:
            self._agg.write_run_rollup(run_id, version, now)
        progress = self.progress()
        if progress is not None:  # committed with the rows it counts
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('ingest_progress', ?)", (json.dumps(progress),))
        self.conn.execute("COMMIT")
        self._batch = None
        self.records_ingested += batch.records
        for f, changes in batch.file_updates.items():
            for k, v in changes.items():
                setattr(f, k, v)
        if progress is not None:
            if progress["done"]:
                self._progress = None
            if self.on_progress is not None:
                self.on_progress(progress)

    def _rollback(self) -> None:
        if self._batch is not None:
            try:
                self.conn.execute("ROLLBACK")
            except Exception:
                pass
            self._batch = None
        # Memory may be ahead of the index now: reload what was committed, and re-open every stream.
        self._deferred.clear()
        self._deferred_bytes = 0
        self._fds.clear()
        self._heads.clear()
        self._stop_worker()
        self._progress = None  # counted from memory: the next pass measures the backlog again
        self._load_state()

    # ----------------------------------------------------------------- scanning
    def _scan(self) -> None:
        seen = set()
        for root in self.roots:
            for run_dir in rundir.discover_runs(root, self.max_depth):
                seen.add(run_dir)
                if refusals.run_dir_refused(self.refused, run_dir):
                    continue
                run = self._runs.get(run_dir)
                if run is None:
                    batch = self._begin()
                    run_id = idx.ensure_run(self.conn, run_dir, root, _folder_name(run_dir))
                    run = _Run(run_id, run_dir, root, False)
                    self._runs[run_dir] = run
                    batch.runs.add(run_id)
                elif run.missing:
                    batch = self._begin()
                    self.conn.execute("UPDATE runs SET missing = 0 WHERE run_id = ?", (run.run_id,))
                    run.missing = False
                    batch.runs.add(run.run_id)
                self._scan_run(run)
        for run in self._runs.values():
            if run.dir in seen or run.missing:
                continue
            if not any(run.dir == r or run.dir.startswith(r.rstrip("/") + "/") for r in self.roots):
                continue  # another root set's run: not ours to judge
            if not os.path.isdir(run.dir) or os.path.islink(run.dir):
                batch = self._begin()
                self.conn.execute("UPDATE runs SET missing = 1 WHERE run_id = ?", (run.run_id,))
                run.missing = True
                batch.runs.add(run.run_id)

    def _scan_run(self, run: _Run) -> None:
        streams, sides, refused = rundir.RunDir(run.dir).scan()
        if refusals.new_names(self.refused, run.dir, refused):  # a name beyond 64 bits: an error row, no failure
            self._begin().runs.add(run.run_id)
            refusals.name_errors(self.conn, run.run_id, refused)
        for s in streams:
            if s.rel in run.files:
                continue
            self._begin()
            # Two statements rather than UPSERT … RETURNING: works with SQLite older than 3.35.
            self.conn.execute(
                "INSERT OR IGNORE INTO files (run_id, path, stream, rank, attempt, node) VALUES (?, ?, ?, ?, ?, ?)",
                (run.run_id, s.rel, s.stream, s.rank, s.attempt, s.node),
            )
            file_id, identity, generation, offset, skipping, tail = self.conn.execute(
                "SELECT file_id, identity, generation, offset, skipping, tail FROM files WHERE run_id = ? AND path = ?",
                (run.run_id, s.rel)).fetchone()
            f = _File(file_id=file_id, run_id=run.run_id, rel=s.rel, path=os.path.join(run.dir, s.rel),
                      stream=s.stream, rank=s.rank, attempt=s.attempt, node=s.node, identity=identity,
                      generation=generation, offset=offset, skipping=skipping, tail=tail)
            run.files[s.rel] = f
            self._paths[f.path] = (run, f)
        present = set()
        lease_sides = [side for side in sides if side.kind == leases.KIND]
        for side in sides:
            if side.kind == leases.KIND:
                continue  # read at every scan by the lease tracker, below
            present.add(side.rel)
            if run.sides.get(side.rel) != (side.size, side.mtime_ns):
                self._begin()
                try:
                    with refusals.savepoint(self.conn):  # one file's failure undoes its own rows only
                        self._ingest_side(run, side)
                except Exception as exc:
                    if _index_failure(exc):
                        raise
                    self.refused.side(os.path.join(run.dir, side.rel), refusals.side_failed(
                        self.conn, run.run_id, side.rel, side.kind, side.key, side.size, side.mtime_ns, exc))
                    run.sides[side.rel] = (side.size, side.mtime_ns)  # not read again until it changes
        if lease_sides and self._leases.observe(
                self.conn, self._begin, run.run_id, run.root, run.dir, lease_sides,
                lambda side, message: refusals.side_error(self.conn, run.run_id, side.rel, side.mtime_ns, side.size, message)):
            self._begin().runs.add(run.run_id)
        for rel in [r for r in run.sides if r not in present]:
            if os.path.isdir(run.dir):  # a removed run keeps its side files (rule 7)
                batch = self._begin()
                row = self.conn.execute("SELECT kind FROM side_files WHERE run_id = ? AND path = ?",
                                        (run.run_id, rel)).fetchone()
                self.conn.execute("DELETE FROM side_files WHERE run_id = ? AND path = ?", (run.run_id, rel))
                del run.sides[rel]
                self.refused.side(os.path.join(run.dir, rel), None)  # gone: no longer refused
                batch.runs.add(run.run_id)
                if row is not None:
                    self._apply_side_facts(run, row[0], None)  # its facts go with it

    # ----------------------------------------------------------------- side files
    def _ingest_side(self, run: _Run, side: rundir.SideFile) -> None:
        """Read one side file (regular files only), store it, its error and its facts."""
        path = os.path.join(run.dir, side.rel)
        try:
            fd = rundir.open_under(run.root, path)  # no link anywhere below the root (docs/security.md)
        except OSError as exc:
            self._unreadable(run, side.rel, path, exc)
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            if st.st_size > SIDE_MAX_BYTES:
                read = sidefiles.too_large(side.rel, st.st_size)
            else:
                data = b""
                while len(data) < st.st_size:
                    chunk = os.pread(fd, st.st_size - len(data), len(data))
                    if not chunk:
                        break
                    data += chunk
                read = sidefiles.parse(side.kind, side.rel, side.key, data)
        finally:
            os.close(fd)
        batch = self._begin()
        self.conn.execute(
            "INSERT OR REPLACE INTO side_files VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run.run_id, side.rel, side.kind, read.key, st.st_size, st.st_mtime_ns, read.content, read.error),
        )
        if read.error is not None:
            refusals.side_error(self.conn, run.run_id, side.rel, st.st_mtime_ns, st.st_size, read.error)
        self.refused.side(path, read.error)
        batch.runs.add(run.run_id)
        run.sides[side.rel] = (st.st_size, st.st_mtime_ns)
        self._apply_side_facts(run, side.kind, read.facts)

    def _unreadable(self, run: _Run, rel: str, path: str, exc: OSError) -> None:
        """A file we may not read is one error row naming it (per version), never a silent skip."""
        if exc.errno in (errno.EACCES, errno.EPERM):  # else gone, or a link refused on the way: nothing to say
            batch = self._begin()
            if refusals.unreadable_error(self.conn, run.run_id, rel, path, exc):
                batch.runs.add(run.run_id)

    def _apply_side_facts(self, run: _Run, kind: str, facts: sidefiles.Facts) -> None:
        """Copy a side file's facts (None: unreadable or removed) into the runs row."""
        if kind == "manifest":
            aggregates.write_manifest_facts(self.conn, run.run_id, facts, _folder_name(run.dir))
        elif kind == "summary":
            aggregates.write_summary_facts(self.conn, run.run_id, facts)
        elif kind == "outcome":
            aggregates.write_outcome_rollup(self.conn, run.run_id)

    def _rederive(self) -> None:
        """Fill the columns an upgrade added from what the index holds (one transaction; see index.upgrade)."""
        batch = self._begin()
        conn = self.conn
        conn.execute(
            "UPDATE rank_live SET end_ts = (SELECT e.ts FROM events e WHERE e.run_id = rank_live.run_id"
            " AND e.kind = 'rank_end' AND e.rank = rank_live.rank AND e.attempt = rank_live.attempt"
            " ORDER BY e.generation DESC, e.offset DESC LIMIT 1) WHERE ended IS NOT NULL AND end_ts IS NULL")
        for run_id, rank, attempt, header in conn.execute(
                "SELECT run_id, rank, attempt, header FROM files WHERE stream = 'steps' AND header IS NOT NULL"
                " ORDER BY file_id").fetchall():
            node = aggregates.header_node(header)
            if node is not None:
                conn.execute("UPDATE rank_live SET node = ? WHERE run_id = ? AND rank = ? AND attempt = ?"
                             " AND node IS NULL", (node, run_id, rank, attempt))
        by_id = {r.run_id: r for r in self._runs.values()}
        for run_id, rel, kind, key, size, mtime_ns, content in conn.execute(
                "SELECT run_id, path, kind, key, size, mtime_ns, content FROM side_files"
                " WHERE kind IN ('manifest', 'summary', 'outcome') ORDER BY run_id, path").fetchall():
            run = by_id.get(run_id)
            if run is None:
                continue
            read = (sidefiles.parse(kind, rel, key, content.encode("utf-8")) if content is not None
                    else sidefiles.SideRead(None, None, key))
            if read.error is not None:
                conn.execute("UPDATE side_files SET error = ? WHERE run_id = ? AND path = ?", (read.error, run_id, rel))
                refusals.side_error(conn, run_id, rel, mtime_ns, size, read.error)
            self._apply_side_facts(run, kind, read.facts)
        # The step time is gap + traced step (core.steptime): rank figures and the step series of an index
        # written before they meant that are recomputed from the stored step rows.
        for key in conn.execute("SELECT run_id, rank, attempt FROM rank_live").fetchall():
            self._agg.refresh_step_figures(tuple(key))
        for run_id, rank in conn.execute("SELECT run_id, rank FROM series_width").fetchall():
            self._agg.rebuild_step_series(run_id, rank)
        batch.runs.update(by_id)
        idx.rederive_done(conn)
        self._commit()

    # ----------------------------------------------------------------- streams
    def _poll(self, targets: list[tuple[_Run, _File]]) -> bool:
        """Ingest new complete lines of ``targets``; True when anything moved (more may follow).

        Each target is read once per call, into the one open transaction (committed by the caller, or
        here when it reaches BATCH_ROWS): a pass over many files that each grew by a line is one commit.
        """
        progressed = False
        now = time.monotonic()
        fds = self._fds
        due = []
        for run, f in targets:
            if f.path in self._quarantine or (run.missing and not os.path.isdir(run.dir)):
                continue
            try:
                st = os.stat(f.path, follow_symlinks=False)
            except OSError:
                fds.drop(f.path)  # deleted: its descriptor (and the file's space) is let go in this pass
                continue  # vanished: the rescan marks the run missing when the whole folder went
            if not stat.S_ISREG(st.st_mode):
                fds.drop(f.path)
                continue
            pending = self._batch.file_updates.get(f, {}) if self._batch else {}
            size_seen = pending.get("size", f.size)
            if (st.st_size, st.st_mtime_ns, st.st_ino) == (size_seen, pending.get("mtime_ns", f.mtime_ns),
                                                           pending.get("ino", f.ino)):
                continue
            due.append((run, f, st))
        if len(due) > 1 and self._progress is None:
            due = self._backlog(due)
        pipelined = (self._progress is not None and not self._progress.finished
                     and self._progress.bytes_total >= WORKER_MIN_BYTES)
        if pipelined:
            self._start_worker()
        self._pass_streams += len(due)
        for i, (run, f, st) in enumerate(due):
            f.changed = now
            if pipelined and i + 1 < len(due):
                nrun, nf, _ = due[i + 1]
                pend = self._batch.file_updates.get(nf) if self._batch else None
                if self._fds.get(nf.path, due[i + 1][2].st_dev, due[i + 1][2].st_ino) is None:
                    try:  # opened here, checked as usual when its turn comes
                        fd = rundir.open_under(nrun.root, nf.path)
                        fst = os.fstat(fd)
                        if stat.S_ISREG(fst.st_mode):
                            self._fds.put(nf.path, fd, fst.st_dev, fst.st_ino)
                        else:
                            os.close(fd)
                    except OSError:
                        pass
                self._read_ahead(nrun, nf, (pend or {}).get("offset", nf.offset) or 0 if nf.identity is not None
                                 else 0)
            while True:
                try:
                    more = self._ingest_file(run, f, st)
                except OSError as exc:
                    log.warning("traceml daemon: cannot read %s: %s", f.path, exc)
                    fds.drop(f.path)
                    more = False
                except Exception as exc:
                    fds.drop(f.path)
                    if _index_failure(exc):
                        raise  # the index, not this file: nothing to set aside
                    # An unexpected bug on one file must not stall the others: set it aside until restart.
                    log.error("traceml daemon: skipping %s until restart: %s", f.path, exc)
                    self._quarantine.add(f.path)
                    self.refused.streams[f.path] = str(exc)
                    raise
                progressed = progressed or more
                if self._batch is not None and self._batch.rows >= BATCH_ROWS:
                    self._commit()
                if not more or self._stop.is_set():
                    break
            if self._progress is not None:
                self._progress.files_done += 1
            if self._stop.is_set():
                break
        if self._progress is not None and not self._progress.finished and not self._stop.is_set():
            self._progress.finished = True  # the backlog's last figures go with the pass's commit
            self._begin()
        if pipelined:
            self._stop_worker()
        self._flush_deferred()
        return progressed

    def _backlog(self, due: list) -> list:
        """Start reporting progress when ``due`` holds a large backlog, and order it newest run first.

        A first launch over a team's log root reads for a minute or more: the runs changed most recently
        are read first (each batch commits, so they show up run by run) and the ingester records its
        progress in the index (``meta.ingest_progress``) and through ``on_progress``.
        """
        total = 0
        for _, f, st in due:
            total += max(0, st.st_size - (f.offset or 0 if f.identity is not None else 0))
        if total < PROGRESS_MIN_BYTES:
            return due
        newest: dict[int, float] = {}
        for run, _, st in due:
            newest[run.run_id] = max(newest.get(run.run_id, 0.0), st.st_mtime)
        due.sort(key=lambda d: (-newest[d[0].run_id], d[0].dir, d[1].rel))
        self._progress = _Progress(files_total=len(due), bytes_total=total, base=self.records_ingested)
        return due

    def progress(self) -> Optional[dict]:
        """The backlog being read now (see :class:`_Progress`), or None when there is none."""
        p = self._progress
        if p is None:
            return None
        pending = self._batch.records if self._batch is not None else 0
        return p.snapshot(self.records_ingested + pending)

    def _poll_targets(self) -> list[tuple[_Run, _File]]:
        """The streams a timed poll re-stats: every one that changed lately, and a share of the quiet ones.

        A stream unchanged for QUIET_AFTER_S is re-stat'ed once per rescan interval, its turn spread over
        the polls in between, so a hundred quiet runs cost a fraction of their stat calls (docs/daemon.md,
        "Live path"). Inotify hints still reach a quiet stream at once. So is a stream inotify named in the
        last HINTED_WITHIN_S: its writer is on this machine, where inotify sees every append (a stream
        written from another node over NFS is never named, and keeps its poll). After lost events the next
        poll looks at every active stream again.
        """
        now = time.monotonic()
        rounds = max(1, int(self.rescan_interval / self.poll_interval))
        self._poll_round = turn = (self._poll_round + 1) % rounds
        trust = False
        if self._watcher is not None:  # hints are trusted while the watcher can say it lost none since last time
            losses = self._watcher.losses
            trust = self._watcher.reports_losses and losses == self._losses_seen
            self._losses_seen = losses
        out = []
        for i, hit in enumerate(self._paths.values()):
            f = hit[1]
            if i % rounds == turn or (now - f.changed < QUIET_AFTER_S
                                      and not (trust and now - f.hinted < HINTED_WITHIN_S)):
                out.append(hit)
        return out

    def _ingest_file(self, run: _Run, f: _File, st: os.stat_result) -> bool:
        """Read one file from its committed offset; True when more data may remain.

        ``st`` is the path's ``stat`` of this pass. The file's descriptor is kept open between passes
        (:class:`_FdCache`) while the path names the same device and inode: a read is then three ``pread``
        calls (the head, the committed tail, the new bytes) and no ``open``.
        """
        fd = self._fds.get(f.path, st.st_dev, st.st_ino)
        fresh = fd is None
        if fresh:
            try:
                fd = rundir.open_under(run.root, f.path)  # a folder swapped for a link is never followed
            except OSError as exc:
                self._unreadable(run, f.rel, f.path, exc)
                return False
            try:
                fst = os.fstat(fd)
            except OSError:
                os.close(fd)
                raise
            if not stat.S_ISREG(fst.st_mode):
                os.close(fd)
                return False  # a FIFO or device swapped in: never read it
            self._fds.put(f.path, fd, fst.st_dev, fst.st_ino)
        else:
            fst = st  # the path still names the file this descriptor holds
        batch_state = self._batch.file_updates.get(f) if self._batch else None
        state = dict(batch_state or {})
        cur = {k: state.get(k, getattr(f, k)) for k in ("identity", "generation", "offset", "skipping", "tail")}
        old_ino = state.get("ino", f.ino)
        # The first line is re-read on every read: a file truncated and rewritten in place with a new header
        # of the same length can look like an append to stat and to the tail check. While it holds the very
        # bytes of the header last read here, its identity (their hash) is the one computed then.
        known = self._heads.get(f.path)
        if known is not None and os.pread(fd, len(known[0]), 0) == known[0]:
            identity = known[1]
        else:
            head = tailer.read_head(fd)
            if head is None:
                return False  # no complete header yet
            identity = head.identity
            if 0 < head.end <= tailer.HEAD_PROBE:  # the usual short header: kept (a long one is re-hashed)
                self._heads[f.path] = (head.line + b"\n", identity)
        batch = self._begin()
        new_gen = False
        data = None  # the new bytes, when the tail check read them with the committed tail
        if cur["identity"] is not None and old_ino is not None and fst.st_ino != old_ino:
            # Another file at the path (rotation: steps-1.jsonl moved to steps-1.jsonl.1, a new one made):
            # first drain the rest of the old one, found by its inode in the same folder.
            new_gen = self._drain_renamed(run, f, cur, old_ino, fst.st_dev)
        if new_gen:
            cur.update(identity=identity, generation=(cur["generation"] or 0) + 1, offset=0, skipping=0,
                       tail=None)
        elif cur["identity"] is None:
            cur.update(identity=identity, offset=0, skipping=0, tail=None)
        elif (identity != cur["identity"] or fst.st_size < cur["offset"]
              or (data := _read_past_tail(fd, cur["offset"], cur["tail"], fst.st_size)) is None):
            # Replaced, rewritten or truncated: the head was re-read just now.
            new_gen = True
            cur.update(identity=identity, generation=(cur["generation"] or 0) + 1, offset=0, skipping=0,
                       tail=None)
        offset = start = cur["offset"]
        more = False
        self._held_back = False
        self._nul_fresh = time.time() - fst.st_mtime < NUL_GRACE_S
        if data is None:
            data = tailer.read_block(fd, offset, fst.st_size)
        if data and (self._worker is None and not cur["skipping"] and len(data) <= SMALL_READ
                     and data[-1:] == b"\n" and offset + len(data) == fst.st_size and data[:1] != b"\0"
                     and b"\n\0" not in data):
            # A small append of complete lines (the live case): decoded together with every other one of the
            # pass and routed before the pass commits (_flush_deferred); its offset and tail are known now.
            last_line = data[data.rfind(b"\n", 0, len(data) - 1) + 1:-1]
            cur.update(offset=offset + len(data), skipping=0,
                       tail=f"{len(last_line)}:{hashlib.sha1(last_line).hexdigest()}")
            self._deferred.append((run, f, cur, data, offset))
            self._deferred_bytes += len(data)
            if self._deferred_bytes >= tailer.READ_BYTES:
                self._flush_deferred()
        elif data:
            offset, skipping, tail, more = self._ingest_block(run, f, cur, data, offset, fst.st_size)
            cur.update(offset=offset, skipping=skipping, tail=tail)
        # Held back at a NUL line: stat may not change when the data lands (NFS), so look again next poll.
        cur.update(size=fst.st_size if not (more or self._held_back) else None, mtime_ns=fst.st_mtime_ns,
                   ino=fst.st_ino)
        batch.file_updates[f] = cur  # written to `files` at commit, with every other file of the pass
        if self._progress is not None:
            self._progress.bytes_done += max(0, cur["offset"] - start)
        if new_gen:
            batch.runs.add(run.run_id)
        return more

    def _flush_deferred(self) -> None:
        """Decode the small appends :meth:`_ingest_file` set aside (all together) and route their rows.

        Runs before every commit and at the end of every poll: the rows join the transaction that holds
        their files' new offsets (rule 2).
        """
        items, self._deferred = self._deferred, []
        self._deferred_bytes = 0
        if not items:
            return
        try:
            prepared = tailer.prepare_blocks([(data, offset) for _, _, _, data, offset in items])
        except Exception:  # decoded file by file below, so that a failure names its file
            prepared = None
        gc_was_enabled = gc.isenabled()
        gc.disable()  # short-lived tuples, no cycles (as in _ingest_block)
        try:
            for i, (run, f, cur, data, offset) in enumerate(items):
                try:
                    prep = prepared[i] if prepared is not None else tailer.prepare_block(data, offset)
                    for off, length, message in prep.errors:
                        self._error(run, f, cur, off, length, message)
                    if prep.others or prep.groups:
                        self._route(run, f, cur, prep)
                except Exception as exc:
                    self._fds.drop(f.path)
                    if not _index_failure(exc):
                        log.error("traceml daemon: skipping %s until restart: %s", f.path, exc)
                        self._quarantine.add(f.path)
                        self.refused.streams[f.path] = str(exc)
                    self.refused.streams[f.path] = str(exc)
                    raise
        finally:
            if gc_was_enabled:
                gc.enable()

    def _drain_renamed(self, run: _Run, f: _File, cur: dict, ino: int, dev: int) -> bool:
        """Read the rest of ``f``'s previous file, now renamed in the same folder (found by inode ``ino``).

        True when it was found (and drained as far as its complete lines go): the path holds a new file.
        """
        folder = os.path.dirname(f.path)
        try:
            with os.scandir(folder) as it:
                names = [e.name for e in it if e.inode() == ino and e.name != os.path.basename(f.path)]
        except OSError:
            return False
        for name in names:
            try:
                fd = rundir.open_under(run.root, os.path.join(folder, name))
            except OSError:
                continue
            try:
                fst = os.fstat(fd)
                if fst.st_ino != ino or fst.st_dev != dev or not stat.S_ISREG(fst.st_mode):
                    continue
                head = tailer.read_head(fd)
                if (head is None or head.identity != cur["identity"] or fst.st_size < cur["offset"]
                        or not _tail_matches(fd, cur["offset"], cur["tail"])):
                    continue  # not the generation we were reading: nothing of it is ours to drain
                while True:
                    data = tailer.read_block(fd, cur["offset"], fst.st_size)
                    if not data:
                        break
                    before = cur["offset"]
                    offset, skipping, tail, more = self._ingest_block(run, f, cur, data, before, fst.st_size)
                    cur.update(offset=offset, skipping=skipping, tail=tail)
                    if not more or offset <= before:
                        break
                return True
            finally:
                os.close(fd)
        return False

    def _ingest_block(self, run: _Run, f: _File, cur: dict, data: bytes, offset: int, size: int):
        """Consume complete lines of ``data`` (read at ``offset``); returns (offset, skipping, tail, more)."""
        skipping = cur["skipping"]
        tail = cur["tail"]
        read_end = offset + len(data)
        if skipping:
            nl = data.find(b"\n")
            if nl < 0:
                return read_end, 1, None, read_end < size
            data = data[nl + 1:]
            offset += nl + 1
            skipping = 0
            tail = None
        # A line starting with a NUL byte is a region extended before its data landed (NFS): never commit past
        # it; read it again next poll.
        # (`b"\0" in data` is one memchr; the two-byte search only runs when a NUL is there at all)
        hole = 0 if data[:1] == b"\0" else (data.find(b"\n\0") + 1 or None) if b"\0" in data else None
        if hole is not None:
            end = data.find(b"\n", hole)
            if (end >= 0 and not data[hole:end].strip(b"\0")) or not self._nul_fresh:
                hole = None  # a complete line of NULs only, or a file quiet for NUL_GRACE_S: an error row as before
        if hole is not None:
            self._held_back = True
            data = data[:hole]
            size = read_end = offset + hole
            if not data:
                return offset, 0, tail, False
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > tailer.MAX_LINE:
                self._error(run, f, cur, offset, len(data),
                            f"line longer than {tailer.MAX_LINE} bytes (≥ {len(data)} so far); skipped")
                return read_end, 1, None, read_end < size
            return offset, 0, tail, False
        block = data[: cut + 1]
        # A block creates tens of thousands of short-lived tuples and no reference cycles: pausing the cyclic
        # collector for it saves a collection every ~700 of them (it runs, if due, right after).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            prepared = self._prepared(f, block, offset)
            if self._worker is not None and read_end < size:
                self._read_ahead(run, f, offset + cut + 1)  # the file's next block, decoded while this is written
            for off, length, message in prepared.errors:
                self._error(run, f, cur, off, length, message)
            if prepared.others or prepared.groups:
                self._route(run, f, cur, prepared)
        finally:
            if gc_was_enabled:
                gc.enable()
        last_nl = block.rfind(b"\n", 0, len(block) - 1)
        last_line = block[last_nl + 1:-1]
        tail = f"{len(last_line)}:{hashlib.sha1(last_line).hexdigest()}"
        new_offset = offset + cut + 1
        return new_offset, 0, tail, read_end < size or (new_offset < read_end and len(data) - cut - 1 > tailer.MAX_LINE)

    # ----------------------------------------------------------------- decode worker (cold backlog)
    def _prepared(self, f: _File, block: bytes, offset: int) -> tailer.Prepared:
        """The block decoded into rows: by the decode worker when it read this very block ahead, else here."""
        ahead = self._ahead.pop(f.file_id, None)
        if ahead is not None:
            spec_offset, spec_block, future = ahead
            if spec_offset == offset and spec_block == block:
                try:
                    return future.result()
                except Exception as exc:  # a dead worker: decode here from now on
                    log.warning("traceml daemon: decode worker failed (%s); decoding in the ingester", exc)
                    self._stop_worker()
            else:
                future.cancel()
        return tailer.prepare_block(block, offset)

    def _read_ahead(self, run: _Run, f: _File, offset: int) -> None:
        """Hand the block of ``f`` at ``offset`` to the decode worker, to be decoded while this one is written.

        Speculative and pure: the writer still checks the file (identity, tail, generation) and uses the
        result only for the very bytes it then reads at that offset (docs/daemon.md, "Cold-ingest path").
        """
        if self._worker is None or f.file_id in self._ahead:
            return
        try:
            st = os.stat(f.path, follow_symlinks=False)
            fd = self._fds.get(f.path, st.st_dev, st.st_ino)
            if fd is None:
                return  # not opened by a checked read yet
            data = tailer.read_block(fd, offset, st.st_size)
        except OSError:
            return
        cut = data.rfind(b"\n")
        if cut < AHEAD_MIN_BYTES or data[:1] == b"\0":
            return  # small, or a NUL region: decoded by the writer as it comes
        block = data[: cut + 1]
        try:
            self._ahead[f.file_id] = (offset, block, self._worker.submit(tailer.prepare_block, block, offset))
        except Exception:
            self._stop_worker()

    def _start_worker(self) -> None:
        """Start the decode process when a core is free for it (on a busy machine it would only compete)."""
        if self._worker is not None or not _core_free():
            return
        try:
            import concurrent.futures
            import multiprocessing

            # spawn: a fork would copy the writer's SQLite connection and the watcher's threads.
            self._worker = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        except Exception as exc:  # no worker: the writer decodes, as for small passes
            log.warning("traceml daemon: no decode worker (%s)", exc)
            self._worker = None

    def _stop_worker(self) -> None:
        for _, _, future in self._ahead.values():
            future.cancel()
        self._ahead.clear()
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=False, cancel_futures=True)

    def _error(self, run: _Run, f: _File, cur: dict, offset: int, length: int, message: str) -> None:
        batch = self._begin()
        if cur["generation"] and self.conn.execute(
                "SELECT 1 FROM errors WHERE run_id = ? AND identity = ? AND offset = ? AND length IS ? AND message = ?"
                " AND generation < ?", (run.run_id, cur["identity"], offset, length, message,
                                        cur["generation"])).fetchone():
            return  # the same line of an earlier generation, reported already
        c = self.conn.execute(
            "INSERT OR IGNORE INTO errors (run_id, path, identity, generation, offset, length, message, seen)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run.run_id, f.rel, cur["identity"], cur["generation"], offset, length, message, time.time()),
        )
        if c.rowcount:
            self.conn.execute("UPDATE runs SET errors = errors + 1 WHERE run_id = ?", (run.run_id,))
            batch.runs.add(run.run_id)

    def _route(self, run: _Run, f: _File, cur: dict, prepared: tailer.Prepared) -> None:
        batch = self._batch
        if prepared.others:
            self._route_other(run, f, cur, prepared.others)
        conn = self.conn
        agg = self._agg
        for (rank, attempt), (rows, ratios, latest) in prepared.groups.items():
            cols = list(zip(*rows))  # transpose in C: the insert, the window and the series read columns
            n = len(rows)
            # Columns NULL in the whole group are left out of the INSERT (same rows, far fewer None binds).
            if n == 1:  # the live case: one line per rank per pass, masked in C
                mask = list(map(operator.is_not, rows[0], _NONES))
                keep = tuple(compress(_POSITIONS, mask))
                values = [tuple(compress(rows[0], mask))]
            else:
                keep = tuple(i for i, col in enumerate(cols) if col[0] is not None or col.count(None) != n)
                values = list(zip(*[cols[i] for i in keep]))
            key = (run.run_id, rank, attempt)
            if cur["generation"]:
                # A later generation re-supplies rows: its values win (REPLACE), and a row it replaced sends
                # the rank's window and series to be rebuilt from the rows that remain (at commit).
                span = (*key, min(cols[live.COL_STEP]), max(cols[live.COL_STEP]))
                count_sql = ("SELECT count(*) FROM steps WHERE run_id = ? AND rank = ? AND attempt = ?"
                             " AND step BETWEEN ? AND ?")
                had = conn.execute(count_sql, span).fetchone()[0]
                conn.executemany(idx.insert_steps_sql(run.run_id, keep).replace("OR IGNORE", "OR REPLACE", 1),
                                 values)
                inserted = conn.execute(count_sql, span).fetchone()[0] - had
                if had:
                    batch.rebuild.add(key)
            else:
                # Steps of this batch stored before it are ignored by the INSERT, like a step repeated within the
                # batch: the series must fold only the rows it stores. Only steps up to the rank's newest stored
                # one can be there (its window's last step), so an append past it costs no look-up.
                stored = ()
                if n > 1:
                    lo, newest = min(cols[live.COL_STEP]), agg.window(key).last_step
                    if newest is not None and lo <= newest:
                        stored = conn.execute(_STORED_IN_RANGE, (*key, lo, max(cols[live.COL_STEP]))).fetchall()
                before = conn.total_changes
                conn.executemany(idx.insert_steps_sql(run.run_id, keep), values)
                inserted = conn.total_changes - before
                if 0 < inserted < n:
                    cols, ratios = _stored_only(cols, ratios, {r[0] for r in stored})
            batch.rows += n
            batch.records += inserted
            window = agg.window(key)
            if n == 1:
                window.add_row(rows[0], inserted)
            else:
                window.add_columns(cols, inserted)
            if latest is not None:
                window.ratios = latest
            batch.ranks.add(key)
            if inserted:
                if n <= SMALL_FOLD_ROWS:  # a live append: folded at commit with every other rank of the pass
                    batch.series.append((run.run_id, rank, cols, ratios))
                else:
                    agg.write_series(run.run_id, rank, cols, ratios)

    def _route_other(self, run: _Run, f: _File, cur: dict, others: list) -> None:
        """Records that are not steps (``(record, line offset)`` pairs): headers, events, system samples."""
        batch = self._batch
        events, samples = [], []
        for rec, off in others:
            kind = type(rec)
            if kind is records.Header:
                if off == 0:
                    self.conn.execute("UPDATE files SET header = ? WHERE file_id = ?",
                                      (_body_encoder.encode(rec).decode(), f.file_id))
                    if f.stream == "steps":  # the rank's node; a window not made yet reads it from files.header
                        w = self._agg.windows.get((run.run_id, rec.rank, rec.attempt))
                        if w is not None:
                            w.node = rec.node_rank
                continue
            if kind is records.SystemSample:
                samples.append((run.run_id, rec.node_rank, rec.ts, rec.cpu_pct, rec.ram_used, rec.ram_total,
                                _body_encoder.encode(rec.gpus).decode() if rec.gpus else None))
                continue
            body = _body_encoder.encode(rec).decode()
            tag = kind.__struct_config__.tag
            # getattr: a kind added to records.py later need not carry every field.
            events.append((run.run_id, cur["identity"], cur["generation"], off, str(tag), getattr(rec, "rank", None),
                           getattr(rec, "attempt", None), getattr(rec, "step", None), getattr(rec, "ts", None), body))
            if kind is records.RankEnd:
                key = (run.run_id, rec.rank, rec.attempt)
                w = self._agg.window(key)
                w.ended = rec.status
                w.exit_code = rec.exit_code
                w.end_ts = rec.ts
                batch.ranks.add(key)
        if events and cur["generation"]:
            # Unique per (run, file identity, offset) across generations when the content is the same: a file
            # that shrank and came back (a transient truncation) re-supplies the very same lines.
            same = "SELECT 1 FROM events WHERE run_id = ? AND identity = ? AND offset = ? AND body = ? AND generation < ?"
            events = [e for e in events
                      if self.conn.execute(same, (e[0], e[1], e[3], e[9], e[2])).fetchone() is None]
        if samples:
            self.conn.executemany("INSERT OR IGNORE INTO system VALUES (?, ?, ?, ?, ?, ?, ?)", samples)
            batch.rows += len(samples)
            batch.runs.add(run.run_id)
        if events:
            self.conn.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", events)
            batch.rows += len(events)
            batch.runs.add(run.run_id)



SMALL_READ = 64 << 10  # new bytes up to this much are read in the same pread as the committed tail


_STORED_IN_RANGE = "SELECT step FROM steps WHERE run_id = ? AND rank = ? AND attempt = ? AND step BETWEEN ? AND ?"


def _stored_only(cols: list, ratios: dict, stored_before: set) -> tuple[list, dict]:
    """The columns (and component ratios) of the rows an ``INSERT OR IGNORE`` of ``cols`` stored.

    Ignored were the steps in ``stored_before`` and every repeat of a step within the batch (the first
    line wins, as in the index): the series and ratios then count each stored step once, as a rebuild
    from the index would (docs/daemon.md rule 2).
    """
    steps = cols[live.COL_STEP]
    first: dict[int, int] = {}
    for i, step in enumerate(steps):
        if step not in stored_before:
            first.setdefault(step, i)
    keep = sorted(first.values())
    cols = [tuple(c[i] for i in keep) for c in cols]
    out = {}
    for name, pairs in (ratios or {}).items():
        seen: set = set()
        kept = []
        for step, value in pairs:
            if step in first and step not in seen:
                seen.add(step)
                kept.append((step, value))
        if kept:
            out[name] = kept
    return cols, out


def _read_past_tail(fd: int, offset: int, tail: Optional[str], size: int) -> Optional[bytes]:
    """The new bytes from ``offset`` (as :func:`tailer.read_block` reads them) when the last committed line
    still sits just before ``offset``; None when it does not (an in-place rewrite).

    A live append is small: its bytes come in the same ``pread`` as the committed tail.
    """
    want = min(size - offset, tailer.READ_BYTES)
    if not tail or offset <= 0 or want > SMALL_READ:
        return tailer.read_block(fd, offset, size) if _tail_matches(fd, offset, tail) else None
    length_text, _, digest = tail.partition(":")
    try:
        length = int(length_text)
    except ValueError:
        return tailer.read_block(fd, offset, size)
    start = offset - length - 1
    if start < 0:
        return None
    got = os.pread(fd, length + 1 + max(0, want), start)
    line, data = got[:length + 1], got[length + 1:]
    if not (len(line) == length + 1 and line.endswith(b"\n") and hashlib.sha1(line[:-1]).hexdigest() == digest):
        return None
    if 0 < len(data) < want:  # a short read: the rest as read_block would have read it
        data += tailer.read_block(fd, offset + len(data), offset + want)
    return data


def _tail_matches(fd: int, offset: int, tail: Optional[str]) -> bool:
    """True when the last committed line still sits just before ``offset`` (no in-place rewrite)."""
    if not tail or offset <= 0:
        return True
    length_text, _, digest = tail.partition(":")
    try:
        length = int(length_text)
    except ValueError:
        return True
    start = offset - length - 1
    if start < 0:
        return False
    data = os.pread(fd, length + 1, start)
    return len(data) == length + 1 and data.endswith(b"\n") and hashlib.sha1(data[:-1]).hexdigest() == digest


def _folder_name(run_dir: str) -> str:
    """A run's name until its manifest names it: its folder's name."""
    return os.path.basename(run_dir.rstrip("/")) or run_dir
