"""Interchangeability with the published `traceml-ai` package (issue 3, item 5).

Its `traceml compare` runs from its own venv (`.cache/traceml-ai-venv`,
created once, `--system-site-packages`, `pip install --no-deps
traceml-ai==0.5.0`): both packages install a `traceml` script, so they cannot
share one environment. On every pair we accept, both tools must give the same
CI result and exit code, in both directions:

* summaries written by traceml-ai itself (`fixtures/summaries/traceml_ai/`,
  produced by its own launcher) through our compare;
* our summaries (the table-driven cases of test_compare_policy) through theirs.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_compare_policy import BOUNDARY, INELIGIBLE, RESULT_TABLE, summary

from traceml_tui.compare import cli

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".cache" / "traceml-ai-venv"
PACKAGE = "traceml-ai==0.5.0"
TAI = Path(__file__).parent / "fixtures" / "summaries" / "traceml_ai"
TAI_REF = TAI / "tai-reference" / "final_summary.json"
TAI_CAND = TAI / "tai-candidate" / "final_summary.json"


def _venv_works(venv: Path) -> bool:
    exe = venv / "bin" / "traceml"
    if not exe.exists():
        return False
    probe = subprocess.run([str(exe), "compare", "--help"], capture_output=True, text=True, timeout=60)
    return probe.returncode == 0 and "max-step-time-regression-pct" in probe.stdout


@pytest.fixture(scope="session")
def their_traceml() -> Path:
    """Path of traceml-ai's `traceml` script, installing it once (skip when it cannot be)."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "traceml-ai-venv.lock", "w") as lock:
        # Several test sessions may share this checkout; one builds, the others wait.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _venv_works(VENV):
            shutil.rmtree(VENV, ignore_errors=True)
            try:
                subprocess.run(
                    [sys.executable, "-m", "venv", "--system-site-packages", str(VENV)],
                    check=True, capture_output=True, timeout=120,
                )
                subprocess.run(
                    [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                     "--disable-pip-version-check", PACKAGE],
                    check=True, capture_output=True, text=True, timeout=300,
                )
            except (subprocess.SubprocessError, OSError) as exc:
                shutil.rmtree(VENV, ignore_errors=True)
                detail = str(getattr(exc, "stderr", "") or "").strip()
                pytest.skip(f"cannot install {PACKAGE} into {VENV} (no PyPI access?): {detail[-200:] or exc}")
            if not _venv_works(VENV):
                pytest.skip(f"{PACKAGE} installed but its `traceml compare` does not run")
    return VENV / "bin" / "traceml"


def theirs(exe: Path, ref: Path, cand: Path, threshold: str | None, out: Path) -> tuple[int, dict | None]:
    args = [str(exe), "compare", str(ref), str(cand), "--output", str(out)]
    if threshold is not None:
        args += ["--max-step-time-regression-pct", threshold]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=out.parent)
    report = json.loads(out.with_name(out.name + ".json").read_text()) if out.with_name(out.name + ".json").exists() else None
    return proc.returncode, report


# Their console script's entry point (`traceml = traceml_ai.launcher.cli:main`),
# called once per argv inside one interpreter: the same code path as bin/traceml
# without paying ~0.3 s of start-up for each of ~45 pairs.
_BATCH_DRIVER = """
import contextlib, io, json, sys
from traceml_ai.launcher.cli import main
codes = []
for argv in json.load(sys.stdin):
    sys.argv = ["traceml", *argv]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main()
            codes.append(0)
        except SystemExit as exc:
            codes.append(exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1))
json.dump(codes, sys.stdout)
"""


