"""Property-based tests of every reader of untrusted bytes (``pytest tests/fuzz``; docs/security.md, "Fuzzing").

Each test states a reader's contract — no exception escapes, one error per bad line or file, every valid
line stored once, other runs untouched, valid JSON out — and hypothesis searches for a counter-example.

CI runs the ``ci`` profile: derandomized (a fixed seed, so a red CI run is reproducible), no deadline (a
loaded 2-core machine), and few enough examples that the whole folder stays under a minute. The fast lane
(``-m "not slow ..."``, README "test lanes") runs the ``fast`` profile: the same seed and contracts with a
third of the examples (tests/support/lanes.py chooses). Set ``HYPOTHESIS_PROFILE=long`` for a longer search
before a release; the coverage-guided run is described in docs/security.md.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from support.lanes import hypothesis_profile

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "fast",
    derandomize=True,
    deadline=None,
    max_examples=20,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "long",
    deadline=None,
    max_examples=5000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def pytest_configure(config: pytest.Config) -> None:
    """Load the session's profile before any test module of the folder is imported (``pytest_configure`` is
    called for this conftest as soon as it is loaded, also when that happens during collection)."""
    settings.load_profile(hypothesis_profile(config.getoption("markexpr") or ""))
