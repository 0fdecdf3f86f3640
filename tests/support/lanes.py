"""The lanes of the suite (README, "test lanes"): what keeps the fast lane fast.

The fast lane (``-m "not slow and not faults"``) is the edit-run loop. A test that reads a real training run
(the session's ``real_runs``, tests/support/realruns.py) makes the session build that run, tens of seconds of
two CPU-bound ranks, so such a test belongs in ``slow``; :func:`real_runs_outside_slow` finds those that are not,
and tests/conftest.py refuses the session naming them.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def real_runs_outside_slow(items: Iterable[pytest.Item]) -> list[str]:
    """Node ids of the tests that use the real runs (the ``real_runs`` fixture or a ``realruns`` marker)
    without the ``slow`` marker."""
    return [item.nodeid for item in items
            if ("real_runs" in getattr(item, "fixturenames", ()) or item.get_closest_marker("realruns") is not None)
            and item.get_closest_marker("slow") is None]


def check_lanes(items: Iterable[pytest.Item]) -> None:
    """Refuse the session (one message naming every offender) when a test that uses the real runs is not slow."""
    offenders = real_runs_outside_slow(items)
    if offenders:
        raise pytest.UsageError("tests that use the real runs must be marked @pytest.mark.slow (README, "
                                "\"test lanes\"): " + ", ".join(offenders))
