"""The write window: step records of short updates are written a few at a time, in one system call.

Written alone at the end of every update, a step record costs a short update
most of what traceml costs it: traceml's code and data run once per update,
after the trainer and torch have evicted them from the caches, and one line's
``write`` system call, its encode and its build are all cold (docs/trainers.md,
"Overhead"). Written a few at a time, the build, the encode and the write run
warm and the records share one system call. The rules:

* a step record whose update ends at least :data:`WINDOW_S` after the rank's
  last write (nothing held) is written at once: a step longer than the window
  is on disk when its update ends;
* any other step record is **held** (its update's values as they are; the
  record is built and encoded when the held records are written);
* held records are written in order, as whole lines, in one ``os.write`` loop:
  at the first update end at least :data:`WINDOW_S` after the oldest held
  record's; before any other record of the rank (eval, checkpoint, hang,
  unmeasured, rank_end: the file's order stays the step order); at
  :meth:`traceml_tui.sdk.session.Session.flush` (``traceml.finish()``, the
  trainer callbacks' train end, a recovery save, the exit, the exception hook,
  SIGTERM); and by the SDK's watchdog thread once no update ended for
  :data:`WINDOW_S` (a rank that stops stepping — a hang, a long evaluation, a
  crash in a C extension — has every finished step on disk a window and at
  most one look, :data:`LOOK_S`, later).

A SIGKILL (or any death that runs no Python) loses at most the step records of
the last :data:`WINDOW_S` of updates. One lock guards the held records and the
descriptor: the training thread takes it once per update (uncontended), the
watchdog thread when it writes.

Settings: ``TRACEML_WRITE_WINDOW_MS`` (default 20; ``0`` writes every record
at once, as before the window).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable, Optional

import msgspec

#: Seconds a step record may be held before it is written (the one place this figure is decided).
WINDOW_S = 0.020
WINDOW_ENV = "TRACEML_WRITE_WINDOW_MS"
#: Seconds between the watchdog thread's looks while the rank steps. Each look takes the GIL; at one look per
#: window a Hugging Face update of 10 ms paid about 50 µs of CPU for them (docs/trainers.md, "Overhead"), at
#: one per 0.1 s nothing measurable. A rank that stops stepping has its held records on disk a window plus
#: at most one look later.
LOOK_S = 0.1

#: Encodes step records; the default settings, as ``records.encode`` (a test holds the two byte for byte equal).
ENCODER = msgspec.json.Encoder()


def window_s() -> float:
    """The window from ``TRACEML_WRITE_WINDOW_MS`` (milliseconds; ``0`` turns it off), else :data:`WINDOW_S`."""
    raw = os.environ.get(WINDOW_ENV, "").strip()
    if not raw:
        return WINDOW_S
    try:
        value = float(raw) / 1000.0
    except ValueError:
        return WINDOW_S
    return value if 0.0 <= value < 10.0 else WINDOW_S


class WriteWindow:
    """One rank's held step records and the descriptor they go to (module docstring: the rules)."""

    __slots__ = ("fd", "window_s", "lock", "held", "oldest", "written_at", "idle", "wake", "closed", "_build")

    def __init__(self, fd: int, build: Callable[..., Any], window: float) -> None:
        self.fd = fd
        self.window_s = window
        # Re-entrant: the SIGTERM handler closes the session on the main thread, which the signal may have
        # interrupted while it held the lock.
        self.lock = threading.RLock()
        # tuples of an update's figures to build (Session._record's arguments: the update keeps no object
        # alive), or records built already (GPU steps)
        self.held: list[Any] = []
        self.oldest = 0.0  # perf_counter end of the oldest held record's update
        self.written_at = float("-inf")  # perf_counter of the last write
        self.idle = False  # the watchdog thread sleeps until woken: set ``wake`` when a record is held
        self.wake: Optional[threading.Event] = None  # the watchdog thread's (None: no thread)
        self.closed = False
        self._build = build  # (*held tuple) -> records.Step or None (Session._record)

    # -- the training thread --------------------------------------------------------------------
    def add(self, now: float, entry: Any) -> None:
        """A step record (or its update's values) at an update's end ``now``: hold it, or write what is due."""
        with self.lock:
            held = self.held
            held.append(entry)
            if len(held) > 1:
                if now - self.oldest >= self.window_s:
                    self._flush(now)
            elif now - self.written_at >= self.window_s or not self.window_s:  # a quiet gap: written at once
                self._flush(now)
            else:
                self.oldest = now
                if self.idle:
                    self.idle = False
                    self.wake.set()  # type: ignore[union-attr]

    def write(self, line: bytes, now: float) -> bool:
        """Write the held records, then ``line`` (one whole record line); False when closed."""
        with self.lock:
            self._flush(now, line)
            return not self.closed

    def flush(self, now: float) -> None:
        """Write every held record now."""
        with self.lock:
            self._flush(now)

    # -- the watchdog thread --------------------------------------------------------------------
    def watch(self, now: float, last_end: Optional[float]) -> Optional[float]:
        """Write the held records once no update ended for a window; seconds until the next look.

        None: nothing is held and the rank is quiet, so the thread may sleep until :meth:`add` wakes it.
        """
        with self.lock:
            if self.closed:
                return None
            quiet = last_end is None or now - last_end >= self.window_s
            if not quiet:
                return LOOK_S  # the rank steps: its own update ends write what is due
            if self.held:
                self._flush(now)
            self.idle = self.wake is not None  # (add() wakes the thread that sleeps on ``wake``)
            return None

    # -- both -----------------------------------------------------------------------------------
    def _flush(self, now: float, line: bytes = b"") -> None:
        """(lock held) Build, encode and write the held records, then ``line``, in one ``os.write`` loop."""
        batch = self.held
        if self.closed:  # steps after close(), or a forked child's copy: never written (the number may be reused)
            batch.clear()
            return
        buf = line
        if batch:
            # The batch stays ``self.held`` until the bytes are built: a KeyboardInterrupt before the write
            # leaves it held (nothing written, nothing lost), and a SIGTERM handled on this thread meanwhile
            # (its handler closes the session through this lock, re-entrant) finds it and writes it before
            # rank_end, where a batch taken out of ``held`` first was lost with rank_end counting it.
            complete = self._build_all(batch)
            # One bytes object for every line: a bytearray emptied and refilled record by record was
            # shrunk to nothing by each emptying and grown back by each record (several reallocs per
            # write, in the allocator's cold paths; docs/trainers.md "Overhead")
            buf = ENCODER.encode_lines(batch if complete else [record for record in batch if record is not None])
            if self.held is batch:
                self.held = []
                if line:
                    buf += line
            elif self.closed:  # a handler on this thread wrote it, and closed the session, meanwhile
                return
            else:  # a handler on this thread wrote it meanwhile: only ``line`` is left to write
                buf = line
        if buf:
            # whole lines, as atomic.append_line writes them, looping on a short write (never seen on a local disk)
            written = os.write(self.fd, buf)
            while written < len(buf):
                written += os.write(self.fd, buf[written:])
            self.written_at = now

    def _build_all(self, batch: list[Any]) -> bool:
        """Build the records of held updates in place (in order: examples count on from one to the next).

        False when a record could not be built (its entry is None now, or was left None by an earlier build of
        this batch that a KeyboardInterrupt cut short: the batch stays held).
        """
        build = self._build
        complete = True
        for i, entry in enumerate(batch):
            if type(entry) is tuple:
                try:
                    record = batch[i] = build(*entry)
                except Exception as exc:  # noqa: BLE001 - one bad value must not cost the other records
                    record = batch[i] = None
                    print(f"traceml: step {entry[0]} not recorded ({type(exc).__name__}: {str(exc)[:200]})",
                          file=sys.stderr, flush=True)
                if record is None:
                    complete = False
            elif entry is None:
                complete = False
        return complete
