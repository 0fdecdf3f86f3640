"""The in-process `traceml` of the tests (tests/support/cli.py) answers as the real process does: the fast
path of the CLI tests is proven equal to the slow one, and it leaves the test process as it found it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support import TESTS
from support.cli import run_main

FIXTURES = TESTS / "fixtures"
SUMMARY = FIXTURES / "summaries" / "traceml_ai" / "tai-reference" / "final_summary.json"

#: Commands whose output and exit code a test reads in-process: success, refusal, usage error, bad input.
CASES = [
    ["--help"],
    ["--version"],
    ["bogus"],
    ["view", str(SUMMARY)],
    ["view", "missing.json"],
    ["compare", str(SUMMARY)],
    ["compare", str(SUMMARY), str(SUMMARY), "--output", "out/pair", "--format", "json"],
    ["validate", "status", str(FIXTURES / "runs" / "hygiene"), "--json"],
    ["validate", "status", "not-a-run"],
    ["curve", "missing"],
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(a[:2]) + f" ({i})" for i, a in enumerate(CASES)])
def test_in_process_equals_the_real_process(args, tmp_path, traceml_cmd, cli_env):
    (tmp_path / "real").mkdir()
    (tmp_path / "inproc").mkdir()
    real = subprocess.run([*traceml_cmd, *args], cwd=tmp_path / "real", env=cli_env, capture_output=True,
                          text=True, timeout=120)
    inproc = run_main(args, cwd=tmp_path / "inproc", env=cli_env)
    assert (inproc.returncode, inproc.stdout, inproc.stderr) == (real.returncode, real.stdout, real.stderr)
    # and the files it wrote, in its own working folder
    written = {p.relative_to(tmp_path / "real").as_posix(): p.read_bytes()
               for p in sorted((tmp_path / "real").rglob("*")) if p.is_file()}
    assert {p.relative_to(tmp_path / "inproc").as_posix(): p.read_bytes()
            for p in sorted((tmp_path / "inproc").rglob("*")) if p.is_file()} == written


def test_the_test_process_is_left_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEML_SUPPORT_CLI_PROBE", "kept")
    before_env, before_cwd = dict(os.environ), os.getcwd()
    proc = run_main(["compare", "--bogus"], cwd=tmp_path, env={"PATH": os.environ.get("PATH", "")})
    assert proc.returncode == 2 and proc.stdout == "" and "usage error" in proc.stderr
    assert dict(os.environ) == before_env and os.getcwd() == before_cwd
    assert Path.cwd() != tmp_path
