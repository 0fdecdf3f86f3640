"""The lane chooses how long hypothesis searches (tests/support/lanes.py; README, "test lanes"): the fast lane
runs the ``fast`` profile, the whole suite the ``ci`` one, and ``HYPOTHESIS_PROFILE`` wins over both."""

from __future__ import annotations

import pytest
from hypothesis import settings

from support import lanes


@pytest.mark.parametrize("markexpr,fast", [
    ("not slow and not faults", True),
    ("not slow", True),
    ("faults and not slow", False),
    ("", False),
    ("faults", False),
    ("slow", False),
    ("slow or not slow", False),
    ("not faults", False),
])
def test_a_mark_expression_that_leaves_out_slow_is_the_fast_lane(markexpr, fast, monkeypatch):
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    assert lanes.leaves_out_slow(markexpr) is fast
    assert lanes.hypothesis_profile(markexpr) == ("fast" if fast else "ci")
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "long")
    assert lanes.hypothesis_profile(markexpr) == "long"


def test_this_session_searches_with_its_lanes_profile(request):
    """The profile tests/fuzz/conftest.py loaded for this session is its lane's (on every worker)."""
    chosen = lanes.hypothesis_profile(request.config.getoption("markexpr") or "")
    assert settings.default.max_examples == settings.get_profile(chosen).max_examples
    assert settings.get_profile("fast").max_examples < settings.get_profile("ci").max_examples
    assert settings.get_profile("fast").derandomize and settings.get_profile("ci").derandomize
