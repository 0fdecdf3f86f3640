"""The service: lifecycle, the serve loop, one transaction per pass (docs/daemon.md).

:class:`Ingester` is what ``traceml daemon`` runs in the foreground and what ``traceml watch`` embeds in a
background thread when no daemon runs for its roots (``run_once`` / ``start`` / ``stop``). It decides
*when* and holds the transaction; the rooms it drives do the rest and return what they found:

* :mod:`daemon.plan` — which streams a pass reads (hints, the timed poll's rounds): targets;
* :mod:`daemon.stream` — every byte rule of a stream (descriptors, identity, generation, tail, rotation,
  NUL hold-back): blocks of complete lines, cursors and error spans;
* :mod:`daemon.decode` — those blocks decoded into records and step rows (pure);
* :mod:`daemon.columns` — a live pass's small appends decoded and routed together, on columns;
* :mod:`daemon.cold` — a large backlog: newest first, its progress, the decode process;
* :mod:`daemon.store` — all of the writer's SQL for what was read (rows, side files, errors, cursors);
* :mod:`daemon.sidefiles`, :mod:`daemon.leases`, :mod:`daemon.refusals` — side files, launcher leases and
  refused files; :mod:`daemon.watcher` — the inotify hints; :mod:`daemon.lock` — the single writer.

The stream returns what it read; the service decodes it and routes it through the store, in the pass's
one open transaction with every file's new cursor (rule 2).

``IndexLockedError``, ``DaemonInfo``, ``find_running_daemon``, ``acquire_lock`` and ``lock_path`` are
re-exported here for callers of the earlier layout.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import sqlite3
import threading
import time
import weakref
from typing import Callable, Optional

from traceml_tui.core import rundir
from traceml_tui.core.signals import shielded

from . import cold, columns, decode, leases, live, locations, plan, refusals, sidefiles, store, stream, wal, watcher
from . import index as idx
from .lock import DaemonInfo, IndexLockedError, acquire_lock, find_running_daemon, lock_path, release_lock

__all__ = ["Ingester", "IndexLockedError", "DaemonInfo", "find_running_daemon", "acquire_lock", "lock_path",
           "BATCH_ROWS", "MAX_DEPTH", "IndexWriteError"]

log = logging.getLogger("traceml.daemon")

BATCH_ROWS = 10_000  # rows per transaction (measured in docs/daemon.md, "Cold-ingest path")
MAX_DEPTH = 4  # run directories are looked for at most this many levels below a root
SIDE_MAX_BYTES = sidefiles.SIDE_MAX_BYTES
BACKOFF_MAX_S = 60.0  # the live daemon retries a failing index at most this far apart
FIGURES_EVERY_S = 2.0  # the live daemon recomputes a rank's rolling figures at most this often …
FIGURES_NEW_STEPS = live.WINDOW // 2  # … and then once half of its window is new steps …
FIGURES_MAX_S = 10.0  # … or this long after the last time, whichever comes first
LIVE_CHECKPOINT_PAGES = 2048  # the live daemon's WAL checkpoints (~8 MiB) apart (docs/daemon.md, "Live path")


def _gc_paused_when_live(method):
    """Run an :class:`Ingester` method with the cyclic garbage collector paused while the ingester is live (its
    live table on): a live pass makes thousands of short-lived tuples and no reference cycles, and a collection
    every ~700 of them cost ~15 µs of a pass's ~150 µs per record (docs/daemon.md, "Live path"); it runs, if
    due, right after. ``--once`` and the cold path pause it per block only (``_take``), so that a long backlog
    never holds garbage for the whole read."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if self.store is None or not self.store.live.enabled or not gc.isenabled():
            return method(self, *args, **kwargs)
        gc.disable()
        try:
            return method(self, *args, **kwargs)
        finally:
            gc.enable()
    return run


class IndexWriteError(RuntimeError):
    """The index cannot be written (disk full, I/O error, damaged file): nothing of the batch was committed."""


