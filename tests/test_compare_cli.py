"""`traceml compare` and `traceml view` as CI runs them: real subprocesses, real files.

Exit codes and artifacts are the contract a pipeline relies on: 0/4/3 for
results, 1 for bad input or unwritable output, 2 for usage errors, and the
JSON/TXT evidence on disk before any of 0, 3 or 4 is returned.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from traceml_tui.compare.load import MAX_SUMMARY_BYTES
from traceml_tui.core import records
from traceml_tui.core.rundir import RunDir

from support.cli import run_main

FIXTURES = Path(__file__).parent / "fixtures" / "summaries"
BASE = json.loads((FIXTURES / "ours" / "base_1.9.json").read_text())
TAI = FIXTURES / "traceml_ai"


def make_summary(step_ms: float = 100.0, run_name: str = "reference", **run_context) -> dict:
    data = copy.deepcopy(BASE)
    data["step_time"]["global"]["average"]["step_time_cpu_ms"] = step_ms
    data["meta"]["run_name"] = run_name
    data["run_context"].update(run_context)
    return data


def write_run(root: Path, name: str, summary: dict) -> Path:
    path = root / name / "final_summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))
    return path


def run(env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`traceml ARGS` in this process (support/cli.py: the same exit code, stdout, stderr and files)."""
    return run_main(args, env=env, cwd=cwd)


