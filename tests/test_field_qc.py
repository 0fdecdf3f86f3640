"""Latent field-collapse QC: SDK records, detection at the right QC point, summary flag."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from traceml_tui.core import records
from traceml_tui.hygiene import field_qc
from traceml_tui.summary.build import build_summary
from traceml_tui.summary.text import render_text

# A log-parameterized field whose spread (in log space) shrinks from step 60 on:
# width(step) = 2.0 until 60, then 2.0 * 0.8 ** ((step - 60) / 10). With factor
# 0.1 the spread falls under 0.2 when 0.8 ** k < 0.1, k > 10.3 → first QC point
# (cadence 10) after that is step 60 + 110 = 170; step 160 (ratio 0.107) is not.
SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import traceml_tui as traceml

    traceml.init("collapse", logs_dir=sys.argv[1])
    rng = np.random.default_rng(0)
    base = rng.uniform(-1.0, 1.0, size=4096)
    for step in range(0, 201):
        if step:
            with traceml.trace_step():
                traceml.log(loss=1.0 / step)
        width = 2.0 if step <= 60 else 2.0 * 0.8 ** ((step - 60) / 10)
        field = np.exp(0.5 + base * width / 2.0)          # natural units; log space is uniform
        steady = np.exp(rng.normal(size=4096))             # a healthy field
        traceml.log_field_stats("depth", field, space="log", bounds=(1e-3, 1e3), collapse_factor=0.1, cadence=10)
        traceml.log_field_stats("albedo", np.clip(steady / 10, 0, 1), bounds=(0.0, 1.0), cadence=10)
    traceml.finish()
    """
)


@pytest.fixture(scope="module")
def collapsed_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fieldqc")
    script = root / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(root / "logs")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return root / "logs" / "collapse"


def test_sdk_records_field_stats_at_the_qc_cadence_in_the_fields_own_space(collapsed_run: Path):
    recs = field_qc.load_field_records(collapsed_run)
    depth = sorted((r for r in recs if r.name == "depth"), key=lambda r: r.step)
    assert [r.step for r in depth] == list(range(0, 201, 10))  # initialization, then every 10 updates
    first = depth[0]
    assert first.space == "log" and first.factor == 0.1 and first.count == 4096
    assert (first.q_low, first.q_high, first.lower, first.upper) == (5.0, 95.0, 1e-3, 1e3)
    # log space: the median of exp(0.5 + U(-1, 1)) is ~0.5, the 5..95% spread ~0.9 x 2
    assert first.median == pytest.approx(0.5, abs=0.05)
    assert first.p_high - first.p_low == pytest.approx(1.8, abs=0.05)
    assert first.occupancy == 0.0


def test_collapse_is_flagged_at_the_first_qc_point_under_the_factor_and_not_before(collapsed_run: Path):
    verdict = field_qc.summarize(collapsed_run)
    depth = verdict["fields"]["depth"]
    assert depth["status"] == "failed"
    assert depth["failed_at_step"] == 170
    assert depth["initial_step"] == 0
    assert verdict["fields"]["albedo"]["status"] == "ok"
    assert verdict["status"] == "failed" and verdict["failed_fields"] == ["depth"]

    # the same records cut at step 160 are not (yet) a failure
    early = [r for r in field_qc.load_field_records(collapsed_run) if r.step <= 160]
    assert field_qc.summarize_records(early)["fields"]["depth"]["status"] == "ok"


def test_final_summary_flags_the_collapsed_field(collapsed_run: Path):
    summary = build_summary(collapsed_run, None)
    assert summary["qc"]["failed_fields"] == ["depth"]
    json.dumps(summary, allow_nan=False)  # the section is plain JSON
    summary["text"] = ""
    assert "QC FAILED: field depth collapsed at step 170" in render_text(summary)


def test_bound_occupancy_and_log_space_statistics():
    values = np.array([1e-3] * 30 + [1.0] * 40 + [1e3] * 30)
    stats = field_qc.compute_field_stats(values, space="log", bounds=(1e-3, 1e3))
    assert stats["occupancy"] == pytest.approx(0.6)
    assert stats["median"] == pytest.approx(0.0)
    # non-positive values cannot live in log space: left out, never turned into a number
    stats = field_qc.compute_field_stats([0.0, -1.0, float("nan"), np.e], space="log")
    assert stats["count"] == 1 and stats["median"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="space"):
        field_qc.compute_field_stats([1.0], space="sqrt")


def _rec(step: int, lo: float, hi: float, *, attempt: int = 0) -> records.FieldStats:
    return records.FieldStats(v=1, run="r", rank=0, attempt=attempt, step=step, ts=float(step), name="z",
                              p_low=lo, p_high=hi, median=(lo + hi) / 2, factor=0.5)


def test_a_resumed_step_keeps_the_newest_attempt_and_a_constant_field_has_no_reference():
    recs = [_rec(0, 0.0, 1.0), _rec(10, 0.0, 0.4), _rec(10, 0.0, 0.9, attempt=1), _rec(20, 0.0, 0.8, attempt=1)]
    assert field_qc.summarize_records(recs)["fields"]["z"]["status"] == "ok"
    flat = [_rec(0, 1.0, 1.0), _rec(10, 1.0, 1.0)]
    assert field_qc.summarize_records(flat)["fields"]["z"]["status"] == "no_reference"
    assert field_qc.summarize_records([])["status"] == "not_recorded"
