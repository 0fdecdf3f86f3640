"""The lanes of the suite (README, "test lanes"): what keeps the fast lane fast.

The fast lane (``-m "not slow and not faults"``) is the edit-run loop. A test that reads a real training run
(the session's ``real_runs``, tests/support/realruns.py) makes the session build that run, tens of seconds of
two CPU-bound ranks, so such a test belongs in ``slow``; :func:`real_runs_outside_slow` finds those that are not,
and tests/conftest.py refuses the session naming them.

The fast lane also searches less: hypothesis runs the ``fast`` profile there (fewer examples per property,
tests/fuzz/conftest.py) unless ``HYPOTHESIS_PROFILE`` names another; the whole suite keeps the ``ci`` counts.
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


def leaves_out_slow(markexpr: str) -> bool:
    """Whether a ``-m`` expression keeps an unmarked test and leaves out one marked only ``slow``: the fast
    lane's ``"not slow and not faults"`` does; an empty expression, ``slow`` or ``faults`` does not."""
    from _pytest.mark.expression import Expression

    if not markexpr.strip():
        return False
    expression = Expression.compile(markexpr)
    return expression.evaluate(lambda name, **_: False) and not expression.evaluate(lambda name, **_: name == "slow")


def hypothesis_profile(markexpr: str) -> str:
    """The hypothesis profile of a session (tests/fuzz/conftest.py registers them): ``HYPOTHESIS_PROFILE`` when
    set, else ``fast`` in the fast lane and ``ci`` everywhere else."""
    import os

    chosen = os.environ.get("HYPOTHESIS_PROFILE", "").strip()
    if chosen:
        return chosen
    return "fast" if leaves_out_slow(markexpr) else "ci"


def check_lanes(items: Iterable[pytest.Item]) -> None:
    """Refuse the session (one message naming every offender) when a test that uses the real runs is not slow."""
    offenders = real_runs_outside_slow(items)
    if offenders:
        raise pytest.UsageError("tests that use the real runs must be marked @pytest.mark.slow (README, "
                                "\"test lanes\"): " + ", ".join(offenders))
