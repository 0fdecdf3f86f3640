"""The launcher's learning-curve refresher: re-render ``learning_curve.png`` every N updates while training runs.

Node 0 polls rank 0's step files (a cheap tail read) and renders in a
subprocess (``traceml curve``), so matplotlib never loads into the launcher
(docs/hygiene.md, "The learning curve").

Stopping ends a render still in flight and waits for it: the launcher's final
render supersedes it. The render gets SIGTERM first, on which ``traceml curve``
unwinds through its atomic write (no hidden temp file left in the run folder),
and SIGKILL only if it is still running ``TERM_GRACE_S`` later. A render left running used to outlive the launcher and
write ``learning_curve.png`` after ``traceml run`` had returned — possibly
over the final curve, from step files read before the last steps were written.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Optional

from traceml_tui.core.signals import shielded, unshielded

#: How often the step files are looked at (seconds).
POLL_S = 2.0
#: A render still running after this long is killed (and the next bucket tried later).
RENDER_TIMEOUT_S = 120.0
#: How long a stopped render has to remove its temp file before it is killed outright.
TERM_GRACE_S = 5.0


class CurveRefresher:
    """Runs ``command`` each time rank 0's newest step enters another bucket of ``cadence`` updates.

    ``last_step`` returns rank 0's newest recorded step (0 before any);
    ``warn`` gets one line when a render cannot start.
    """

    def __init__(self, command: Sequence[str], cadence: int, last_step: Callable[[], int],
                 warn: Callable[[str], None], poll_s: float = POLL_S) -> None:
        self.command = list(command)
        self.cadence = cadence
        self.last_step = last_step
        self.warn = warn
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "CurveRefresher":
        """Start polling in a daemon thread (signals blocked there: core/signals.py)."""
        self._thread = threading.Thread(target=self._loop, name="traceml-curve-refresh", daemon=True)
        with shielded():
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop polling, kill a render in flight and wait for the thread (at most ``timeout`` seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        rendered_bucket = -1
        while not self._stop.wait(self.poll_s):
            step = self.last_step()
            bucket = step // self.cadence
            if step >= 1 and bucket != rendered_bucket:
                rendered_bucket = bucket
                self._render_once()

    def _render_once(self) -> None:
        render(self.command, self.warn, stop=self._stop)


def render(command: Sequence[str], warn: Callable[[str], None], timeout_s: float = RENDER_TIMEOUT_S,
           stop: Optional[threading.Event] = None) -> None:
    """Run one render (``traceml curve``) to its end; ended as :func:`_end` ends it when ``stop`` is set or after
    ``timeout_s`` (the launcher's final render too: a SIGKILL left the render's temp file in the run folder)."""
    try:
        with unshielded():  # the render keeps its own signals (a shielded thread blocks them)
            proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    except OSError as exc:
        warn(f"could not render the learning curve: {exc}")
        return
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None:
            if stop is not None and stop.wait(0.05):
                _end(proc)  # stopped: the launcher's final render supersedes this one
                break
            if stop is None:
                try:
                    proc.wait(0.05)
                except subprocess.TimeoutExpired:
                    pass
            if time.monotonic() > deadline:
                _end(proc)
                warn(f"could not render the learning curve: no result within {timeout_s:.0f} s")
                break
    finally:
        proc.wait()


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM (the render cleans up its temp file), then SIGKILL after ``TERM_GRACE_S``."""
    proc.terminate()
    try:
        proc.wait(TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
