"""The one step-time decomposition (core/steptime.py) and the surfaces that use it.

Property tests run over seeded random step records (hypothesis is not a
dependency): no part is negative, the parts sum to the whole, every share is
within 100 %, on single steps, on averages and on whole built summaries; and
the Step Time that decides compare verdicts keeps its meaning
(input wait + traced step, the first step of an attempt counting its traced time).
"""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path

import pytest

from traceml_tui.compare.core import compare_summaries
from traceml_tui.core import records, steptime
from traceml_tui.core.rundir import RunDir
from traceml_tui.summary import build
from traceml_tui.summary.text import render_text

FIXTURES = Path(__file__).parent / "fixtures" / "summaries"
REL = 1e-9


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-9)


def _value(rng: random.Random, scale: float):
    """A timing as writers (and broken writers) produce it: usually a positive ms value."""
    roll = rng.random()
    if roll < 0.15:
        return None
    if roll < 0.18:
        return rng.choice([-rng.random() * scale, 0.0, math.nan, math.inf, -math.inf])
    if roll < 0.2:
        return scale * rng.uniform(1, 50)  # far beyond its envelope (clock jitter, overlapping events)
    return rng.expovariate(1.0 / scale)


def random_phases(rng: random.Random) -> records.Phases:
    traced = rng.choice([None, 0.0, rng.expovariate(1 / 20.0), rng.expovariate(1 / 0.05), rng.uniform(1, 1e4)])
    return records.Phases(
        step=traced,
        input_wait=_value(rng, 50.0),
        h2d=_value(rng, 2.0),
        forward=_value(rng, 5.0),
        backward=_value(rng, 10.0),
        optimizer=_value(rng, 1.0),
        data_wait=_value(rng, 60.0),
        data_in_step=_value(rng, 1.0),
    )


def _clean(value):
    if value is None or not math.isfinite(value):
        return None
    return max(0.0, value)


def check_parts(parts: steptime.StepParts, phases: records.Phases) -> None:
    values = parts.parts()
    assert len(values) == len(steptime.PART_NAMES)
    assert all(v >= 0.0 and math.isfinite(v) for v in values), parts
    assert _close(math.fsum(values), parts.whole), (parts, math.fsum(values))
    traced, gap = _clean(phases.step), _clean(phases.input_wait)
    # the whole is what throughput and compare see: the gap since the previous end + the traced step
    assert parts.whole == traced + (gap or 0.0)
    assert parts.gap_known is (gap is not None)
    assert _close(parts.input_wait, gap or 0.0)
    for name in steptime.PART_NAMES:
        assert parts.value(name) <= parts.whole * (1 + REL) + 1e-12
        if name not in parts.measured:
            assert parts.value(name) == 0.0
    if gap is None:
        assert parts.between_steps == 0.0
    else:
        # the gap splits into loader wait and the rest; the loader wait never exceeds it
        in_gap = min(_clean(phases.data_wait) or 0.0, gap)
        assert _close(parts.between_steps, gap - in_gap)


def test_property_every_random_step_splits_into_non_negative_parts_summing_to_the_whole() -> None:
    rng = random.Random(20240917)
    seen = 0
    for _ in range(50_000):
        phases = random_phases(rng)
        parts = steptime.step_parts(phases)
        if _clean(phases.step) is None:
            assert parts is None
            continue
        seen += 1
        check_parts(parts, phases)
    assert seen > 35_000


def test_property_averages_over_the_same_steps_sum_and_share_within_100_pct() -> None:
    rng = random.Random(7)
    for _ in range(2_000):
        items = [steptime.step_parts(random_phases(rng)) for _ in range(rng.randint(1, 40))]
        avg = steptime.average_parts(items)
        present = [p for p in items if p is not None]
        if not present:
            assert avg is None
            continue
        assert avg.steps == len(present)
        assert _close(avg.whole, math.fsum(p.whole for p in present) / len(present))
        measured = [v for v in avg.parts.values() if v is not None]
        assert _close(math.fsum(measured), avg.whole)
        for name in steptime.PART_NAMES:
            value, share = avg.parts[name], avg.shares[name]
            ever = any(name in p.measured for p in present)
            assert (value is None) is (not ever)  # never a fabricated 0 for a part nobody measured
            if value is not None:
                assert value >= 0.0
            if share is not None:
                assert 0.0 <= share <= 100.0
        known = [s for s in avg.shares.values() if s is not None]
        if avg.whole > 0:
            assert math.fsum(known) == pytest.approx(100.0, rel=1e-9)


