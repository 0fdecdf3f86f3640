"""The lanes of the suite (README, "test lanes"): what keeps the fast lane fast.

The fast lane (``-m "not slow and not faults"``) is the edit-run loop. A test that reads a real training run
(the session's ``real_runs``, tests/support/realruns.py) makes the session build that run, tens of seconds of
two CPU-bound ranks, so such a test belongs in ``slow``; :func:`real_runs_outside_slow` finds those that are not,
and tests/conftest.py refuses the session naming them.

The fast lane also searches less: hypothesis runs the ``fast`` profile there (fewer examples per property,
tests/fuzz/conftest.py) unless ``HYPOTHESIS_PROFILE`` names another; the whole suite keeps the ``ci`` counts.
A property test outside tests/fuzz that sets its own count scales it the same way with :func:`examples`.

Every worker collects every test module, the ones the lane deselects too, so a module that imports an optional
package at its top pays that import once per worker: torch is 2.5 s of CPU, trackio 1 s. A module that only
needs the package to be installed says so with :func:`needs` (checked without importing it), and the tests that
import torch in the test process share one worker (:data:`IMPORTS_TORCH`), so one worker pays for it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

import pytest

#: The ``xdist_group`` of the tests that import torch in the test process (not only in a script they run):
#: ``--dist loadgroup`` gives them one worker, the only one that imports torch (README, "test lanes").
IMPORTS_TORCH = pytest.mark.xdist_group("imports-torch")


#: Examples per property in each hypothesis profile, as a share of the whole suite's (``ci``) count.
PROFILE_SHARE = {"ci": 1.0, "fast": 1 / 3, "long": 10.0}
#: The session's profile, set by tests/conftest.py's ``pytest_configure`` before any test module is imported.
session_profile = "ci"


def examples(ci_count: int) -> int:
    """A property test's ``max_examples``: ``ci_count`` in the whole suite, a third in the fast lane (at least 10),
    ten times as many under ``HYPOTHESIS_PROFILE=long``; the same examples first in every lane (derandomized)."""
    share = PROFILE_SHARE.get(session_profile, 1.0)
    return max(10, round(ci_count * share)) if share < 1 else round(ci_count * share)


def needs(package: str, reason: str = "") -> pytest.MarkDecorator:
    """Skip the marked tests when ``package`` is not installed, found without importing it (unlike
    ``pytest.importorskip`` at a module's top, which imports it while the module is collected)."""
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=reason or f"{package} is not installed")


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
