"""Threads that leave signals to the main thread.

The kernel hands a signal sent to a process to any of its threads that does
not block it, and when the main thread cannot take it at that moment (the
process is stopped, or a signal is already pending on it) it goes to another.
CPython runs a Python handler only on the main thread, at its next bytecode: a
SIGTERM that lands on a helper thread while the main thread waits in a long C
call (``time.sleep``, ``waitpid``, a collective) waits for that call to end. A
job scheduler that suspends a job and then cancels it (SIGSTOP, SIGTERM,
SIGCONT) did exactly that to a rank and to ``traceml run`` (docs/run.md,
"Signals"). So every thread traceml starts is started with the asynchronous
signals blocked (:func:`shielded`), and inherits that mask from its first
instruction. A process started from such a thread would inherit the blocked
mask through ``exec`` (and sleep through its own SIGTERM): start it inside
:func:`unshielded`.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

#: Signals raised by the faulting thread itself (a bad access, an abort): never blocked, or a fault in a
#: helper thread would kill the process before faulthandler or a handler saw it.
SYNCHRONOUS_SIGNALS: frozenset[int] = frozenset(
    getattr(signal, name) for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGTRAP", "SIGSYS")
    if hasattr(signal, name))


def block_async_signals() -> Optional[set[int]]:
    """Block, in the calling thread, every signal that is not a synchronous fault; the mask before (or None).

    A thread started while they are blocked inherits the mask: a signal sent to
    the process then never lands on it, but on a thread that can act on it.
    Where ``pthread_sigmask`` does not exist (Windows) nothing is done.
    """
    if not hasattr(signal, "pthread_sigmask"):
        return None
    try:
        return set(signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.valid_signals()) - SYNCHRONOUS_SIGNALS))
    except (OSError, ValueError):  # a platform refusing part of the set: the thread runs unshielded
        return None


def unblock_async_signals() -> None:
    """Unblock, in the calling thread, the signals :func:`block_async_signals` blocks: the first thing a worker
    process started from a shielded thread does (a pool's ``initializer``), so that it keeps its SIGTERM."""
    if hasattr(signal, "pthread_sigmask"):
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, set(signal.valid_signals()) - SYNCHRONOUS_SIGNALS)
        except (OSError, ValueError):
            pass


def restore_signals(mask: Optional[set[int]]) -> None:
    """Put back the mask :func:`block_async_signals` returned (a signal that arrived meanwhile is delivered now)."""
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextmanager
def shielded() -> Iterator[None]:
    """Threads started inside the block leave every asynchronous signal to the main thread; the caller's own
    mask is back when the block ends (a signal that arrived meanwhile is delivered then)."""
    mask = block_async_signals()
    try:
        yield
    finally:
        restore_signals(mask)


@contextmanager
def unshielded() -> Iterator[None]:
    """A process started inside the block starts with the asynchronous signals unblocked, also when the calling
    thread was started :func:`shielded` (a child inherits its starting thread's mask, and keeps it through
    ``exec``: a drainer started by the launcher's dispatch thread ignored SIGTERM until it unblocked it). The
    thread's own mask is back when the block ends."""
    old: Optional[set[int]] = None
    if hasattr(signal, "pthread_sigmask"):
        try:
            old = set(signal.pthread_sigmask(signal.SIG_UNBLOCK, set(signal.valid_signals()) - SYNCHRONOUS_SIGNALS))
        except (OSError, ValueError):
            old = None
    try:
        yield
    finally:
        restore_signals(old)


def exit_on_sigterm() -> None:
    """In the main thread: SIGTERM raises ``SystemExit(143)`` instead of ending the process where it stands.

    For short commands that write side files: the exit unwinds through
    ``core.atomic``'s cleanup, so a stopped write leaves neither a partial file
    nor its hidden temp file behind (the launcher stops a learning-curve render
    this way when training ends: run/curve_refresh.py).
    """

    def _exit(signum, frame):  # noqa: ARG001 - the signal module's handler signature
        raise SystemExit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, _exit)
