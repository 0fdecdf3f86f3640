"""The launcher's side of the launcher lease: a thread that beats until the launcher has said its final word.

What a beat is and how readers judge it is in :mod:`traceml_tui.core.lease`
(docs/run.md, "Launcher lease"). The launcher starts its :class:`LeaseKeeper`
as soon as its run folder is prepared (node 0: right after the manifest), so a
launcher killed before any rank wrote a record still leaves a lease that
expires; it calls :meth:`LeaseKeeper.finish` after its final word (node 0: the
manifest and summary; node k: its outcome), which writes the ``done`` beat.

A beat that cannot be written (a full disk, a vanished folder) is said once on
stderr and tried again at the next beat; it never stops the launcher.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from traceml_tui.core import atomic
from traceml_tui.core import lease as core_lease
from traceml_tui.core.regular_file import read_regular
from traceml_tui.core.signals import shielded


def _warn(message: str) -> None:
    print(f"traceml run: warning: {message}", file=sys.stderr, flush=True)


class LeaseKeeper:
    """Beats ``path`` (one node's ``launcher.lease``) every ``lease_s / BEATS_PER_LEASE`` seconds."""

    def __init__(self, path: Path, node: int, lease_s: float = core_lease.DEFAULT_LEASE_S,
                 warn: Callable[[str], None] = _warn) -> None:
        self.path = Path(path)
        self.node = int(node)
        self.lease_s = float(lease_s)
        self.interval_s = core_lease.beat_interval_s(self.lease_s)
        self.launch = core_lease.new_launch_token()
        self.beats = 0
        self._warn = warn
        self._warned = False
        self._lock = threading.Lock()  # one writer of the file at a time; none after finish()
        self._stop = threading.Event()
        self._finished = False
        self._thread: Optional[threading.Thread] = None

    def _write(self, done: bool = False) -> None:
        data = core_lease.encode(node=self.node, launch=self.launch, beat=self.beats, lease_s=self.lease_s,
                                 done=done)
        try:
            atomic.atomic_write_bytes(self.path, data)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                self._warn(f"could not write the launcher lease {self.path.name}: {exc.strerror or exc}")
            return
        self.beats += 1

    def start(self) -> "LeaseKeeper":
        """Write the first beat now and keep beating in a background thread."""
        with self._lock:
            self._write()
        self._thread = threading.Thread(target=self._loop, name="traceml-launcher-lease", daemon=True)
        with shielded():  # (core/signals.py: a signal sent to the launcher goes to the main thread)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                if self._finished:
                    return
                self._write()

    def finish(self) -> None:
        """Stop beating and write the ``done`` beat: this launcher has said its final word. Idempotent."""
        self._stop.set()
        with self._lock:
            if self._finished:
                return
            self._finished = True
            self._write(done=True)
        if self._thread is not None:
            self._thread.join(timeout=5.0)


__all__ = ["LeaseKeeper", "still_beating"]


def _read(path: Path) -> Optional[bytes]:
    """The lease file's bytes (None: missing, unreadable, not a regular file, too large: a FIFO is never waited on)."""
    try:
        return read_regular(path, core_lease.MAX_LEASE_BYTES)
    except OSError:
        return None


def _folder_clock(folder: Path) -> Optional[float]:
    """Now by the clock that stamps files in ``folder`` (the file server's, on a shared filesystem): the
    modification time of a file made there now. The lease's own mtime is compared with this, never with this
    machine's clock (clocks of different nodes need not agree: core/lease.py)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".clock.", dir=folder)
    except OSError:
        return None
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        try:
            os.unlink(name)
        except OSError:
            pass


def still_beating(path: Path, say: Callable[[str], None]) -> bool:
    """Whether the launcher that keeps the lease at ``path`` is still running (``traceml run --resume`` refuses
    then: two launchers would train into one run folder, docs/run.md "Resume").

    The daemon's rule (core/lease.py): a lease not seen to change for its length has expired. A lease that is
    missing, unreadable, ``done``, or last changed a lease length ago or more (by the clock of its own folder:
    :func:`_folder_clock`) is not beating. One changed more recently is watched until it has gone a lease
    length without a change (``say`` tells the user why it waits): a new beat means the launch is running.
    """
    data = _read(path)
    beat = core_lease.decode(data) if data is not None else None
    if beat is None or beat.done:
        return False
    try:
        changed = path.stat().st_mtime
    except OSError:
        return False
    now = _folder_clock(path.parent)
    age = max(0.0, (now if now is not None else time.time()) - changed)
    if age >= beat.lease_s:
        return False
    wait = beat.lease_s - age
    say(f"its launcher's lease changed {age:.0f} s ago; watching it for up to {wait:.0f} s (its lease of "
        f"{beat.lease_s:g} s) to see whether that launch still runs")
    deadline = time.monotonic() + wait
    step = min(0.25, core_lease.beat_interval_s(beat.lease_s) / 4)
    while time.monotonic() < deadline:
        time.sleep(step)
        later = _read(path)
        if later is not None and later != data:
            decoded = core_lease.decode(later)
            return decoded is not None and not decoded.done
    return False