def test_first_step_of_an_attempt_counts_its_traced_time_only() -> None:
    first = steptime.step_parts(records.Phases(step=2.0, input_wait=None, data_wait=80.0, forward=1.0))
    assert first.whole == 2.0 and first.between_steps == 0.0 and first.data_wait == 0.0
    assert not first.gap_known and "between_steps" not in first.measured
    assert first.residual == 1.0
    # a loader wait inside its traced step still counts
    inside = steptime.step_parts(records.Phases(step=2.0, data_in_step=0.5))
    assert inside.data_wait == 0.5 and inside.residual == 1.5 and "data_wait" in inside.measured


def test_gap_without_loader_is_between_steps_and_loader_wait_is_capped_at_the_gap() -> None:
    parts = steptime.split_step(1.0, 200.0)
    assert (parts.whole, parts.between_steps, parts.data_wait) == (201.0, 200.0, 0.0)
    assert "data_wait" not in parts.measured and parts.residual == 1.0
    capped = steptime.split_step(1.0, 10.0, data_wait=12.0)  # e.g. a CPU wait on the GPU clock
    assert (capped.data_wait, capped.between_steps, capped.whole) == (10.0, 0.0, 11.0)


def test_inner_phases_beyond_the_envelope_are_scaled_to_fit() -> None:
    parts = steptime.split_step(10.0, 0.0, forward=8.0, backward=8.0, optimizer=4.0)
    assert parts.residual == 0.0
    assert parts.forward == pytest.approx(4.0) and parts.backward == pytest.approx(4.0)
    assert parts.optimizer == pytest.approx(2.0)
    assert math.fsum(parts.parts()) == pytest.approx(10.0)


def test_part_names_and_labels_are_one_ordered_tuple() -> None:
    assert steptime.PARTS == (
        ("data_wait", "Data wait"), ("between_steps", "Between steps"), ("h2d", "H2D"), ("forward", "Forward"),
        ("backward", "Backward"), ("optimizer", "Optimizer"), ("residual", "Residual"),
    )
    assert steptime.metric_name("between_steps") == "between_steps_ms"
    assert list(steptime.StepParts._fields[2:9]) == list(steptime.PART_NAMES)


def test_records_carry_the_loader_fields_and_old_records_still_decode() -> None:
    old = b'{"kind":"step","v":1,"run":"r","rank":0,"attempt":0,"step":2,"ts":1.0,' \
          b'"cpu_ms":{"step":1.5,"input_wait":3.0,"h2d":null,"forward":null,"backward":null,"optimizer":null}}'
    record = records.decode(old)
    assert record.cpu_ms.data_wait is None and record.cpu_ms.data_in_step is None
    assert steptime.step_parts(record.cpu_ms).between_steps == 3.0
    new = records.Step(v=1, run="r", rank=0, attempt=0, step=2, ts=1.0,
                       cpu_ms=records.Phases(step=1.0, input_wait=3.0, data_wait=2.5, data_in_step=0.25))
    line = records.encode(new)
    assert b'"data_wait":2.5' in line and b'"data_in_step":0.25' in line
    assert records.decode(line) == new
    # a newer writer's unknown keys are kept out of the way
    assert records.decode(old.replace(b'"h2d":null', b'"h2d":null,"later":1')).cpu_ms.input_wait == 3.0


