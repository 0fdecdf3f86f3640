"""Every `traceml` command says a bad command line the same way: one stderr line, exit 2.

The line is ``PROG: usage error: WHAT (see `PROG --help`)`` (core/cliargs.py ``usage_line``) whatever the
command, so a CI log or a login-node terminal shows what is wrong and where to look, and a script can tell a
usage error (2) from a verdict or a refusal.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from support.cli import run_main

#: (arguments, the prog the line must name, words it must hold)
CASES = [
    (["--bogus"], "traceml", "unknown command '--bogus'"),
    (["bogus"], "traceml", "unknown command 'bogus'"),
    (["run", "train.py", "--bogus"], "traceml run", "unrecognized arguments: --bogus"),
    (["run"], "traceml run", "required: script"),
    (["compare", "a.json", "b.json", "--bogus"], "traceml compare", "unrecognized arguments: --bogus"),
    (["view", "a.json", "--bogus"], "traceml view", "unrecognized arguments: --bogus"),
    (["daemon", "--bogus"], "traceml daemon", "unrecognized arguments: --bogus"),
    (["status", "--bogus"], "traceml status", "unrecognized arguments: --bogus"),
    (["watch", "--bogus"], "traceml watch", "unrecognized arguments: --bogus"),
    (["validate"], "traceml validate", "give a subcommand"),
    (["validate", "bogus"], "traceml validate", "unknown subcommand 'bogus'"),
    (["validate", "drain", "run", "--bogus"], "traceml validate drain", "unrecognized arguments: --bogus"),
    (["validate", "status"], "traceml validate status", "required: run_dir"),
    (["curve", "run", "--bogus"], "traceml curve", "unrecognized arguments: --bogus"),
    (["export", "trackio", "run", "--bogus"], "traceml export", "unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize("args,prog,words", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_usage_error_is_one_line_naming_the_command_and_exit_2(args, prog, words, tmp_path, cli_env):
    # in-process (support/cli.py); the entry point itself is the subprocess test below
    proc = run_main(args, cwd=tmp_path, env=cli_env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    match = re.fullmatch(rf"{re.escape(prog)}: usage error: (.+) \(see `{re.escape(prog)} --help`\)", line)
    assert match and words in match.group(1), line
    assert list(tmp_path.iterdir()) == []  # a refused command line writes nothing


def test_traceml_alone_lists_the_commands_on_stderr_and_exits_2(tmp_path, cli_env):
    """The real `python -m traceml_tui` entry point."""
    proc = subprocess.run([sys.executable, "-m", "traceml_tui"], cwd=tmp_path, env=cli_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "commands:" in proc.stderr and "compare" in proc.stderr
    helped = subprocess.run([sys.executable, "-m", "traceml_tui", "--help"], cwd=tmp_path, env=cli_env,
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "commands:" in helped.stdout
