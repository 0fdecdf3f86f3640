"""``traceml compare`` against damaged ``final_summary.json`` pairs (docs/security.md, "Fuzzing").

Start: the committed summaries in tests/fixtures/summaries (ours, schema 1.9 and 1.6; traceml-ai's pair).
Each example damages one side of a pair. Contract (docs/compare.md, exit codes): the command exits 0, 3 or 4
with a strict-JSON report on stdout (``--format json``), or exits 1 with exactly one line on stderr that is
a named input error — never a traceback, never an "internal error".
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traceml_tui.compare.cli import main

from support.fuzz_mutations import damaged, strict_json

SUMMARIES = Path(__file__).parents[1] / "fixtures" / "summaries"
PAIRS = (
    (SUMMARIES / "ours" / "base_1.9.json", SUMMARIES / "ours" / "base_1.9.json"),
    (SUMMARIES / "ours" / "legacy_1.6.json", SUMMARIES / "ours" / "base_1.9.json"),
    (SUMMARIES / "traceml_ai" / "tai-reference" / "final_summary.json",
     SUMMARIES / "traceml_ai" / "tai-candidate" / "final_summary.json"),
)
CORPUS = Path(__file__).parent / "corpus" / "compare"


def _check(tmp_path: Path, reference: bytes, candidate: bytes) -> None:
    ref, cand = tmp_path / "ref" / "final_summary.json", tmp_path / "cand" / "final_summary.json"
    for path, data in ((ref, reference), (cand, candidate)):
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(ref), str(cand), "--format", "json", "--max-step-time-regression-pct", "5",
                     "--output", str(tmp_path / "out" / "cmp")])
    if code in (0, 3, 4):
        report = strict_json(out.getvalue())
        assert isinstance(report, dict)
        return
    lines = err.getvalue().strip().splitlines()
    assert code == 1 and len(lines) == 1, (code, err.getvalue())
    assert "internal error" not in lines[0] and "Traceback" not in lines[0], lines[0]


@st.composite
def damaged_pair(draw):
    reference, candidate = (p.read_bytes() for p in draw(st.sampled_from(PAIRS)))
    if draw(st.booleans()):
        return draw(damaged(reference)), candidate
    return reference, draw(damaged(candidate))


@given(pair=damaged_pair())
def test_compare_exits_0_3_4_or_one_line(tmp_path, pair):
    _check(tmp_path, *pair)


@pytest.mark.parametrize("found", sorted(p.name for p in CORPUS.glob("*.json")), ids=str)
def test_compare_corpus(tmp_path, found):
    """Damaged candidates kept as regression inputs, compared against the schema-1.9 reference."""
    _check(tmp_path, PAIRS[0][0].read_bytes(), (CORPUS / found).read_bytes())