def run_process(cmd: list[str], env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`traceml ARGS` as a real process: the entry point itself (one test per command)."""
    return subprocess.run([*cmd, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """A valid reference/candidate pair (100 ms → 103 ms)."""
    return (
        write_run(tmp_path / "logs", "reference", make_summary(100.0, "reference")),
        write_run(tmp_path / "logs", "candidate", make_summary(103.0, "candidate")),
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


# --- results, exit codes and artifacts ------------------------------------------------

CASES = [
    # (candidate step ms, candidate run_context edits, threshold, result, exit code)
    (103.0, {}, "5", "WITHIN_THRESHOLD_IN_THIS_PAIR", 0),
    (80.0, {}, "5", "FASTER_IN_THIS_PAIR", 0),
    (120.0, {}, "5", "SLOWER_IN_THIS_PAIR", 4),
    (100.0, {"run": {"status": "failed"}}, "5", "INCONCLUSIVE", 3),
]


@pytest.mark.parametrize("cand_ms,edits,threshold,result,code", CASES)
def test_exit_code_and_artifacts_written_before_exit(tmp_path, cli_env, cand_ms, edits, threshold, result, code):
    ref = write_run(tmp_path / "logs", "reference", make_summary(100.0, "reference"))
    cand = write_run(tmp_path / "logs", "candidate", make_summary(cand_ms, "candidate", **edits))
    proc = run(
        cli_env, tmp_path, "compare", str(ref), str(cand),
        "--max-step-time-regression-pct", threshold, "--output", "out/ci/pair",
    )
    assert proc.returncode == code, proc.stderr
    report = json.loads((tmp_path / "out/ci/pair.json").read_text())
    text = (tmp_path / "out/ci/pair.txt").read_text()
    assert report["ci"]["result"] == result and report["ci"]["exit_code"] == code
    # The text report leads with the verdict and why.
    assert text.splitlines()[2].startswith(f"Result: {result}")
    assert text.splitlines()[3].startswith("Why: ")
    assert proc.stdout.startswith(text)


def test_default_output_is_named_after_the_runs(tmp_path, traceml_cmd, cli_env, pair):
    """The real `python -m traceml_tui compare` entry point (the other compare tests run it in-process)."""
    proc = run_process(traceml_cmd, cli_env, tmp_path, "compare", str(pair[0]), str(pair[1]))
    assert proc.returncode == 0
    assert (tmp_path / "compare" / "reference_vs_candidate.json").is_file()
    assert (tmp_path / "compare" / "reference_vs_candidate.txt").is_file()
    report = json.loads((tmp_path / "compare" / "reference_vs_candidate.json").read_text())
    assert report["ci"] is None and report["mode"] == "exploratory"


def test_unsafe_run_names_are_sanitized_into_the_compare_folder(tmp_path, cli_env):
    ref = write_run(tmp_path / "logs", "a", make_summary(100.0, "../../etc/evil name\n"))
    cand = write_run(tmp_path / "logs", "b", make_summary(101.0, "cand/../ü*"))
    proc = run(cli_env, tmp_path, "compare", str(ref), str(cand), "--max-step-time-regression-pct", "5")
    assert proc.returncode == 0, proc.stderr
    produced = sorted(p.name for p in (tmp_path / "compare").iterdir())
    assert produced == ["etc_evil_name_vs_cand.json", "etc_evil_name_vs_cand.txt"]
    assert not (tmp_path.parent / "etc").exists()


def test_folder_names_used_when_summaries_have_no_run_name(tmp_path, cli_env):
    ref_summary, cand_summary = make_summary(100.0), make_summary(100.0)
    del ref_summary["meta"]["run_name"], cand_summary["meta"]["run_name"]
    ref = write_run(tmp_path / "logs", "nightly-main", ref_summary)
    cand = write_run(tmp_path / "logs", "pr-123", cand_summary)
    assert run(cli_env, tmp_path, "compare", str(ref), str(cand)).returncode == 0
    assert (tmp_path / "compare" / "nightly-main_vs_pr-123.json").is_file()


def test_artifacts_hold_no_absolute_paths(tmp_path, cli_env, pair):
    run(cli_env, tmp_path, "compare", str(pair[0]), str(pair[1]), "--output", "o/x",
        "--max-step-time-regression-pct", "5")
    for name in ("o/x.json", "o/x.txt"):
        assert str(tmp_path) not in (tmp_path / name).read_text()


def test_json_format_prints_the_report(tmp_path, cli_env, pair):
    proc = run(cli_env, tmp_path, "compare", str(pair[0]), str(pair[1]), "--format", "json",
               "--output", "o/x", "--max-step-time-regression-pct", "5")
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == json.loads((tmp_path / "o/x.json").read_text())


def test_markdown_format_puts_the_verdict_first_then_the_table(tmp_path, cli_env):
    ref = write_run(tmp_path / "logs", "reference", make_summary(100.0, "reference"))
    cand = write_run(tmp_path / "logs", "candidate", make_summary(120.0, "candidate"))
    proc = run(cli_env, tmp_path, "compare", str(ref), str(cand), "--format", "markdown",
               "--max-step-time-regression-pct", "5")
    assert proc.returncode == 4
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("### ") and "SLOWER_IN_THIS_PAIR" in lines[0]
    assert lines[2].startswith("**Why:**")
    table = lines.index("| Metric | Reference | Candidate | Delta | Change |")
    assert "+20.00%" in lines[table + 2]
    assert (tmp_path / "compare" / "reference_vs_candidate.json").is_file()


@pytest.mark.parametrize(
    "cand_ms,threshold,failures,skipped",
    [(103.0, "5", 0, 0), (120.0, "5", 1, 0), (None, "5", 1, 0), (103.0, None, 0, 1)],
)
def test_junit_has_one_case_failing_on_slower_or_inconclusive(tmp_path, cli_env, cand_ms, threshold, failures, skipped):
    ref = write_run(tmp_path / "logs", "reference", make_summary(100.0, "reference"))
    cand_summary = make_summary(cand_ms or 100.0, "candidate")
    if cand_ms is None:
        cand_summary["run_context"] = {}
    cand = write_run(tmp_path / "logs", "candidate", cand_summary)
    args = ["compare", str(ref), str(cand), "--junit", "reports/junit.xml"]
    if threshold:
        args += ["--max-step-time-regression-pct", threshold]
    run(cli_env, tmp_path, *args)
    root = ET.parse(tmp_path / "reports" / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == 1
    assert len(cases[0].findall("failure")) == failures
    assert len(cases[0].findall("skipped")) == skipped
    assert root.get("failures") == str(failures)


@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_a_boolean_step_time_counts_as_unavailable(tmp_path, cli_env, side):
    # JSON true once read as 1 ms: "FASTER_IN_THIS_PAIR from 100 ms to 1 ms".
    summaries = {"reference": make_summary(100.0, "reference"), "candidate": make_summary(100.0, "candidate")}
    summaries[side]["step_time"]["global"]["average"]["step_time_cpu_ms"] = True
    ref = write_run(tmp_path / "logs", "reference", summaries["reference"])
    cand = write_run(tmp_path / "logs", "candidate", summaries["candidate"])
    proc = run(cli_env, tmp_path, "compare", str(ref), str(cand),
               "--max-step-time-regression-pct", "5", "--output", "o/x")
    assert proc.returncode == 3, proc.stderr
    ci = json.loads((tmp_path / "o/x.json").read_text())["ci"]
    assert (ci["result"], ci["reason_code"]) == ("INCONCLUSIVE", "step_time_unavailable")
    assert ci[f"{side}_step_time_ms"] is None


# --- bad input: exit 1, one line, no traceback, nothing written ----------------------


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    out = {"missing file": tmp / "nope.json", "a directory": tmp}
    for name, data in {
        "empty file": b"",
        "invalid JSON": b'{"schema_version": 1.9,',
        "a JSON array": b"[1, 2, 3]",
        "non-UTF-8 bytes": b'{"schema_version": "\xff\xfe"}',
        "NaN literal": json.dumps(make_summary(float("nan"))).encode(),
        "Infinity literal": b'{"schema_version": Infinity}',
        "10,000-deep nesting": b"[" * 10_000 + b"]" * 10_000,
        "not a summary": b'{"hello": "world"}',
        "a 5,000-digit integer": b'{"schema_version": ' + b"9" * 5000 + b"}",
    }.items():
        path = tmp / (name.replace(" ", "_").replace(",", "") + ".json")
        path.write_bytes(data)
        out[name] = path
    huge = tmp / "huge.json"
    with open(huge, "wb") as handle:
        handle.truncate(200 * 1024 * 1024)  # sparse: instant, no disk used
    out["a 200 MB file"] = huge
    return out


BAD_NAMES = [
    "missing file", "a directory", "empty file", "invalid JSON", "a JSON array", "non-UTF-8 bytes",
    "NaN literal", "Infinity literal", "10,000-deep nesting", "not a summary", "a 200 MB file",
    "a 5,000-digit integer",
]
EXPECTED_WORDS = {
    "missing file": "does not exist",
    "a directory": "folder",
    "empty file": "empty",
    "invalid JSON": "not valid JSON",
    "a JSON array": "array",
    "non-UTF-8 bytes": "UTF-8",
    "NaN literal": "NaN",
    "Infinity literal": "Infinity",
    "10,000-deep nesting": "nested deeper than 64 levels",
    "not a summary": "not a final summary",
    "a 200 MB file": "size limit",
    "a 5,000-digit integer": "not a usable JSON summary",
}


@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_bad_input_exits_1_with_one_clear_line(tmp_path, cli_env, pair, side):
    # One call per bad file keeps this table honest.
    bad = _bad_inputs(tmp_path / "bad")
    for name in BAD_NAMES:
        args = [str(bad[name]), str(pair[1])] if side == "reference" else [str(pair[0]), str(bad[name])]
        proc = run(cli_env, tmp_path, "compare", *args, "--max-step-time-regression-pct", "5")
        assert proc.returncode == 1, (name, proc.stderr)
        line = one_error_line(proc)
        assert side in line and EXPECTED_WORDS[name] in line, (name, line)
        assert not (tmp_path / "compare").exists(), name


def test_size_limit_is_checked_before_reading(tmp_path):
    from traceml_tui.compare.load import SummaryError, read_summary

    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:
        handle.truncate(MAX_SUMMARY_BYTES + 1)
    with pytest.raises(SummaryError, match="size limit"):
        read_summary(huge)


def test_unwritable_output_folder_exits_1_and_keeps_existing_files(tmp_path, cli_env, pair):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("keep me")
    proc = run(cli_env, tmp_path, "compare", str(pair[0]), str(pair[1]), "--output",
               str(blocker / "sub" / "x"), "--max-step-time-regression-pct", "5")
    assert proc.returncode == 1
    assert "cannot write" in one_error_line(proc)
    assert blocker.read_text() == "keep me"


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


CLASHES = [
    # (extra arguments, words the error line names); REF/CAND stand for the two summary paths.
    (["--output", "CAND"], "candidate summary"),
    (["--output", "logs/candidate/final_summary.txt"], "candidate summary"),  # .txt dropped: BASE.json is CAND
    (["--output", "logs/candidate/../candidate/final_summary"], "candidate summary"),
    (["--output", "logs/link/final_summary"], "candidate summary"),  # a symlinked folder: same file
    (["--junit", "REF"], "reference summary"),
    (["--output", "out/same", "--junit", "out/same.json"], "--output JSON report"),
    (["--output", "out/same", "--junit", "./out/../out/same.txt"], "--output text report"),
]


@pytest.mark.parametrize("extra,words", CLASHES)
def test_an_output_that_is_an_input_or_another_output_is_refused(tmp_path, cli_env, pair, extra, words):
    (tmp_path / "logs" / "link").symlink_to(tmp_path / "logs" / "candidate")
    before = _tree(tmp_path)
    extra = [str(pair[0]) if a == "REF" else str(pair[1]) if a == "CAND" else a for a in extra]
    proc = run(cli_env, tmp_path, "compare", "logs/reference/final_summary.json",
               "logs/candidate/final_summary.json", "--max-step-time-regression-pct", "5", *extra)
    assert proc.returncode == 1, proc.stderr
    line = one_error_line(proc)
    assert "refusing to overwrite" in line and words in line, line
    assert _tree(tmp_path) == before  # nothing written, nothing replaced


def test_calibrate_output_that_is_an_input_is_refused(tmp_path, cli_env):
    paths = [str(write_run(tmp_path / "logs", f"ref{i}", make_summary(100.0 + i, f"ref{i}"))) for i in range(2)]
    before = _tree(tmp_path)
    proc = run(cli_env, tmp_path, "compare", "--calibrate", *paths, "--output", paths[1])
    assert proc.returncode == 1
    assert "run 2 summary" in one_error_line(proc)
    assert _tree(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_read_only_output_folder_exits_1(tmp_path, cli_env, pair):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        proc = run(cli_env, tmp_path, "compare", str(pair[0]), str(pair[1]), "--output", str(ro / "x"))
    finally:
        ro.chmod(0o700)
    assert proc.returncode == 1
    one_error_line(proc)


# --- usage errors: exit 2 ------------------------------------------------------------

USAGE = [
    ["--bogus"],
    [],
    ["ONLY_ONE"],
    ["REF", "CAND", "EXTRA"],
    ["--max-step-time-regression-pct", "nan"],
    ["--max-step-time-regression-pct", "inf"],
    ["--max-step-time-regression-pct", "-1"],
    ["--max-step-time-regression-pct", "abc"],
    ["--max-step-time-regression-pct"],
    ["--format", "html"],
    ["--junit", ""],
    ["--output", ""],
    ["--output", "  "],
]


def test_usage_errors_exit_2(tmp_path, cli_env, pair):
    for extra in USAGE:
        positional = [str(pair[0]), str(pair[1])]
        if extra in ([], ["ONLY_ONE"]):
            positional = [str(pair[0])] if extra else []
            extra = []
        elif extra[:2] == ["REF", "CAND"]:
            positional, extra = [str(pair[0]), str(pair[1]), str(pair[1])], []
        proc = run(cli_env, tmp_path, "compare", *positional, *extra)
        assert proc.returncode == 2, (extra, proc.stderr)
        line = one_error_line(proc)
        assert "usage" in line
        assert not (tmp_path / "compare").exists()


@pytest.mark.parametrize("zero", ["-0", "-0.0"])
def test_a_negative_zero_threshold_is_zero(tmp_path, cli_env, pair, zero):
    proc = run(cli_env, tmp_path, "compare", str(pair[0]), str(pair[1]),
               "--max-step-time-regression-pct", zero, "--output", "o/x")
    assert proc.returncode == 4, proc.stderr  # 100 -> 103 ms is slower than 0 %
    assert '"threshold_pct": 0.0' in (tmp_path / "o/x.json").read_text()
    assert "-0%" not in proc.stdout and "allowed 0% regression" in proc.stdout


def run_into_closed_pipe(cmd: list[str], env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Run with stdout a pipe whose reader has already gone (`… | head -0`, a CI step that stopped reading)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([*cmd, *args], env=env, cwd=cwd, stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=60)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("cand_ms,code", [(103.0, 0), (120.0, 4)])
@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_a_closed_stdout_keeps_the_verdict_and_the_artifacts(tmp_path, traceml_cmd, cli_env, cand_ms, code, fmt):
    ref = write_run(tmp_path / "logs", "reference", make_summary(100.0, "reference"))
    cand = write_run(tmp_path / "logs", "candidate", make_summary(cand_ms, "candidate"))
    proc = run_into_closed_pipe(traceml_cmd, cli_env, tmp_path, "compare", str(ref), str(cand),
                                "--max-step-time-regression-pct", "5", "--output", "out/pair", "--format", fmt)
    assert (proc.returncode, proc.stderr) == (code, "")
    assert json.loads((tmp_path / "out/pair.json").read_text())["ci"]["exit_code"] == code


@pytest.mark.parametrize("args", [("--help",), ("--version",), ("view", str(TAI / "tai-reference" / "final_summary.json"))])
def test_printing_into_a_closed_pipe_is_quiet_and_exit_0(tmp_path, traceml_cmd, cli_env, args):
    proc = run_into_closed_pipe(traceml_cmd, cli_env, tmp_path, *args)
    assert (proc.returncode, proc.stderr) == (0, "")


def test_help_exits_0(tmp_path, cli_env):
    proc = run(cli_env, tmp_path, "compare", "--help")
    assert proc.returncode == 0 and "--max-step-time-regression-pct" in proc.stdout


# --- traceml view --------------------------------------------------------------------


def test_view_prints_the_stored_text_card(tmp_path, traceml_cmd, cli_env):
    """The real `python -m traceml_tui view` entry point."""
    proc = run_process(traceml_cmd, cli_env, tmp_path, "view", str(TAI / "tai-reference" / "final_summary.json"))
    stored = json.loads((TAI / "tai-reference" / "final_summary.json").read_text())["text"]
    assert proc.returncode == 0
    assert proc.stdout == stored.rstrip("\r\n") + "\n"


def test_view_refuses_bad_files_with_one_line(tmp_path, cli_env):
    no_text = tmp_path / "no_text.json"
    no_text.write_text('{"schema_version": 1.9}')
    for path, word in ((tmp_path / "missing.json", "does not exist"), (no_text, "no stored text"), (tmp_path, "folder")):
        proc = run(cli_env, tmp_path, "view", str(path))
        assert proc.returncode == 1
        assert word in one_error_line(proc)
    assert run(cli_env, tmp_path, "view").returncode == 2


# --- imports: compare never pulls in the TUI or torch --------------------------------


def test_compare_imports_neither_textual_nor_torch(tmp_path, cli_env, pair):
    code = (
        "import sys\n"
        "from traceml_tui.compare import cli\n"
        f"rc = cli.main([{str(pair[0])!r}, {str(pair[1])!r}, '--max-step-time-regression-pct', '5', "
        f"'--output', {str(tmp_path / 'o' / 'x')!r}, '--junit', {str(tmp_path / 'j.xml')!r}, '--format', 'markdown'])\n"
        "assert rc == 0, rc\n"
        "heavy = sorted(m for m in ('textual', 'torch', 'numpy', 'rich') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=cli_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stdout  # numpy only loads for the noise section, when records exist


# --- noise from per-step records ------------------------------------------------------


def _write_steps(run_dir: Path, name: str, values: list[float], ranks: int = 2) -> None:
    for rank in range(ranks):
        path = RunDir(run_dir).steps_file(rank, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(records.encode(records.Header(v=1, run=name, rank=rank, attempt=0, uuid=f"{name}-{rank}", ts=0.0)))
            for step, value in enumerate(values, start=1):
                rec = records.Step(v=1, run=name, rank=rank, attempt=0, step=step, ts=float(step),
                                   cpu_ms=records.Phases(step=value + rank * 0.1))
                handle.write(records.encode(rec))
            handle.write(b'{"not json\n')  # a torn/garbage line is skipped, never fatal


def test_noise_section_from_step_records_is_reproducible_and_flags_straddling(tmp_path, cli_env):
    import random

    rng = random.Random(7)
    ref_values = [100.0 + rng.gauss(0, 8) for _ in range(50)]
    cand_values = [104.5 + rng.gauss(0, 8) for _ in range(50)]
    ref = write_run(tmp_path / "logs", "reference", make_summary(sum(ref_values) / 50, "reference"))
    cand = write_run(tmp_path / "logs", "candidate", make_summary(sum(cand_values) / 50, "candidate"))
    _write_steps(ref.parent, "reference", ref_values)
    _write_steps(cand.parent, "candidate", cand_values)
    reports = []
    for out in ("a", "b"):
        proc = run(cli_env, tmp_path, "compare", str(ref), str(cand), "--output", out,
                   "--max-step-time-regression-pct", "5")
        assert proc.returncode in (0, 4), proc.stderr
        reports.append(json.loads((tmp_path / f"{out}.json").read_text()))
    noise = reports[0]["noise"]
    assert noise == reports[1]["noise"]  # fixed seed
    assert noise["status"] == "ok" and noise["clock"] == "cpu"
    assert noise["reference_steps"] == 50 and noise["candidate_steps"] == 50
    low, high = noise["pct_interval_95"]
    assert low < 5 < high  # ~4.5 % apart with 8 % per-step noise
    assert "straddles" in noise["note"]
    assert "Noise (per-step records, bootstrap)" in (tmp_path / "a.txt").read_text()


def test_no_noise_section_without_step_records(tmp_path, cli_env, pair):
    run(cli_env, tmp_path, "compare", str(pair[0]), str(pair[1]), "--output", "x")
    assert json.loads((tmp_path / "x.json").read_text())["noise"] is None


# --- calibrate -----------------------------------------------------------------------


def test_calibrate_reports_spread_and_suggests_a_threshold(tmp_path, cli_env):
    paths = [str(write_run(tmp_path / "logs", f"ref{i}", make_summary(ms, f"ref{i}"))) for i, ms in
             enumerate((100.0, 102.0, 104.0))]
    proc = run(cli_env, tmp_path, "compare", "--calibrate", *paths, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["spread_pct"] == pytest.approx(4.0)
    assert report["suggested_threshold_pct"] == 6.0  # 4 % x 1.5 headroom
    text = run(cli_env, tmp_path, "compare", "--calibrate", *paths).stdout
    assert "Suggested --max-step-time-regression-pct 6" in text


def test_calibrate_excludes_other_workloads_and_needs_two_runs(tmp_path, cli_env):
    other = make_summary(100.0, "other")
    other["run_context"]["declaration"]["workload"]["name"] = "different"
    paths = [
        str(write_run(tmp_path / "logs", "ref0", make_summary(100.0, "ref0"))),
        str(write_run(tmp_path / "logs", "other", other)),
    ]
    proc = run(cli_env, tmp_path, "compare", "--calibrate", *paths)
    assert proc.returncode == 3
    assert "Excluded other: [declaration_mismatch]" in proc.stdout
    assert run(cli_env, tmp_path, "compare", "--calibrate", paths[0]).returncode == 2


def test_calibrate_excludes_an_unusable_first_run_under_its_own_name(tmp_path, cli_env):
    # The first run was the yardstick: a valid second run was "Excluded ... The reference summary
    # has no guard declaration" and the bad first one was never named.
    bad = make_summary(100.0, "ref0")
    del bad["run_context"]["declaration"]
    paths = [str(write_run(tmp_path / "logs", "ref0", bad))] + [
        str(write_run(tmp_path / "logs", f"ref{i}", make_summary(ms, f"ref{i}"))) for i, ms in ((1, 100.0), (2, 102.0))
    ]
    proc = run(cli_env, tmp_path, "compare", "--calibrate", *paths, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [r["label"] for r in report["runs"]] == ["ref1", "ref2"]
    assert [(e["label"], e["reason_code"]) for e in report["excluded"]] == [("ref0", "declaration_invalid")]
    assert "reference" not in report["excluded"][0]["reason"]
    assert report["suggested_threshold_pct"] == 3.0  # 2 % x 1.5


def test_calibrate_refuses_the_same_summary_twice(tmp_path, cli_env):
    path = write_run(tmp_path / "logs", "ref0", make_summary(100.0, "ref0"))
    (tmp_path / "logs" / "again").symlink_to(path.parent)
    for other in (str(path), "logs/again/final_summary.json", "logs/ref0/../ref0/final_summary.json"):
        proc = run(cli_env, tmp_path, "compare", "--calibrate", str(path), other)
        assert proc.returncode == 2, (other, proc.stderr)
        assert "same summary" in one_error_line(proc)
