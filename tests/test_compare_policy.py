"""The CI rule of `traceml compare` (seed 000), table by table, on the pure core.

Every row is a pair of summaries a CI job could meet; the expected result and
reason code are what a pipeline gates on.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from traceml_tui.compare.core import compare_summaries
from traceml_tui.compare.policy import (
    FASTER,
    INCONCLUSIVE,
    REASON_CODES,
    SLOWER,
    WITHIN,
    ThresholdError,
    classify,
    parse_threshold,
)

FIXTURES = Path(__file__).parent / "fixtures" / "summaries"
BASE = json.loads((FIXTURES / "ours" / "base_1.9.json").read_text())
LEGACY = json.loads((FIXTURES / "ours" / "legacy_1.6.json").read_text())


def summary(cpu: float | None = 100.0, gpu: float | None = None, **edits) -> dict:
    """The base summary with the given CPU/GPU Step Time and dotted-path edits.

    An edit value of ``DELETE`` removes the key.
    """
    data = copy.deepcopy(BASE)
    average = data["step_time"]["global"]["average"]
    average["step_time_cpu_ms"] = cpu
    average["step_time_gpu_ms"] = gpu
    if isinstance(cpu, float) and math.isfinite(cpu):
        # Keep the selected-clock phases consistent with the CPU Step Time.
        average.update(step_time_ms=cpu, forward_ms=0.3 * cpu, backward_ms=0.4 * cpu, optimizer_ms=0.1 * cpu)
    for dotted, value in edits.items():
        *parents, leaf = dotted.split("__")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return data


DELETE = object()
PARAMS = "run_context__declaration__workload__parameters"


def params(**changes) -> dict:
    value = dict(BASE["run_context"]["declaration"]["workload"]["parameters"])
    value.update(changes)
    return value


# --- the seed's result table ---------------------------------------------------------

RESULT_TABLE = [
    # (name, reference, candidate, threshold, result, exit code)
    ("within: same speed", summary(100.0), summary(100.0), 5, WITHIN, 0),
    ("within: 3% slower, P=5", summary(100.0), summary(103.0), 5, WITHIN, 0),
    ("within: 3% faster, P=5", summary(100.0), summary(97.0), 5, WITHIN, 0),
    ("faster beyond threshold", summary(100.0), summary(80.0), 5, FASTER, 0),
    ("slower beyond threshold", summary(100.0), summary(120.0), 5, SLOWER, 4),
    ("P=0: any slowdown fails", summary(100.0), summary(100.5), 0, SLOWER, 4),
    ("P=0: equal is within", summary(100.0), summary(100.0), 0, WITHIN, 0),
    ("P=0: any speedup is faster", summary(100.0), summary(99.5), 0, FASTER, 0),
    ("inconclusive: no declaration", summary(run_context__declaration=DELETE), summary(), 5, INCONCLUSIVE, 3),
]


@pytest.mark.parametrize("name,ref,cand,threshold,result,code", RESULT_TABLE, ids=[r[0] for r in RESULT_TABLE])
def test_result_table(name, ref, cand, threshold, result, code):
    got = compare_summaries(ref, cand, threshold)
    assert (got.result, got.exit_code) == (result, code)
    assert got.report["ci"]["result"] == result
    assert got.report["ci"]["exit_code"] == code


# --- the ±P boundary -----------------------------------------------------------------

BOUNDARY = [
    (100.0, 105.0, 5, WITHIN),  # exactly +P
    (100.0, 95.0, 5, WITHIN),  # exactly -P
    (0.3, 0.315, 5, WITHIN),  # +P with float noise: 5.000000000000004 %
    (0.3, 0.285, 5, WITHIN),  # -P with float noise
    (100.0, 105.001, 5, SLOWER),  # just past +P is a real regression
    (100.0, 94.999, 5, FASTER),
    (1.1, 1.155, 5, WITHIN),
]


@pytest.mark.parametrize("ref_ms,cand_ms,threshold,result", BOUNDARY)
def test_threshold_boundary_is_inclusive_up_to_float_noise(ref_ms, cand_ms, threshold, result):
    got = compare_summaries(summary(ref_ms), summary(cand_ms), threshold)
    assert got.result == result, got.report["ci"]


def test_float_noise_case_really_is_over_five_percent_in_floating_point():
    # Guards the premise of the boundary test above: without tolerance this pair would fail.
    assert 100.0 * (0.315 - 0.3) / 0.3 > 5
    assert classify(100.0 * (0.315 - 0.3) / 0.3, 5) == WITHIN


# --- eligibility, in the seed's order -----------------------------------------------

INELIGIBLE = [
    ("declaration missing (ordinary run)", summary(run_context__declaration=DELETE), summary(), "declaration_invalid"),
    ("run_context empty", summary(run_context={}), summary(run_context={}), "declaration_invalid"),
    ("declaration invalid: unknown field", summary(run_context__declaration__extra=1), summary(), "declaration_invalid"),
    (
        "declaration invalid: list parameter",
        summary(**{PARAMS: params(model=["a"])}),
        summary(**{PARAMS: params(model=["a"])}),
        "declaration_invalid",
    ),
    ("declaration invalid: schema 2", summary(run_context__declaration__schema_version=2), summary(), "declaration_invalid"),
    (
        "int vs string parameter",
        summary(**{PARAMS: params(per_rank_batch_size=32)}),
        summary(**{PARAMS: params(per_rank_batch_size="32")}),
        "declaration_mismatch",
    ),
    (
        "int vs float parameter",
        summary(**{PARAMS: params(per_rank_batch_size=32)}),
        summary(**{PARAMS: params(per_rank_batch_size=32.0)}),
        "declaration_mismatch",
    ),
    (
        "different workload name",
        summary(),
        summary(run_context__declaration__workload__name="other"),
        "declaration_mismatch",
    ),
    (
        "different measurement",
        summary(),
        summary(run_context__declaration__measurement__completed_steps=51),
        "declaration_mismatch",
    ),
    (
        "topology missing",
        summary(run_context__execution={"launcher_completion": {"status": "completed"}}),
        summary(),
        "topology_invalid",
    ),
    (
        "world size is not nodes x processes",
        summary(run_context__execution__expected_world_size=3),
        summary(run_context__execution__expected_world_size=3),
        "topology_invalid",
    ),
    ("topology zero nodes", summary(run_context__execution__expected_nodes=0), summary(), "topology_invalid"),
    ("topology boolean", summary(run_context__execution__expected_nodes=True), summary(), "topology_invalid"),
    (
        "different topology",
        summary(),
        summary(run_context__execution__processes_per_node=4, run_context__execution__expected_world_size=4),
        "topology_mismatch",
    ),
    ("reference run failed", summary(run_context__run__status="failed"), summary(), "run_not_completed"),
    ("candidate run status missing", summary(), summary(run_context__run=DELETE), "run_not_completed"),
    (
        "launcher completion absent",
        summary(),
        summary(run_context__execution__launcher_completion=DELETE),
        "launcher_not_completed",
    ),
    (
        "launcher completion incomplete",
        summary(run_context__execution__launcher_completion__status="incomplete"),
        summary(),
        "launcher_not_completed",
    ),
    ("GPU-only vs CPU-only", summary(cpu=None, gpu=90.0), summary(cpu=100.0, gpu=None), "step_time_unavailable"),
    ("no Step Time at all", summary(cpu=None), summary(cpu=None), "step_time_unavailable"),
    ("zero Step Time", summary(0.0), summary(100.0), "step_time_unavailable"),
    ("negative Step Time", summary(100.0), summary(-5.0), "step_time_unavailable"),
    ("NaN Step Time", summary(math.nan), summary(100.0), "step_time_unavailable"),
    ("infinite Step Time", summary(100.0), summary(math.inf), "step_time_unavailable"),
    ("step_time section empty", summary(step_time={}), summary(), "step_time_unavailable"),
    ("change overflows", summary(1e-11), summary(1e300), "step_time_change_unavailable"),
]


@pytest.mark.parametrize("name,ref,cand,code", INELIGIBLE, ids=[r[0] for r in INELIGIBLE])
def test_ineligible_pairs_are_inconclusive_with_a_stable_reason(name, ref, cand, code):
    got = compare_summaries(ref, cand, 5)
    assert got.result == INCONCLUSIVE and got.exit_code == 3
    assert got.reason_code == code
    assert code in REASON_CODES
    # One plain sentence: no newline, ends with a period.
    assert got.reason and "\n" not in got.reason and got.reason.endswith(".")
    assert got.report["ci"]["reason_code"] == code


def test_eligibility_is_checked_in_the_seed_order():
    # Declaration, topology, run status, launcher and Step Time all wrong: the declaration is reported.
    bad = summary(
        0.0,
        run_context__declaration__workload__name="other",
        run_context__execution__expected_nodes=5,
        run_context__run__status="failed",
    )
    assert compare_summaries(summary(), bad, 5).reason_code == "declaration_mismatch"
    bad["run_context"]["declaration"] = copy.deepcopy(BASE["run_context"]["declaration"])
    assert compare_summaries(summary(), bad, 5).reason_code == "topology_invalid"


def test_reordered_parameter_keys_still_match():
    reordered = dict(reversed(list(params().items())))
    assert list(reordered) != list(params())
    got = compare_summaries(summary(**{PARAMS: params()}), summary(103.0, **{PARAMS: reordered}), 5)
    assert got.result == WITHIN


def test_different_step_counts_are_allowed_and_shown():
    got = compare_summaries(summary(), summary(101.0, step_time__global__window__steps_analyzed=20), 5)
    assert got.result == WITHIN
    assert (got.report["ci"]["reference_steps_analyzed"], got.report["ci"]["candidate_steps_analyzed"]) == (50, 20)
    assert any("analyzed step counts differ" in w for w in got.report["warnings"])


def test_reason_names_the_failing_side():
    got = compare_summaries(summary(), summary(run_context__run__status="failed"), 5)
    assert "candidate" in got.reason and "reference summary" not in got.reason


# --- clock selection -----------------------------------------------------------------


def test_gpu_clock_is_preferred_when_both_have_it():
    got = compare_summaries(summary(cpu=100.0, gpu=50.0), summary(cpu=100.0, gpu=60.0), 5)
    assert got.report["ci"]["clock"] == "gpu"
    assert got.result == SLOWER
    assert got.report["ci"]["pct_change"] == pytest.approx(20.0)


def test_cpu_clock_is_used_when_only_one_side_has_gpu():
    got = compare_summaries(summary(cpu=100.0, gpu=50.0), summary(cpu=102.0, gpu=None), 5)
    assert got.report["ci"]["clock"] == "cpu"
    assert got.result == WITHIN


def test_a_measured_zero_on_gpu_selects_gpu_and_is_inconclusive():
    # A numeric zero is a measurement, so GPU is the common clock; it is not positive.
    got = compare_summaries(summary(cpu=100.0, gpu=0.0), summary(cpu=100.0, gpu=10.0), 5)
    assert got.report["ci"]["clock"] == "gpu"
    assert got.reason_code == "step_time_unavailable"


def test_schema_before_1_7_reads_cpu_step_time_from_total_step_ms():
    legacy = copy.deepcopy(LEGACY)
    got = compare_summaries(legacy, summary(110.0), 5)
    assert got.report["ci"]["clock"] == "cpu"
    assert got.report["ci"]["reference_step_time_ms"] == 100.0
    assert got.result == SLOWER
    assert any("schema versions" in w for w in got.report["warnings"])


def test_schema_before_1_7_ignores_new_field_names():
    legacy = copy.deepcopy(LEGACY)
    legacy["step_time"]["global"]["average"]["step_time_cpu_ms"] = 1.0  # not a 1.6 field
    got = compare_summaries(legacy, copy.deepcopy(LEGACY), 5)
    assert got.report["ci"]["reference_step_time_ms"] == 100.0


def test_schema_1_7_does_not_read_total_step_ms():
    data = summary(cpu=None)
    data["step_time"]["global"]["average"]["total_step_ms"] = 100.0
    assert compare_summaries(data, summary(), 5).reason_code == "step_time_unavailable"


# --- exploratory mode and the report -------------------------------------------------


def test_without_threshold_there_is_no_ci_result_and_exit_zero():
    got = compare_summaries(summary(100.0), summary(300.0), None)
    assert got.result is None and got.exit_code == 0
    assert got.report["ci"] is None and got.report["mode"] == "exploratory"
    assert got.report["step_time"]["pct_change"] == pytest.approx(200.0)


def test_exploratory_mode_still_says_why_a_ci_check_would_be_inconclusive():
    got = compare_summaries(summary(), summary(run_context={}), None)
    assert got.exit_code == 0
    assert got.reason_code == "declaration_invalid"
    assert got.report["eligibility"]["eligible"] is False


def test_report_holds_ci_block_and_context():
    got = compare_summaries(summary(100.0), summary(120.0), 5, labels=("ref", "cand"))
    report = got.report
    ci = report["ci"]
    for key in (
        "result",
        "threshold_pct",
        "clock",
        "reference_step_time_ms",
        "candidate_step_time_ms",
        "pct_change",
        "reference_steps_analyzed",
        "candidate_steps_analyzed",
        "reason_code",
        "reason",
    ):
        assert key in ci
    assert ci["threshold_pct"] == 5.0 and ci["pct_change"] == pytest.approx(20.0)
    phases = report["phases"]["rows"]
    assert phases["forward_ms"]["delta"] == pytest.approx(6.0)  # 0.3 x (120 - 100)
    assert phases["input_wait_ms"]["reference"] == 10.0
    assert "residual_ms" in phases and "optimizer_ms" in phases and "backward_ms" in phases
    assert report["memory"] and report["system"]["system.cpu_percent"]["reference"] == 62.5
    assert report["diagnoses"]["primary"]["reference"] == "NO CLEAR BOTTLENECK"
    assert report["reference"]["declaration"]["workload"]["name"] == "ddp-minimal-guard-trial"
    assert report["candidate"]["topology"] == {"nodes": 1, "processes_per_node": 2, "world_size": 2}
    assert report["reference"]["label"] == "ref"
    json.dumps(report, allow_nan=False)  # JSON-ready, finite numbers only


def test_report_stays_json_ready_with_nan_and_inf_inputs():
    got = compare_summaries(summary(math.nan), summary(math.inf), 5)
    json.dumps(got.report, allow_nan=False)


def test_phase_deltas_hidden_when_phase_clocks_differ():
    cand = summary(110.0, step_time__global__window__diagnosis_clock="gpu")
    got = compare_summaries(summary(), cand, 5)
    assert got.report["phases"]["note"]
    assert got.report["phases"]["rows"]["forward_ms"]["reference"] is None


# --- threshold parsing ---------------------------------------------------------------


@pytest.mark.parametrize("text,value", [("5", 5.0), ("0", 0.0), ("2.5", 2.5), ("1e1", 10.0), (" 7 ", 7.0)])
def test_threshold_accepts_finite_non_negative_numbers(text, value):
    assert parse_threshold(text) == value


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-1", "abc", "", "1e999", True])
def test_threshold_refuses_everything_else(text):
    with pytest.raises(ThresholdError):
        parse_threshold(text)


def test_declaration_mismatch_names_the_parameter_and_types():
    got = compare_summaries(
        summary(**{PARAMS: params(per_rank_batch_size=32)}), summary(**{PARAMS: params(per_rank_batch_size="32")}), 5
    )
    assert "'per_rank_batch_size' is 32 (int) vs '32' (str)" in got.reason


def test_extreme_numbers_never_break_the_json_report():
    # json.loads turns 1e400 into inf without any NaN/Infinity literal; the report must stay valid JSON.
    ref = summary(1e308, schema_version=float("inf"), duration_s=1e400)
    ref["system"]["global"]["average"]["cpu_percent"] = -1e308
    cand = summary(1e308)
    cand["system"]["global"]["average"]["cpu_percent"] = 1e308
    got = compare_summaries(ref, cand, 5)
    json.dumps(got.report, allow_nan=False)
    assert got.report["system"]["system.cpu_percent"]["delta"] is None
