"""The cold path: a large backlog read newest run first, its progress, and the decode process
(docs/daemon.md, "First launch" and "Cold-ingest path").

A first ``traceml daemon`` over a team's log root reads for a minute or more. When one pass finds at
least PROGRESS_MIN_BYTES to read, :meth:`ColdPath.plan` orders it newest run first and starts a
:class:`Progress` (what ``meta.ingest_progress``, ``traceml daemon``'s line and ``watch``'s header show);
from WORKER_MIN_BYTES on, a second process decodes each file's next block while the writer writes this
one (:meth:`ColdPath.read_ahead`), when a core is free for it. The worker is speculative and pure: the
writer still checks every file (identity, tail, generation: ``daemon/stream.py``) and uses a result only
for the very bytes it then reads at that offset (:meth:`ColdPath.prepared`). No SQL here.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

from traceml_tui.core.signals import shielded, unblock_async_signals

from . import decode

log = logging.getLogger("traceml.daemon")

WORKER_MIN_BYTES = 64 << 20  # a backlog this large is decoded by a second process while the writer writes
AHEAD_MIN_BYTES = 256 << 10  # blocks smaller than this are decoded by the writer itself
PROGRESS_MIN_BYTES = 16 << 20  # a backlog this large (≈50k records) is reported while it is read


class Progress:
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


def core_free() -> bool:
    """True when this machine has a core to spare: two or more, and the load leaves one idle."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return cores >= 2 and load <= cores - 1


def decode_worker(futures: Any, multiprocessing: Any) -> Any:
    """The decode process's pool (``concurrent.futures``, ``multiprocessing`` passed in: imported only when a
    large backlog needs it).

    spawn: a fork would copy the writer's SQLite connection and the watcher's threads. Its first submit starts
    the pool's threads and the process from a shielded block (core/signals.py); the process inherits that mask
    through ``exec``, so it unblocks its signals first (a SIGTERM sent to it must still end it).
    """
    return futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=unblock_async_signals)


class ColdPath:
    """The backlog being read now (``progress``, None when there is none) and the decode process."""

    def __init__(self) -> None:
        self.progress: Optional[Progress] = None
        self.worker = None  # a decode process while a large backlog is read (concurrent.futures)
        self.ahead: dict[int, tuple] = {}  # file_id -> (offset, block, future) handed to the worker

    def plan(self, due: list, records_ingested: int) -> list:
        """``due`` (``(run, file, stat)`` of a pass), newest run first when it holds a large backlog, which
        then starts :attr:`progress`; as it came otherwise (and while a backlog is already being read)."""
        if len(due) < 2 or self.progress is not None:
            return due
        total = 0
        for _, f, st in due:
            total += max(0, st.st_size - (f.offset or 0 if f.identity is not None else 0))
        if total < PROGRESS_MIN_BYTES:
            return due
        newest: dict[int, float] = {}
        for run, _, st in due:
            newest[run.run_id] = max(newest.get(run.run_id, 0.0), st.st_mtime)
        due.sort(key=lambda d: (-newest[d[0].run_id], d[0].dir, d[1].rel))
        self.progress = Progress(files_total=len(due), bytes_total=total, base=records_ingested)
        return due

    def snapshot(self, records_now: int) -> Optional[dict]:
        """The backlog being read now (:meth:`Progress.snapshot` at ``records_now`` records ingested, those
        of the open transaction included), or None when there is none."""
        return None if self.progress is None else self.progress.snapshot(records_now)

    def pipelined(self) -> bool:
        """True while a backlog large enough for the decode process is read (which is then started, when a
        core is free for it: on a busy machine it would only compete with the writer)."""
        p = self.progress
        if p is None or p.finished or p.bytes_total < WORKER_MIN_BYTES:
            return False
        if self.worker is None and core_free():
            try:
                import concurrent.futures
                import multiprocessing

                self.worker = decode_worker(concurrent.futures, multiprocessing)
            except Exception as exc:  # no worker: the writer decodes, as for small passes
                log.warning("traceml daemon: no decode worker (%s)", exc)
                self.worker = None
        return True

    def stop(self) -> None:
        """Stop the decode process (what it was handed is dropped; the writer decodes from now on)."""
        for _, _, future in self.ahead.values():
            future.cancel()
        self.ahead.clear()
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.shutdown(wait=False, cancel_futures=True)

    def forget(self) -> None:
        """After a rollback: stop the worker; the next pass measures the backlog again (counted from memory)."""
        self.stop()
        self.progress = None

    def wants(self, file_id: int) -> bool:
        """True when the worker runs and holds no block of this file yet (:meth:`read_ahead` is worth a read)."""
        return self.worker is not None and file_id not in self.ahead

    def read_ahead(self, file_id: int, offset: int, data: bytes) -> None:
        """Hand the complete lines of ``data`` (a file's bytes at ``offset``) to the decode worker, to be
        decoded while the writer writes the block before them; small blocks and NUL regions are left to the
        writer."""
        if not self.wants(file_id):
            return
        nl = data.rfind(b"\n")
        if nl < AHEAD_MIN_BYTES or data[:1] == b"\0":
            return
        block = data[: nl + 1]
        try:
            with shielded():  # the pool's threads, started by its first submit, leave signals to the main thread
                future = self.worker.submit(decode.prepare_block, block, offset)
            self.ahead[file_id] = (offset, block, future)
        except Exception:
            self.stop()

    def prepared(self, file_id: int, block: bytes, offset: int) -> decode.Prepared:
        """The block decoded into rows: by the decode worker when it read this very block ahead, else here."""
        ahead = self.ahead.pop(file_id, None)
        if ahead is not None:
            spec_offset, spec_block, future = ahead
            if spec_offset == offset and spec_block == block:
                try:
                    return future.result()
                except Exception as exc:  # a dead worker: decode here from now on
                    log.warning("traceml daemon: decode worker failed (%s); decoding in the ingester", exc)
                    self.stop()
            else:
                future.cancel()
        return decode.prepare_block(block, offset)
