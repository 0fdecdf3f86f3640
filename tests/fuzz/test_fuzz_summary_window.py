"""The index's reading of a final summary's step-time rows against damaged summaries (docs/security.md, "Fuzzing").

Start: the committed real runs' ``final_summary.json`` (tests/fixtures/runs) and the summaries of
tests/fixtures/summaries (ours and traceml-ai's). Contract (``core/straggler.py`` ``summary_window``, read by
``daemon/read_runs.py`` for an ended run's figures): reading never raises; what it keeps are rows keyed by a global
rank with a finite step time, spread by the summary's own rule (``rows_spread``) to a finite size; a section that
does not read is None (the run keeps its rolling statistic). An undamaged summary reads back to its own verdict.
"""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from traceml_tui.core import artifacts, straggler

from support.fuzz_mutations import damaged

FIXTURES = Path(__file__).parents[1] / "fixtures"
SUMMARIES = tuple(sorted(FIXTURES.glob("runs/*/final_summary.json"))) + tuple(
    sorted(FIXTURES.glob("summaries/**/*.json")))


def _read(data: bytes):
    return straggler.summary_window(artifacts.decode_step_time(data))


def test_the_committed_summaries_read_back_to_their_own_verdict():
    checked = 0
    for path in SUMMARIES:
        data = path.read_bytes()
        window = _read(data)
        summary = artifacts.decode_summary(data)
        if window is None or summary is None:
            continue
        glob = summary.step_time["global"]
        found = window.spread()
        # the same values (which of two equal ranks a summary written elsewhere called the worst may differ)
        assert (found.worst, found.median) == (glob["worst"]["step_time_ms"]["value"],
                                               glob["median"]["step_time_ms"]["value"])
        issue = next((i for i in summary.step_time.get("issues", []) if i.get("kind") == "STRAGGLER"), None)
        if issue is not None:
            assert found.skew_pct == issue["skew_pct"] and [int(found.worst_key)] == issue["ranks"]
        checked += 1
    assert checked >= 5, checked


@given(data=st.sampled_from(SUMMARIES).flatmap(lambda p: damaged(p.read_bytes())))
def test_a_damaged_summary_reads_as_rank_rows_or_none(data):
    window = _read(data)
    if window is None:
        return
    for key in window.rows:
        assert key.isascii() and key.isdigit() and key == str(int(key))
        value = window.value(int(key))
        assert value is not None and math.isfinite(value)
    found = window.spread()
    assert found is not None and math.isfinite(found.worst) and math.isfinite(found.median)
    assert found.skew_pct is None or math.isfinite(found.skew_pct) or found.median == 0