def _index_failure(exc: BaseException) -> bool:
    """True for an error of the index itself (full disk, I/O, corruption), not of one file's rows."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(
        exc, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.DataError))


class Ingester:
    """Tails every run under ``roots`` into the SQLite index at ``index_path``.

    ``poll_interval`` is how often known files are re-stat'ed (primary
    mechanism); ``use_inotify`` adds inotify hints that make changes visible
    sooner; ``rescan_interval`` is how often the roots are walked for new runs
    and files and side files are re-stat'ed.

    The rooms are public attributes (read by tests and benchmarks): ``plan`` (:class:`plan.Planner`, with
    the ``watcher`` while serving), ``streams`` (:class:`stream.Streams`), ``cold``
    (:class:`cold.ColdPath`) and, while open, ``store`` (:class:`store.Store`, with the rolling figures
    in ``store.agg``).
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
        self.wal: Optional[wal.WalBound] = None
        self.store: Optional[store.Store] = None
        self.plan = plan.Planner(self.poll_interval, self.rescan_interval)
        self.streams = stream.Streams()  # its descriptor bound is set at open() once the open-file limit is known
        self.cold = cold.ColdPath()
        self.refused = refusals.Refused()  # files refused now: one error row each (docs/daemon.md, "Damaged input")
        self.records_ingested = 0
        #: Called after each commit while a large backlog is read, with :meth:`cold.Progress.snapshot`'s dict
        #: (the last one: done).
        self.on_progress: Optional[Callable[[dict], None]] = None
        self._lock_fd: Optional[int] = None
        self._lock_release: Optional[weakref.finalize] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._batch: Optional[store.Batch] = None
        self._quarantine: set[str] = set()  # streams whose ingestion raised: set aside until restart
        self._deferred: list[tuple] = []  # (run, file, cursor, bytes, offset): small appends decoded together
        self._deferred_bytes = 0
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
        self.streams.fds.cap = stream.fd_budget()
        try:
            self.conn = idx.connect_writer(self.index_path)
            self.wal = wal.WalBound(self.conn, self.index_path)  # the WAL file stays under a bound (daemon/wal.py)
            self.store = store.Store(self.conn)
            self.store.load(self.plan)
            self.refused.load(self.conn, {r.run_id: r.dir for r in self.plan.runs.values()})
            self.merge_live()  # rows a killed daemon left in the live table: stored and folded before anything
            if idx.needs_rederive(self.conn):
                try:
                    self.store.rederive({r.run_id: r for r in self.plan.runs.values()}, self.begin())
                    self.commit()
                except Exception as exc:  # the new columns stay NULL until the next open; ingest goes on
                    log.error("traceml daemon: deriving the columns of the upgraded index failed: %s", exc)
                    self.rollback()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release everything (the lock last, so no second writer overlaps)."""
        if self.plan.watcher is not None:
            self.plan.watcher.stop()
            self.plan.watcher = None
        self.cold.stop()
        self.streams.reset()
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None
            self.store = None
        if self._lock_fd is not None:
            self._lock_release()  # release_lock, once
            self._lock_fd = None

    def run_once(self) -> int:
        """Ingest everything present now and return how many records were added."""
        self.open()
        before = self.records_ingested
        for _ in range(1 + len(self.plan.paths) + 1):  # each failure sets one file aside, so this ends
            try:
                self.scan()
                while self.poll(self.plan.everything()):
                    pass
                self.commit()
                self.merge_live()
                break
            except Exception as exc:
                self.rollback()
                if _index_failure(exc):  # retrying cannot help; what was committed stays counted
                    raise IndexWriteError(f"cannot write the index {self.index_path}: {exc}") from None
                log.error("traceml daemon: ingest pass failed: %s", exc)
        return self.records_ingested - before

    def request_stop(self) -> None:
        """Ask :meth:`serve` to return after the current batch (safe from a signal handler)."""
        self._stop.set()
        self.plan.wake.set()

    def serve(self) -> None:
        """The loop: rescan every ``rescan_interval``, re-stat every ``poll_interval``, react to hints."""
        self.open()
        stop, wake, planner = self._stop, self.plan.wake, self.plan
        if self.use_inotify:
            planner.watcher = watcher.Watcher(self.roots, planner.mark_dirty)
            if not planner.watcher.start():
                log.warning("traceml daemon: inotify unavailable; polling only")
                planner.watcher = None
        self.live_settings()
        next_scan = next_poll = next_hint = 0.0
        backoff = 0.0
        while not stop.is_set():
            now = time.monotonic()
            self._pass_streams = 0
            # With hints, a timed poll due between two hint-driven passes waits for the next one and is that
            # pass (it reads the hinted streams too, timed_pass): one commit where there would be two.
            poll_at = max(next_poll, next_hint) if planner.watcher is not None else next_poll
            try:
                if now >= next_scan:
                    self.scan()
                    next_scan = now + self.rescan_interval
                if now >= poll_at:
                    if self.timed_pass():
                        next_scan = 0.0
                    next_poll = now + self.poll_interval
                elif now >= next_hint:
                    if self.hinted_pass():
                        next_scan = 0.0  # something new appeared under a root: look for it now
                self.commit_pass()
                backoff = 0.0
            except Exception as exc:  # keep serving other files; a broken batch is retried from the index
                self.rollback()
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
            next_hint = plan.next_hint(now, done, self._pass_streams)
            poll_at = max(next_poll, next_hint) if planner.watcher is not None else next_poll
            deadline = min(poll_at, next_scan, self.store.agg.next_stale_due())
            if planner.pending():
                deadline = min(deadline, next_hint)
            timeout = deadline - time.monotonic()
            if timeout > 0:
                wake.wait(timeout)
                wake.clear()
                gap = min(next_hint, poll_at, next_scan) - time.monotonic()
                if gap > 0 and not stop.is_set():
                    stop.wait(gap)  # a hint came early: let the burst gather for one pass
            else:
                wake.clear()
        if self.store.agg.stale:  # ranks whose figures were left for later get them now: nothing may write them again
            try:
                self.begin().ranks.update(self.store.agg.write_stale())
                self.commit()
            except Exception as exc:
                self.rollback()
                log.error("traceml daemon: writing the last rolling figures at stop failed: %s", exc)
        try:  # the live table left empty at a clean stop (a killed daemon's rows are merged at the next open)
            self.merge_live()
        except Exception as exc:
            log.error("traceml daemon: merging the live rows at stop failed: %s", exc)

    def live_settings(self) -> None:
        """What :meth:`serve` changes for a long-lived ingester (docs/daemon.md, "Live path"); the benchmark
        of a live pass applies it too."""
        # A live rank's last pages of `steps` and the series are rewritten pass after pass: checkpoints further
        # apart copy each of them back once for several passes, not once per pass.
        self.conn.execute(f"PRAGMA wal_autocheckpoint={LIVE_CHECKPOINT_PAGES}")
        # A live pass's step rows go to the append-ordered live table, merged every few seconds
        # (daemon/live_table.py).
        self.store.live.enabled = True
        # A live rank's medians and rates: at most every 2 s, and at least every 10 s while it writes.
        agg = self.store.agg
        agg.figures_every = FIGURES_EVERY_S
        agg.figures_new_steps = FIGURES_NEW_STEPS
        agg.figures_max_s = FIGURES_MAX_S

    def start(self) -> None:
        """Serve in a background thread (the TUI's embedded mode)."""
        self.open()
        self._stop.clear()
        self._thread = threading.Thread(target=self.serve, name="traceml-ingester", daemon=True)
        with shielded():  # (core/signals.py: a signal sent to the watch goes to its main thread)
            self._thread.start()

    def stop(self) -> None:
        """Stop the background loop (or ``serve`` on the default event) and close."""
        self._stop.set()
        self.plan.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.close()

    # ----------------------------------------------------------------- passes
    def timed_pass(self) -> bool:
        """A timed poll: the hinted streams, then every stream changed lately and this round's share of the
        quiet ones (:meth:`plan.Planner.poll_targets`); True when a path outside every known run changed.

        The hints are read here, not dropped: a stream quiet for minutes (a rank in a long evaluation) is not
        among the recent ones, and its hint may be the only news of its append until its turn comes round.
        A stream both hinted and recent is looked at once.
        """
        hinted, unknown = self._hints()
        self.poll(self.plan.merge(self.plan.poll_targets(), hinted))
        return unknown

    def hinted_pass(self) -> bool:
        """A pass over the streams the waiting hints name; True when a path outside every known run changed."""
        targets, unknown = self._hints()
        if targets:
            self.poll(targets)
        return unknown

    def _hints(self) -> tuple[list, bool]:
        """The targets the waiting hints name (a run's every stream, scanned first, when a new file appeared
        in it), and whether a path outside every known run changed."""
        hinted = self.plan.hinted()
        targets = hinted.targets
        for run_dir in hinted.rescan:
            self._scan_run(self.plan.runs[run_dir])
            targets.extend(self.plan.streams_of(run_dir))
        return targets, hinted.unknown

    # ----------------------------------------------------------------- transactions
    def commit_pass(self) -> None:
        """End a live pass: commit what it read, and the rolling figures of quiet ranks that fell due since
        (their last figures were left for later, docs/daemon.md "Live path"), even when it read nothing; a
        pass that stored no step row merges the rows waiting in the live table (a quiet daemon's series need
        not wait for the merge interval)."""
        if self.store.agg.stale and self.store.agg.due_stale():
            self.begin()  # commit writes the due ones with the batch
        quiet = self._batch is None or not self._batch.records
        self.commit()
        if quiet and self.store.live.rows:
            self.merge_live()

    def begin(self) -> store.Batch:
        """The open transaction's batch (``BEGIN IMMEDIATE`` when none is open)."""
        if self._batch is None:
            self.conn.execute("BEGIN IMMEDIATE")
            self._batch = store.Batch()
        return self._batch

    @_gc_paused_when_live
    def commit(self) -> None:
        """Route the pass's deferred appends, write what the pass read and COMMIT; then the files' cursors in
        memory follow (rule 2: rows and offsets commit together or not at all)."""
        self._flush_deferred()
        batch = self._batch
        if batch is None:
            return
        progress = self.cold.snapshot(self.records_ingested + batch.records)  # committed with the rows it counts
        self.store.finish(batch, self.clock(), progress)
        self.conn.execute("COMMIT")
        self._batch = None
        self.wal.after_commit()
        self.records_ingested += batch.records
        for f, changes in batch.file_updates.items():
            f.take(changes)
        if self.store.live.due():
            self.merge_live()
        if progress is not None:
            if progress["done"]:
                self.cold.progress = None
            if self.on_progress is not None:
                self.on_progress(progress)

    @_gc_paused_when_live
    def merge_live(self) -> None:
        """Move every row waiting in the live table into the step table and fold it into the series, in
        transactions of their own, a slice of the ranks each (daemon/live_table.py); the runs it touched are
        marked changed."""
        live = self.store.live
        if not live.rows or self._batch is not None:
            return
        conn = self.conn
        for span in live.slices():  # a slice of the ranks per transaction: the WAL stays bounded (live_table.py)
            conn.execute("BEGIN IMMEDIATE")
            try:
                runs = live.move(self.store.agg, span=span)
                version = idx.bump_version(conn)
                conn.executemany("UPDATE runs SET updated_version = ? WHERE run_id = ?", [(version, r) for r in runs])
                conn.execute("COMMIT")
                self.wal.after_commit()
            except BaseException:
                try:
                    conn.execute("ROLLBACK")
                except Exception:
                    pass
                self.rollback()  # memory (waiting rows, series widths) went ahead of the index: reload it
                raise

    def rollback(self) -> None:
        """Roll the open transaction back; memory may be ahead of the index, so reload what was committed and
        re-open every stream."""
        if self._batch is not None:
            try:
                self.conn.execute("ROLLBACK")
            except Exception:
                pass
            self._batch = None
        self._deferred.clear()
        self._deferred_bytes = 0
        self.streams.reset()
        self.cold.forget()
        self.store.load(self.plan)
        self.refused.load(self.conn, {r.run_id: r.dir for r in self.plan.runs.values()})

    # ----------------------------------------------------------------- discovery and side files
    def scan(self) -> None:
        """Walk the roots: new runs and streams, changed side files, runs whose folder is gone (rule 7)."""
        seen = set()
        runs = self.plan.runs
        for root in self.roots:
            for run_dir in rundir.discover_runs(root, self.max_depth):
                seen.add(run_dir)
                if refusals.run_dir_refused(self.refused, run_dir):
                    continue
                run = runs.get(run_dir)
                if run is None:
                    run = self.store.add_run(run_dir, root, self.begin())
                    self.plan.add_run(run)
                elif run.missing:
                    self.store.set_missing(run, False, self.begin())
                self._scan_run(run)
        for run in list(runs.values()):
            if run.dir in seen or run.missing:
                continue
            if not any(run.dir == r or run.dir.startswith(r.rstrip("/") + "/") for r in self.roots):
                continue  # another root set's run: not ours to judge
            if not os.path.isdir(run.dir) or os.path.islink(run.dir):
                self.store.set_missing(run, True, self.begin())

    def _scan_run(self, run: plan.Run) -> None:
        """One run folder: refused names, new streams, side files changed since last read (each in its own
        savepoint), launcher leases, side files removed."""
        streams, sides, refused = rundir.RunDir(run.dir).scan()
        if refusals.new_names(self.refused, run.dir, refused):  # a name beyond 64 bits: an error row, no failure
            self.begin().runs.add(run.run_id)
            refusals.name_errors(self.conn, run.run_id, refused)
        for s in streams:
            if s.rel not in run.files:
                self.begin()
                self.plan.add_file(run, self.store.add_stream(run, s))
        present = set()
        for side in sides:
            if side.kind == leases.KIND:
                continue  # read at every scan by the lease tracker, below
            present.add(side.rel)
            if run.sides.get(side.rel) != (side.size, side.mtime_ns):
                self.begin()
                try:
                    with refusals.savepoint(self.conn):  # one file's failure undoes its own rows only
                        self._side_file(run, side)
                except Exception as exc:
                    if _index_failure(exc):
                        raise
                    self.refused.side(os.path.join(run.dir, side.rel), refusals.side_failed(
                        self.conn, run.run_id, side.rel, side.kind, side.key, side.size, side.mtime_ns, exc))
                    run.sides[side.rel] = (side.size, side.mtime_ns)  # not read again until it changes
        lease_sides = [side for side in sides if side.kind == leases.KIND]
        if lease_sides and self._leases.observe(
                self.conn, self.begin, run.run_id, run.root, run.dir, lease_sides,
                lambda side, message: refusals.side_error(self.conn, run.run_id, side.rel, side.mtime_ns, side.size, message)):
            self.begin().runs.add(run.run_id)
        for rel in [r for r in run.sides if r not in present]:
            if os.path.isdir(run.dir):  # a removed run keeps its side files (rule 7)
                self.store.drop_side(run, rel, self.begin())
                del run.sides[rel]
                self.refused.side(os.path.join(run.dir, rel), None)  # gone: no longer refused

    def _side_file(self, run: plan.Run, side: rundir.SideFile) -> None:
        """Read one side file (regular files only; the stream room's no-link open) and store it, its error
        and its facts."""
        path = os.path.join(run.dir, side.rel)
        try:
            got = stream.read_side(run.root, path, SIDE_MAX_BYTES)
        except stream.OpenFailed as exc:
            self.store.unreadable(run, side.rel, path, exc.cause, self.begin)
            return
        if got is not None:
            st, data = got
            read = (sidefiles.too_large(side.rel, st.st_size) if data is None
                    else sidefiles.parse(side.kind, side.rel, side.key, data))
            self.store.side_file(run, side.rel, side.kind, read, st.st_size, st.st_mtime_ns, self.begin())
            self.refused.side(path, read.error)
            run.sides[side.rel] = (st.st_size, st.st_mtime_ns)

    # ----------------------------------------------------------------- streams
    @_gc_paused_when_live
    def poll(self, targets: list) -> bool:
        """Ingest new complete lines of ``targets`` (``(run, file)`` pairs); True when anything moved (more
        may follow).

        Each target is read once per call, into the one open transaction (committed by the caller, or
        here when it reaches BATCH_ROWS): a pass over many files that each grew by a line is one commit.
        """
        progressed = False
        now = time.monotonic()
        stop, streams, backlog = self._stop, self.streams, self.cold
        due = streams.changed(targets, self._batch.file_updates if self._batch is not None else {},
                              self._quarantine)
        due = backlog.plan(due, self.records_ingested)
        pipelined = backlog.pipelined()
        self._pass_streams += len(due)
        for i, (run, f, st) in enumerate(due):
            f.changed = now
            if pipelined and i + 1 < len(due):  # the next file's first block, decoded while this one is read
                nrun, nf, nst = due[i + 1]
                streams.preopen(nrun.root, nf.path, nst)
                if backlog.wants(nf.file_id):
                    pend = self._batch.file_updates.get(nf) if self._batch is not None else None
                    offset = (pend or {}).get("offset", nf.offset) or 0 if nf.identity is not None else 0
                    backlog.read_ahead(nf.file_id, offset, streams.peek(nf.path, offset))
            while True:
                try:
                    more = self._read_stream(run, f, st)
                except OSError as exc:
                    log.warning("traceml daemon: cannot read %s: %s", f.path, exc)
                    streams.fds.drop(f.path)
                    more = False
                except Exception as exc:
                    self._set_aside(f, exc)
                    raise
                progressed = progressed or more
                if self._batch is not None and self._batch.rows >= BATCH_ROWS:
                    self.commit()
                if not more or stop.is_set():
                    break
            if backlog.progress is not None:
                backlog.progress.files_done += 1
            if stop.is_set():
                break
        if backlog.progress is not None and not backlog.progress.finished and not stop.is_set():
            backlog.progress.finished = True  # the backlog's last figures go with the pass's commit
            self.begin()
        if pipelined:
            backlog.stop()
        self._flush_deferred()
        return progressed

    def _read_stream(self, run: plan.Run, f: plan.File, st: os.stat_result) -> bool:
        """Read one stream from its cursor (``st``: its path's ``stat`` of this pass); True when more data
        may remain. The stream room reads; what it returns is decoded and routed here."""
        streams = self.streams
        if ((self._batch is None or f not in self._batch.file_updates) and self.cold.worker is None
                and self.cold.progress is None):
            # The live case: a small append to a stream this ingester read last (daemon/stream.py).
            quick = streams.quick_append(f.path, st, f.identity, f.generation, f.offset, f.skipping, f.tail, f.ino)
            if quick is not None:
                cur, data = quick
                self._deferred.append((run, f, cur, data, f.offset))
                self.begin().file_updates[f] = cur
                self._deferred_bytes += len(data)
                if self._deferred_bytes >= stream.READ_BYTES:
                    self._flush_deferred()
                return False
        try:
            opened = streams.open(run.root, f.path, st)
        except stream.OpenFailed as exc:
            self.store.unreadable(run, f.rel, f.path, exc.cause, self.begin)
            return False
        if opened is None:
            return False
        fd, fst = opened
        state = (self._batch.file_updates.get(f) if self._batch is not None else None) or {}
        cur = {k: state.get(k, getattr(f, k)) for k in stream.CURSOR}
        old_ino = state.get("ino", f.ino)
        identity = streams.identity(f.path, fd)
        if identity is None:
            return False  # no complete header yet
        batch = self.begin()
        rotated = None
        if cur["identity"] is not None and old_ino is not None and fst.st_ino != old_ino:
            # Another file at the path (rotation): first the rest of the old one, under the old cursor.
            rotated = streams.rotated(run.root, f.path, cur, old_ino, fst.st_dev)
            for piece in rotated or ():
                self._take(run, f, cur, piece, batch)
        read = streams.advance(fd, fst, cur, identity, rotated is not None, self.cold.worker is None, f.path)
        if read.append is not None:
            # A small append of complete lines (the live case): decoded with every other one of the pass and
            # routed before the pass commits (_flush_deferred); its cursor is known now.
            self._deferred.append((run, f, cur, read.append, read.start))
            self._deferred_bytes += len(read.append)
            if self._deferred_bytes >= stream.READ_BYTES:
                self._flush_deferred()
        elif read.cut is not None:
            self._take(run, f, cur, read.cut, batch)
        batch.file_updates[f] = cur  # written to `files` at commit, with every other file of the pass
        if self.cold.progress is not None:
            self.cold.progress.bytes_done += max(0, cur["offset"] - read.start)
        if read.new_generation:
            batch.runs.add(run.run_id)
        return read.more

    def _take(self, run: plan.Run, f: plan.File, cur: dict, piece: stream.Cut, batch: store.Batch) -> None:
        """Decode the lines of one cut of ``f`` (read under the cursor ``cur``) and route them."""
        if piece.error is not None:
            self.store.error(run, f, cur, *piece.error, batch)
        if not piece.block:
            return
        # A block creates tens of thousands of short-lived tuples and no reference cycles: pausing the cyclic
        # collector for it saves a collection every ~700 of them (it runs, if due, right after).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            prepared = self.cold.prepared(f.file_id, piece.block, piece.at)
            if piece.more and self.cold.wants(f.file_id):  # the file's next block, decoded while this is written
                self.cold.read_ahead(f.file_id, piece.offset, self.streams.peek(f.path, piece.offset))
            self.store.route(run, f, cur, prepared, batch)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _flush_deferred(self) -> None:
        """Decode the small appends :meth:`_read_stream` set aside (all together) and route their rows.

        Runs before every commit and at the end of every poll: the rows join the transaction that holds
        their files' new offsets (rule 2).
        """
        items, self._deferred = self._deferred, []
        self._deferred_bytes = 0
        if not items:
            return
        batch = self.begin()
        gc_was_enabled = gc.isenabled()
        gc.disable()  # short-lived tuples, no cycles (as in _take)
        try:
            # The live pass's usual shape on columns: one decode, one loop of rows and routing (daemon/columns.py).
            if columns.route_pass(self.store, items, batch, self._set_aside):
                return
            try:
                prepared = decode.prepare_blocks([(data, offset) for _, _, _, data, offset in items])
            except Exception:  # decoded file by file below, so that a failure names its file
                prepared = None
            for i, (run, f, cur, data, offset) in enumerate(items):
                try:
                    self.store.route(run, f, cur, prepared[i] if prepared is not None
                                     else decode.prepare_block(data, offset), batch, append=True)
                except Exception as exc:
                    self._set_aside(f, exc)
                    raise
        finally:
            if gc_was_enabled:
                gc.enable()

    def _set_aside(self, f: plan.File, exc: Exception) -> None:
        """A stream whose ingestion raised: its descriptor goes and, unless the index itself failed, it is
        set aside until restart (an unexpected bug on one file must not stall the others)."""
        self.streams.fds.drop(f.path)
        if not _index_failure(exc):
            log.error("traceml daemon: skipping %s until restart: %s", f.path, exc)
            self._quarantine.add(f.path)
            self.refused.streams[f.path] = str(exc)
