"""The per-rank hang watchdog: a thread that sleeps until a step overruns, then records where the rank is.

A hung collective silences every rank at once, so step records alone cannot
tell the rank that never arrived from the peers waiting for it (docs/run.md
"Hang forensics"). When the step in progress has run longer than
``max(floor, factor × the rank's median step interval)``, this thread writes
one ``hang`` record (:class:`traceml_tui.core.records.Hang`) for that step:
the main thread's innermost frames (``sys._current_frames()``), the
``torch.distributed`` collective it is inside, if any, and the default process
group's collective sequence number when torch exposes it (gloo and NCCL do;
DDP's own all-reduces count too). It writes again only after the rank made
progress and overran anew.

Cost per step: none. The step clock already keeps the end of the previous
step (``Session.prev_end``) and the step count; the thread reads them when it
wakes, which is about once per overrun limit, and estimates the median step
interval from the steps completed between its wake-ups (the median of the
last few windows' mean intervals), so the training loop does no extra work.

The record goes to the rank's own stream (one writer per file), after the
step records the write window holds, under the window's lock
(``sdk/window.py``), which also keeps it from writing to a descriptor that
:meth:`Session.close` is closing.

The same thread writes the step records the window holds once no update ended
for a window (:meth:`traceml_tui.sdk.window.WriteWindow.watch`): it looks
once per :data:`traceml_tui.sdk.window.LOOK_S` while the rank steps and sleeps while it is quiet with
nothing held (the training thread wakes it when it holds a record again). It
runs for that alone when the hang records are off.

The thread blocks every asynchronous signal (:func:`traceml_tui.core.signals.shielded`): the
kernel hands a signal sent to the process to any thread that does not block it,
and CPython runs a Python handler (the SDK's SIGTERM handler, a KeyboardInterrupt)
only on the main thread, at its next bytecode. A SIGTERM that lands on this
thread while the main thread sleeps in a long C call (``time.sleep``, a
collective) would wait for that call to end (docs/run.md, "SDK").

Settings (environment, read at ``traceml.init()``): ``TRACEML_HANG_FLOOR_S``
(default :data:`DEFAULT_FLOOR_S`), ``TRACEML_HANG_FACTOR`` (default
:data:`DEFAULT_FACTOR`), ``TRACEML_HANG_WATCHDOG=0`` turns it off.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import threading
import time
from collections import deque
from statistics import median
from time import perf_counter
from typing import Any, Optional

from traceml_tui.core import records
from traceml_tui.core.signals import shielded
from traceml_tui.core.state import STALL_FLOOR_S, STALL_INTERVALS

#: A step overruns after at least this many seconds … (half the stall floor: the record is written before
#: the status says ``stalled``, so the culprit is named as soon as the run is)
DEFAULT_FLOOR_S = STALL_FLOOR_S / 2
#: … and this many of the rank's median step intervals.
DEFAULT_FACTOR = STALL_INTERVALS / 2
#: Frames kept, innermost first (a DDP backward is ~15 deep below the training script's frame).
MAX_FRAMES = 24
#: Window estimates of the step interval kept for the median.
WINDOWS = 9

FLOOR_ENV = "TRACEML_HANG_FLOOR_S"
FACTOR_ENV = "TRACEML_HANG_FACTOR"
ENABLED_ENV = "TRACEML_HANG_WATCHDOG"

#: Public ``torch.distributed`` functions that wait for every peer of a group (the name a record carries).
COLLECTIVES: frozenset[str] = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_gather_coalesced", "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
    "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list", "reduce", "gather", "gather_object",
    "scatter", "scatter_object_list", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
    "batch_isend_irecv", "wait",
})


def _setting(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 and value == value and value != float("inf") else default


def enabled() -> bool:
    """Whether ranks start a watchdog (``TRACEML_HANG_WATCHDOG=0`` turns it off)."""
    return os.environ.get(ENABLED_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class _Paths:
    """File names a record may carry: relative to the script's folder, else to the import root that holds the
    file (``torch/distributed/distributed_c10d.py``), else the bare name — never an absolute path."""

    def __init__(self) -> None:
        script = sys.argv[0] if sys.argv and sys.argv[0] else ""
        self.script_dir = os.path.dirname(os.path.abspath(script)) if script and script != "-c" else None
        roots = [os.path.abspath(p) for p in sys.path if p]
        self.roots = sorted({r for r in roots if r != self.script_dir}, key=len, reverse=True)
        self.cache: dict[str, str] = {}

    def rel(self, filename: str) -> tuple[str, bool]:
        """(the name a record may carry, whether the file is the user's: under the script's folder)."""
        found = self.cache.get(filename)
        if found is None:
            found = self.cache[filename] = self._rel(filename)
        return found

    def _rel(self, filename: str) -> tuple[str, bool]:
        if not os.path.isabs(filename):
            return (os.path.basename(filename) if os.sep in filename else filename), False  # "<string>", "<frozen …>"
        libraries = [r for r in self.roots if "-packages" in r]
        if self.script_dir and filename.startswith(self.script_dir + os.sep) and not any(
                filename.startswith(r + os.sep) for r in libraries):
            return filename[len(self.script_dir) + 1:].replace(os.sep, "/"), True
        for root in self.roots:
            if filename.startswith(root + os.sep):
                return filename[len(root) + 1:].replace(os.sep, "/"), False
        return os.path.basename(filename), False


_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")


def _call_of(frame: Any) -> Optional[str]:
    """The dotted name of the call a frame is in (``time.sleep``), from its source line; None when unknown.

    Python 3.11+ gives the executing instruction's columns (the call expression itself); before, the first
    call on the line stands in. Only a name is kept, never the line's text (it may hold data).
    """
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno or 0)
    if not line:
        return None
    segment = line
    positions = getattr(code, "co_positions", None)
    if positions is not None:
        try:
            start, end, col, end_col = list(positions())[frame.f_lasti // 2]
            if start == end == frame.f_lineno and col is not None and end_col is not None:
                segment = line.encode("utf-8")[col:end_col].decode("utf-8", "replace")
        except (IndexError, ValueError, TypeError):
            pass
    match = _CALL.search(segment) or _CALL.search(line)
    return match.group(1)[:80] if match else None


def stack_of(frame: Any, paths: Optional[_Paths] = None, limit: int = MAX_FRAMES) -> list[records.Frame]:
    """The frames from ``frame`` outwards (innermost first), at most ``limit``, with relative file names."""
    paths = paths or _Paths()
    out = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        name, user = paths.rel(code.co_filename)
        out.append(records.Frame(file=name, line=int(frame.f_lineno or 0), func=code.co_name,
                                 call=_call_of(frame), user=user))
        frame = frame.f_back
    return out


def collective_of(stack: list[records.Frame]) -> Optional[str]:
    """The ``torch.distributed`` collective the innermost frames are inside (``all_reduce``), or None."""
    for frame in stack:
        if frame.func in COLLECTIVES and frame.file.replace("\\", "/").startswith("torch/distributed/"):
            return frame.func
    return None


def sequence_number() -> Optional[int]:
    """The default process group's collective sequence number (collectives issued so far), or None.

    Read without importing torch: only when the script already initialized a process group.
    """
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        group = dist.distributed_c10d._get_default_group()
        getter = getattr(group, "_get_sequence_number_for_group", None)
        return int(getter()) if getter is not None else None
    except Exception:  # noqa: BLE001 - a backend without sequence numbers: the record says null
        return None


class Watchdog:
    """One rank's hang watchdog over a :class:`traceml_tui.sdk.session.Session` (a daemon thread)."""

    def __init__(self, session: Any, *, floor_s: Optional[float] = None, factor: Optional[float] = None,
                 hang: bool = True) -> None:
        self.session = session
        self.floor_s = floor_s if floor_s is not None else _setting(FLOOR_ENV, DEFAULT_FLOOR_S)
        self.factor = factor if factor is not None else _setting(FACTOR_ENV, DEFAULT_FACTOR)
        self.hang = hang  # False: the thread only writes the window's held step records
        self.target = session.thread  # the thread that traces steps (the one whose stack is recorded)
        self.windows: deque[float] = deque(maxlen=WINDOWS)
        self.fired = 0  # records written (for tests and diagnostics)
        self._stopped = False
        self._wake = threading.Event()  # stop(), or the training thread holding a record while the thread sleeps
        window = getattr(session, "window", None)
        self._window = window if window is not None and window.window_s > 0 else None
        if self._window is not None:
            self._window.wake = self._wake
        self._seen_step, self._seen_at = 0, 0.0
        self._fired_for: Optional[int] = None
        self._thread = threading.Thread(target=self._run, name="traceml-hang-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        # started with the asynchronous signals blocked, so it has them blocked from its first instruction;
        # the caller's own mask is back before this returns
        with shielded():
            self._thread.start()
        return self

    def stop(self) -> None:
        """Wake the thread and let it end (it never writes after this returns and the session closed)."""
        self._stopped = True
        self._wake.set()

    def limit_s(self) -> float:
        """Seconds after the previous step's end at which the step in progress overruns."""
        typical = median(self.windows) if self.windows else 0.0
        return max(self.floor_s, self.factor * typical)

    def _run(self) -> None:
        session, window, wake = self.session, self._window, self._wake
        self._seen_step, self._seen_at = session.next_step, session.prev_end or perf_counter()
        hang_at = perf_counter() + self.floor_s if self.hang else float("inf")
        while True:
            now = perf_counter()
            wait: Optional[float] = hang_at - now
            if window is not None:
                try:
                    look = window.watch(now, session.prev_end)  # writes the held records of a rank gone quiet
                except OSError:  # a full disk: those records are lost, the hang looks go on
                    look = window.window_s
                if look is not None:
                    wait = min(wait, look)  # type: ignore[type-var]
            if wait == float("inf"):
                wait = None  # nothing to do until woken
            if wake.wait(None if wait is None else max(0.0, wait)):
                wake.clear()
            if self._stopped or session.closed:
                return
            if self.hang and perf_counter() >= hang_at:
                hang_at = perf_counter() + self._look()

    def _look(self) -> float:
        """One hang look: record an overrun of the step in progress; seconds until the next look."""
        session = self.session
        now = perf_counter()
        step = session.next_step
        since = session.prev_end  # the end of the newest step (the step clock's own timestamp)
        if step != self._seen_step and since is not None:  # steps completed since the last look: one window
            if self._fired_for is None:  # a window that holds an overrun is not a typical interval
                self.windows.append(max(0.0, since - self._seen_at) / (step - self._seen_step))
            self._seen_step, self._seen_at, self._fired_for = step, since, None
        limit = self.limit_s()
        if since is None:  # no step ended yet: the first one includes start-up (model build, warm-up)
            return limit
        overrun = now - since
        if overrun >= limit and self._fired_for != step:
            self._fired_for = step
            self._record(overrun, limit)
        return limit if self._fired_for is not None else max(0.05, limit - overrun)

    def _record(self, waited_s: float, limit_s: float) -> None:
        session = self.session
        frame = sys._current_frames().get(self.target) if self.target is not None else None
        stack = stack_of(frame) if frame is not None else []
        del frame
        record = records.Hang(
            v=records.RECORD_VERSION, run=session.run_name, rank=session.rank, attempt=session.attempt,
            step=session.last_step, ts=time.time(), waited_s=round(waited_s, 3), limit_s=round(limit_s, 3),
            median_s=round(median(self.windows), 6) if self.windows else None, collective=collective_of(stack),
            seq=sequence_number(), stack=stack)
        if session.write_aside(record):
            self.fired += 1
