"""A child dies with its parent: the Linux parent-death signal, set without ``preexec_fn``.

``traceml run`` starts training (the script, or ``torch.distributed.run``) and
``traceml validate drain`` starts validation workers. If the parent is killed
outright (SIGKILL, the OOM killer), nothing forwards a signal and the child
runs on as an orphan. ``prctl(PR_SET_PDEATHSIG, sig)`` asks the kernel to send
``sig`` to the child when its parent goes away.

``preexec_fn`` would set it between fork and exec, but it is unsafe in a
process with threads (the launcher runs a sampler and tee threads). Instead
:func:`wrap` prefixes the command with a tiny interpreter that sets the
signal on itself, checks that its parent is still the one that started it
(else the parent already died and it exits), then ``exec``\\ s the real
command: the signal survives ``exec``, and the pid, process group and
session stay the real command's.

The signal fires when the *thread* that started the child exits, so start
children from a thread that outlives them (the launcher's main thread, the
drainer's loop, both of which wait for the child). On other systems (or if
``prctl`` is unavailable) everything here is a no-op and never fails.

It lives in ``core`` (not ``run/``) because three floors start or are started
processes that must die with their parent: the launcher (``run/``), the
validation drainer (``hygiene/``) and a rank under torchrun (``sdk``). It is
stdlib only, Textual- and torch-free and imports no other part of traceml,
which is ``core``'s rule (docs/contracts.md, "arrows"), so each of them
can import it without an arrow running back up the floors.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1

# Run as ``python -I -S -c _WRAPPER <parent pid> <signal> <command...>``: stdlib only, no site.
_WRAPPER = (
    "import os, sys\n"
    "parent, sig = int(sys.argv[1]), int(sys.argv[2])\n"
    "try:\n"
    "    import ctypes\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0)\n"
    "except Exception:\n"
    "    pass\n"
    "if os.getppid() != parent:\n"
    "    os._exit(128 + sig)\n"  # the parent died before the signal was armed: do not start orphaned
    "try:\n"
    "    os.execvp(sys.argv[3], sys.argv[3:])\n"
    "except OSError as exc:\n"
    "    sys.stderr.write(f'cannot start {sys.argv[3]}: {exc.strerror or exc}\\n')\n"
    "    os._exit(127)\n"
)


def supported() -> bool:
    """Whether this system has a parent-death signal (Linux)."""
    return sys.platform.startswith("linux")


def wrap(argv: list[str], signum: int = signal.SIGTERM) -> list[str]:
    """``argv`` run so that it receives ``signum`` when this process (its parent) dies.

    On systems without a parent-death signal ``argv`` is returned unchanged.
    """
    if not supported():
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _WRAPPER, str(os.getpid()), str(int(signum)), *argv]


def set_parent_death_signal(signum: int = signal.SIGTERM) -> bool:
    """Ask for ``signum`` when this process's parent dies; True when armed. Never raises.

    If the parent already died before the signal was armed (this process was
    reparented meanwhile), the signal is delivered now, as it would have been.
    """
    if not supported():
        return False
    parent = os.getppid()
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            return False
    except Exception:  # noqa: BLE001 - no libc prctl: nothing to arm, nothing to break
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), int(signum))
    return True


__all__ = ["PR_SET_PDEATHSIG", "set_parent_death_signal", "supported", "wrap"]
