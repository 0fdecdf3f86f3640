"""Waiting for something a real process does (tests never assert how long it took)."""

from __future__ import annotations

import time
from typing import Callable


def until(predicate: Callable[[], object], timeout: float = 60.0, interval: float = 0.05) -> bool:
    """Whether ``predicate()`` became true within ``timeout`` seconds (asked every ``interval``, once more at the
    end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
