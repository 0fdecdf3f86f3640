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

import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from traceml_tui.core import atomic
from traceml_tui.core import lease as core_lease
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


__all__ = ["LeaseKeeper"]


def _read(path: Path) -> Optional[bytes]:
    try:
        with open(path, "rb") as handle:
            return handle.read(core_lease.MAX_LEASE_BYTES + 1)
    except OSError:
        return None


def still_beating(path: Path, say: Callable[[str], None]) -> bool:
    """Whether the launcher that keeps the lease at ``path`` is still running (``traceml run --resume`` refuses
    then: two launchers would train into one run folder, docs/run.md "Resume").

    A lease that is missing, unreadable, ``done``, or not changed for twice its length is not beating. One changed
    more recently (a launch killed moments ago, or one still running) is watched for up to two beat intervals
    (5–10 s at the default 30 s lease; ``say`` tells the user why it waits): a new beat means it is running.
    Only the lease's own bytes decide, as for the daemon (core/lease.py); the file's age only spares the wait for
    a lease left long ago.
    """
    data = _read(path)
    beat = core_lease.decode(data) if data is not None else None
    if beat is None or beat.done:
        return False
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return False
    if age > 2 * beat.lease_s:
        return False
    wait = 2 * core_lease.beat_interval_s(beat.lease_s)
    say(f"its launcher's lease changed {max(0.0, age):.0f} s ago; watching it for up to {wait:.0f} s to see "
        "whether that launch still runs")
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        time.sleep(min(0.1, wait / 20))
        now = _read(path)
        if now is not None and now != data:
            later = core_lease.decode(now)
            return later is not None and not later.done
    return False
