"""Who owns a claim, and whether that process still lives (the one I/O edge of the backlog rule).

:func:`probe_owner` answers for an owner on this host by asking the process
table (a reused pid is told apart by its start time); for another host it
answers ``None`` and :func:`traceml_tui.core.state.claim_is_stale` falls back
on the claim's heartbeat and lease.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Optional

#: Tolerance when comparing process start times (psutil rounds them).
START_TIME_SLACK_S = 1.0


def current_owner() -> dict:
    """Identity of this process as a claim owner: host, pid and process start time."""
    import psutil

    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start_time": psutil.Process(pid).create_time()}


def probe_owner(owner: Any) -> Optional[bool]:
    """True/False when ``owner`` runs (or not) on this host; None when it is another host's process.

    An owner that is not a mapping, or names no valid pid on this host, is gone.
    """
    import psutil

    if not isinstance(owner, dict):
        return False
    if owner.get("host") != socket.gethostname():
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        started = process.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    recorded = owner.get("start_time")
    if not isinstance(recorded, (int, float)):
        return True  # cannot tell a reused pid apart: assume alive rather than steal
    return abs(started - float(recorded)) <= START_TIME_SLACK_S