def theirs_batch(exe: Path, jobs: list[tuple[Path, Path, str | None, Path]]) -> list[tuple[int, dict | None]]:
    """Their exit code and report for many pairs, in one interpreter of their venv."""
    argvs = []
    for ref, cand, threshold, out in jobs:
        argv = ["compare", str(ref), str(cand), "--output", str(out)]
        if threshold is not None:
            argv += ["--max-step-time-regression-pct", threshold]
        argvs.append(argv)
    proc = subprocess.run([str(exe.parent / "python"), "-c", _BATCH_DRIVER], input=json.dumps(argvs),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    codes = json.loads(proc.stdout)
    out = []
    for code, (_, _, _, base) in zip(codes, jobs):
        path = base.with_name(base.name + ".json")
        out.append((code, json.loads(path.read_text()) if path.exists() else None))
    return out


def ours(ref: Path, cand: Path, threshold: str | None, out: Path) -> tuple[int, dict | None]:
    args = [str(ref), str(cand), "--output", str(out)]
    if threshold is not None:
        args += ["--max-step-time-regression-pct", threshold]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(args)
    report = json.loads(out.with_name(out.name + ".json").read_text()) if out.with_name(out.name + ".json").exists() else None
    return code, report


def assert_same(exe: Path, ref: Path, cand: Path, threshold: str | None, tmp: Path, name: str,
                their_result: tuple[int, dict | None] | None = None) -> tuple[int, str | None]:
    our_code, our_report = ours(ref, cand, threshold, tmp / f"ours_{name}")
    their_code, their_report = their_result or theirs(exe, ref, cand, threshold, tmp / f"theirs_{name}")
    assert our_code == their_code, (name, our_code, their_code)
    our_result = our_report["ci"]["result"] if our_report and our_report["ci"] else None
    their_result = (their_report or {}).get("ci_policy", {}).get("result")
    assert our_result == their_result, name
    if our_result is not None and our_report["ci"]["pct_change"] is not None:
        policy = their_report["ci_policy"]
        assert our_report["ci"]["clock"] == policy["selected_clock"], name
        assert our_report["ci"]["pct_change"] == policy["pct_change"], name  # bit-identical arithmetic
    return our_code, our_result


# --- summaries written by traceml-ai --------------------------------------------------


def test_traceml_ai_written_summaries_give_the_same_result(their_traceml, tmp_path):
    pairs = (("fwd", TAI_REF, TAI_CAND), ("rev", TAI_CAND, TAI_REF), ("same", TAI_REF, TAI_REF))
    jobs = [
        (f"{name}_{threshold}", ref, cand, threshold)
        for threshold in (None, "0", "5", "38", "38.5", "1000")
        for name, ref, cand in pairs
    ]
    # The real bin/traceml once, the rest batched through the same entry point.
    first = theirs(their_traceml, TAI_REF, TAI_CAND, "5", tmp_path / "theirs_cli")
    assert first[0] == 4 and first[1]["ci_policy"]["result"] == "SLOWER_IN_THIS_PAIR"
    their = theirs_batch(their_traceml, [(r, c, t, tmp_path / f"theirs_{n}") for n, r, c, t in jobs])
    results = {}
    for (name, ref, cand, threshold), their_result in zip(jobs, their):
        results[name] = assert_same(their_traceml, ref, cand, threshold, tmp_path, name, their_result)
    # The real pair is +38.2 % apart on the CPU clock.
    assert results["fwd_5"] == (4, "SLOWER_IN_THIS_PAIR")
    assert results["rev_5"] == (0, "FASTER_IN_THIS_PAIR")
    assert results["same_0"] == (0, "WITHIN_THRESHOLD_IN_THIS_PAIR")
    assert results["fwd_38"] == (4, "SLOWER_IN_THIS_PAIR")
    assert results["fwd_38.5"] == (0, "WITHIN_THRESHOLD_IN_THIS_PAIR")
    assert results["fwd_None"] == (0, None)


def test_traceml_ai_summaries_are_schema_1_9_and_guarded():
    for path in (TAI_REF, TAI_CAND):
        data = json.loads(path.read_text())
        assert data["schema_version"] == 1.9
        assert data["run_context"]["declaration"]["workload"]["name"] == "tiny-cpu-mlp"


def test_mixed_pair_traceml_ai_reference_and_our_candidate(their_traceml, tmp_path):
    their = json.loads(TAI_REF.read_text())
    mine = copy.deepcopy(summary(cpu=their["step_time"]["global"]["average"]["step_time_cpu_ms"] * 1.02))
    mine["run_context"] = copy.deepcopy(their["run_context"])
    mine["step_time"]["global"]["window"]["diagnosis_clock"] = "cpu"
    path = tmp_path / "ours" / "final_summary.json"
    path.parent.mkdir()
    path.write_text(json.dumps(mine))
    assert assert_same(their_traceml, TAI_REF, path, "5", tmp_path, "mixed") == (0, "WITHIN_THRESHOLD_IN_THIS_PAIR")
    assert assert_same(their_traceml, TAI_REF, path, "1", tmp_path, "mixed1") == (4, "SLOWER_IN_THIS_PAIR")


# --- our summaries through their compare ----------------------------------------------


def _our_pairs():
    for name, ref, cand, threshold, *_ in RESULT_TABLE:
        yield name, ref, cand, str(threshold)
    for name, ref, cand, _code in INELIGIBLE:
        yield name, ref, cand, "5"
    for ref_ms, cand_ms, threshold, _result in BOUNDARY:
        yield f"boundary {ref_ms}->{cand_ms}", summary(ref_ms), summary(cand_ms), str(threshold)
    yield "exploratory", summary(100.0), summary(150.0), None


def test_our_summaries_give_the_same_result_in_traceml_ai(their_traceml, tmp_path):
    accepted, refused = [], 0
    for index, (name, ref, cand, threshold) in enumerate(_our_pairs()):
        folder = tmp_path / f"case{index}"
        paths = []
        for role, data in (("reference", ref), ("candidate", cand)):
            path = folder / role / "final_summary.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps(data))  # NaN/inf become literals, which we refuse as input
            paths.append(path)
        if any(
            isinstance(v, float) and not math.isfinite(v)
            for d in (ref, cand)
            for v in d["step_time"].get("global", {}).get("average", {}).values()
        ):
            assert ours(paths[0], paths[1], threshold, folder / "ours")[0] == 1, name
            refused += 1
            continue
        accepted.append((name, paths[0], paths[1], threshold, folder))
    their_results = theirs_batch(their_traceml, [(r, c, t, f / "theirs") for _, r, c, t, f in accepted])
    for (name, ref, cand, threshold, folder), their in zip(accepted, their_results):
        assert_same(their_traceml, ref, cand, threshold, folder, name.replace(" ", "_"), their)
    assert len(accepted) >= 35 and refused == 2


# --- summaries written by our own summary builder ------------------------------------

CONTRACT = {
    "schema_version": 1,
    "workload": {"name": "interop-builder", "parameters": {"model": "tiny-mlp", "per_rank_batch_size": 8}},
    "measurement": {"start_step": 1, "completed_steps": 30},
}


def _built_run(root: Path, name: str, step_ms: float, gpu: bool = False) -> Path:
    """A run directory with real v1 step records, summarized by traceml_tui.summary.build."""
    from traceml_tui.core import records
    from traceml_tui.core.rundir import RunDir

    build = pytest.importorskip("traceml_tui.summary.build")
    run_dir = root / name
    for rank in range(2):
        path = RunDir(run_dir).steps_file(rank, 0)
        path.parent.mkdir(parents=True)
        lines = [records.encode(records.Header(v=1, run=name, rank=rank, attempt=0, uuid=f"{name}{rank}", ts=0.0))]
        ts = 1000.0
        for step in range(1, 31):
            ms = step_ms * (1.0 + 0.01 * ((step * 7 + rank) % 5 - 2))
            ts += ms / 1000.0
            phases = records.Phases(step=ms, input_wait=0.1 * ms, forward=0.3 * ms, backward=0.4 * ms, optimizer=0.1 * ms)
            lines.append(records.encode(records.Step(
                v=1, run=name, rank=rank, attempt=0, step=step, ts=ts, cpu_ms=phases,
                gpu_ms=records.Phases(step=0.9 * ms, input_wait=0.1 * ms, forward=0.3 * ms) if gpu else None,
                loss=1.0 / step,
            )))
        path.write_bytes(b"".join(lines))
    manifest = {
        "run_name": name,
        "status": "completed",
        "topology": {"nnodes": 1, "nproc_per_node": 2, "world_size": 2},
        "guard": {"contract": CONTRACT, "training": {"status": "completed", "nodes_observed": 1, "reasons": []}},
    }
    summary_data = build.build_summary(run_dir, manifest)
    path = run_dir / "final_summary.json"
    path.write_text(json.dumps(summary_data, allow_nan=False))
    return path


@pytest.mark.parametrize("cand_ms,gpu", [(100.0, False), (112.0, False), (85.0, False), (112.0, True)])
def test_summaries_from_our_builder_give_the_same_result_in_both_tools(their_traceml, tmp_path, cand_ms, gpu):
    ref = _built_run(tmp_path / "logs", "built-ref", 100.0, gpu)
    cand = _built_run(tmp_path / "logs", "built-cand", cand_ms, gpu)
    code, result = assert_same(their_traceml, ref, cand, "5", tmp_path, "built")
    report = json.loads((tmp_path / "ours_built.json").read_text())
    assert result != "INCONCLUSIVE", report["ci"]
    assert report["ci"]["clock"] == ("gpu" if gpu else "cpu")
    assert report["noise"]["status"] == "ok"  # the rank records sit beside the summary
    assert {"training", "environment"} <= set(json.loads(ref.read_text()))