# -- the summary ----------------------------------------------------------------------------------
def _write_run(root: Path, name: str, rng: random.Random, *, ranks: int = 2, steps: int = 30,
               attempts: int = 1, gpu: bool = False) -> Path:
    run_dir = root / name
    per_attempt = max(1, steps // attempts)
    for rank in range(ranks):
        step = 0
        for attempt in range(attempts):
            path = RunDir(run_dir).steps_file(rank, attempt)
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = [records.encode(records.Header(v=1, run=name, rank=rank, attempt=attempt, uuid=f"{name}{rank}{attempt}",
                                                   ts=0.0))]
            count = per_attempt if attempt < attempts - 1 else steps - step
            for i in range(count):
                step += 1
                cpu = random_phases(rng)
                cpu.step = rng.uniform(0.5, 50.0)  # the SDK always times the envelope
                if cpu.input_wait is not None and cpu.input_wait < 0:
                    cpu.input_wait = -cpu.input_wait  # monotonic clocks: the SDK never writes a negative gap
                if i == 0:
                    cpu.input_wait = cpu.data_wait = None  # an attempt's first step
                gpu_phases = None
                if gpu:
                    gpu_phases = random_phases(rng)
                    gpu_phases.step = rng.uniform(0.5, 50.0)
                    if gpu_phases.input_wait is not None and gpu_phases.input_wait < 0:
                        gpu_phases.input_wait = -gpu_phases.input_wait
                    if i == 0:
                        gpu_phases.input_wait = None
                lines.append(records.encode(records.Step(v=1, run=name, rank=rank, attempt=attempt, step=step,
                                                         ts=1000.0 + step, cpu_ms=cpu, gpu_ms=gpu_phases)))
            path.write_bytes(b"".join(lines))
    return run_dir


def _legacy_step_time(run_dir: Path, clock: str) -> float:
    """Step Time as the summary computed it before the decomposition moved to the core."""
    from traceml_tui.summary.load import load_ranks

    per_rank = []
    for series in load_ranks(run_dir).values():
        values = []
        for record in series.steps.values():
            phases = record.gpu_ms if clock == "gpu" else record.cpu_ms
            wait = phases.input_wait
            values.append(phases.step + (wait if wait is not None and math.isfinite(wait) else 0.0))
        per_rank.append(sum(values) / len(values))
    return sum(per_rank) / len(per_rank)


@pytest.mark.parametrize("seed", range(12))
def test_property_built_summaries_parts_sum_to_step_time_and_step_time_keeps_its_meaning(tmp_path, seed) -> None:
    rng = random.Random(seed)
    gpu = seed % 3 == 0
    run_dir = _write_run(tmp_path, f"run{seed}", rng, ranks=rng.randint(1, 3), steps=rng.randint(1, 40),
                         attempts=rng.randint(1, 3), gpu=gpu)
    summary = build.build_summary(run_dir, {"run_name": f"run{seed}", "status": "completed"})
    json.dumps(summary, allow_nan=False)
    section = summary["step_time"]
    clock = section["global"]["window"]["diagnosis_clock"]
    assert clock == ("gpu" if gpu else "cpu")
    part_metrics = [steptime.metric_name(name) for name in steptime.PART_NAMES]
    rows = [row["metrics"] for row in section["groups"]["rows"].values()] + [section["global"]["average"]]
    for metrics in rows:
        whole = metrics["step_time_ms"]
        present = [metrics[m] for m in part_metrics if metrics[m] is not None]
        assert all(v >= 0 for v in present)
        assert math.fsum(present) == pytest.approx(whole, rel=1e-9)
        assert metrics["input_wait_ms"] == pytest.approx(whole - metrics["traced_step_time_ms"], rel=1e-9, abs=1e-9)
    # the figure compare judges: input wait + traced step, as before
    assert section["global"]["average"]["step_time_cpu_ms"] == pytest.approx(_legacy_step_time(run_dir, "cpu"), rel=1e-12)
    if gpu:
        assert section["global"]["average"]["step_time_gpu_ms"] == pytest.approx(_legacy_step_time(run_dir, "gpu"), rel=1e-12)
    shares = [row["share_pct"] for row in section["breakdown"]["parts"] if row["share_pct"] is not None]
    assert all(0.0 <= s <= 100.0 for s in shares)
    assert math.fsum(shares) == pytest.approx(100.0, rel=1e-9)
    for issue in section["issues"]:
        for share in issue["evidence"].get("shares_pct", {}).values():
            assert share is None or 0.0 <= share <= 100.0
    text = render_text(dict(summary, text=""))
    for _, label in steptime.PARTS:
        assert f"  {label}" in text


def _phases_run(tmp_path: Path, name: str, **phases) -> dict:
    run_dir = tmp_path / name
    path = run_dir / "ranks" / "rank_0" / "steps-0.jsonl"
    path.parent.mkdir(parents=True)
    lines = [records.encode(records.Header(v=1, run=name, rank=0, attempt=0, uuid=name, ts=0.0))]
    for step in range(1, 21):
        values = dict(phases)
        if step == 1:
            values["input_wait"] = values["data_wait"] = None
        lines.append(records.encode(records.Step(v=1, run=name, rank=0, attempt=0, step=step, ts=float(step),
                                                 cpu_ms=records.Phases(**values))))
    path.write_bytes(b"".join(lines))
    return build.build_summary(run_dir, {"run_name": name, "status": "completed"})


def test_gap_without_a_loader_is_between_steps_not_input_bound(tmp_path) -> None:
    summary = _phases_run(tmp_path, "sleepy", step=1.0, input_wait=200.0, forward=0.3, backward=0.3, optimizer=0.2)
    diagnosis = summary["step_time"]["diagnosis"]
    assert diagnosis["status"] == "BETWEEN-STEPS"
    assert "INPUT_BOUND" not in {i["kind"] for i in summary["step_time"]["issues"]}
    assert "checkpointing, logging or evaluation" in diagnosis["summary"]
    assert "off the step path" in diagnosis["action"] and "trace it" in diagnosis["action"]
    assert diagnosis["evidence"]["shares_pct"]["between_steps"] == pytest.approx(diagnosis["share_pct"])
    average = summary["step_time"]["global"]["average"]
    assert average["data_wait_ms"] is None and average["dataloader_fetch_cpu_ms"] is None
    assert average["between_steps_ms"] == pytest.approx(200.0 * 19 / 20)
    text = render_text(summary)
    assert "Verdict: BETWEEN-STEPS" in text and "data wait not measured" in text
    assert "1 of 20 steps began an attempt" in text


def test_data_wait_decides_input_bound(tmp_path) -> None:
    summary = _phases_run(tmp_path, "loader", step=1.0, input_wait=81.0, data_wait=80.0, forward=0.5)
    diagnosis = summary["step_time"]["diagnosis"]
    assert diagnosis["status"] == "INPUT-BOUND" and diagnosis["metric"] == "data_wait_ms"
    assert "Data wait is" in diagnosis["summary"] and "num_workers" in diagnosis["action"]
    average = summary["step_time"]["global"]["average"]
    assert average["data_wait_ms"] == pytest.approx(80.0 * 19 / 20)
    assert average["dataloader_fetch_cpu_ms"] == average["data_wait_ms"]
    assert [i["kind"] for i in summary["step_time"]["issues"]] == ["INPUT_BOUND"]


def test_both_bottlenecks_are_named_largest_share_first(tmp_path) -> None:
    summary = _phases_run(tmp_path, "both", step=1.0, input_wait=100.0, data_wait=30.0)
    assert [i["kind"] for i in summary["step_time"]["issues"]] == ["BETWEEN_STEPS", "INPUT_BOUND"]


def test_compute_bound_and_balanced_still_apply(tmp_path) -> None:
    compute = _phases_run(tmp_path, "compute", step=10.0, input_wait=0.1, forward=3.0, backward=5.0, optimizer=1.0)
    assert compute["step_time"]["diagnosis"]["status"] == "COMPUTE-BOUND"
    balanced = _phases_run(tmp_path, "balanced", step=10.0, input_wait=2.0, forward=2.0, backward=2.0)
    assert balanced["step_time"]["diagnosis"]["status"] == "BALANCED"


# -- compare's phase table ------------------------------------------------------------------------
def test_compare_phase_table_shows_the_core_parts_with_shares(tmp_path) -> None:
    ref = _phases_run(tmp_path, "ref", step=1.0, input_wait=81.0, data_wait=80.0, forward=0.5)
    cand = _phases_run(tmp_path, "cand", step=1.0, input_wait=201.0, data_wait=80.0, forward=0.5)
    rows = compare_summaries(ref, cand).report["phases"]["rows"]
    assert [(k, r["label"]) for k, r in rows.items()] == [("step_time_ms", "Step time")] + [
        (steptime.metric_name(name), label) for name, label in steptime.PARTS
    ]
    assert rows["between_steps_ms"]["delta"] == pytest.approx(120.0 * 19 / 20)
    assert rows["data_wait_ms"]["reference_share_pct"] == pytest.approx(
        ref["step_time"]["global"]["average"]["data_wait_ms"] / ref["step_time"]["global"]["average"]["step_time_ms"] * 100)
    parts = [rows[steptime.metric_name(n)]["candidate"] for n in steptime.PART_NAMES]
    assert math.fsum(p for p in parts if p is not None) == pytest.approx(rows["step_time_ms"]["candidate"])


def test_compare_shows_the_undivided_input_wait_for_older_summaries() -> None:
    base = json.loads((FIXTURES / "ours" / "base_1.9.json").read_text())
    rows = compare_summaries(base, copy.deepcopy(base)).report["phases"]["rows"]
    assert rows["input_wait_ms"]["label"].startswith("Input wait (older summary")
    assert rows["data_wait_ms"]["reference"] is None
    tai = json.loads((FIXTURES / "traceml_ai" / "tai-reference" / "final_summary.json").read_text())
    assert "input_wait_ms" in compare_summaries(tai, base).report["phases"]["rows"]
