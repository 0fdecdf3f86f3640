"""The summary builder over damaged node samples (summary/build.py, summary/load.py; docs/security.md "Fuzzing").

Contract: whatever one line of a node's ``system.jsonl`` holds, the summary is built and written (a bad
line is skipped like any malformed line), and its JSON is valid. One sample's 400-digit ``ram_used`` made
the mean raise OverflowError, and `traceml run` wrote no final summary at all (found by fuzzing).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from traceml_tui.summary.build import build_summary
from traceml_tui.summary.store import write_summary

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "rank-raises"
FIELDS = ("ram_used", "ram_total", "cpu_pct", "ts", "node_rank", "v")
VALUES = st.one_of(
    st.sampled_from([1 << 63, -(1 << 63) - 1, 1 << 64, 10 ** 400, -(10 ** 400), 10 ** 30, -1, 1e308, -1e308, 0.5,
                     True, None, "", "x", [], {}]),
    st.integers(), st.floats(allow_nan=False, allow_infinity=False))


@given(line=st.integers(0, 20), field=st.sampled_from(FIELDS), value=VALUES)
@example(line=6, field="ram_used", value=10 ** 400)
def test_a_damaged_node_sample_never_costs_the_summary(line, field, value):
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(SEED, run)
        path = run / "nodes" / "node_0" / "system.jsonl"
        lines = path.read_text().splitlines()
        sample = json.loads(lines[line % len(lines)])
        sample[field] = "__VALUE__"
        lines[line % len(lines)] = json.dumps(sample).replace('"__VALUE__"', json.dumps(value))
        path.write_text("\n".join(lines) + "\n")
        manifest = json.loads((run / "manifest.json").read_text())
        summary = build_summary(run, manifest)
        write_summary(run, summary)
        json.loads((run / "final_summary.json").read_text())


@given(st.one_of(VALUES, st.text(max_size=8), st.integers(-(10 ** 500), 10 ** 500)))
@example(10 ** 400)
def test_a_decoded_number_reads_as_a_finite_float_or_none(value):
    """``records.finite_or_none`` (the curve's reading of losses, ratios and eval metrics) and
    ``jsonsafe.finite_number`` never raise: an integer beyond a float's range made ``float()`` raise
    OverflowError (found reviewing this round's fuzz fixes)."""
    from traceml_tui.core.jsonsafe import finite_number
    from traceml_tui.core.records import finite_or_none

    for read in (finite_or_none, finite_number):
        number = read(value)
        assert number is None or (isinstance(number, float) and number - number == 0.0)
