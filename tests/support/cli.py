"""The `traceml` command run inside the test process: argument handling and output without a new interpreter.

A subprocess of ``python -m traceml_tui`` pays an interpreter start and the package's imports on every call
(0.1–0.4 s of CPU); a test whose subject is what a command prints, writes and returns calls
:func:`traceml_tui.cli.main` here instead, with the environment, working folder, stdout and stderr a
subprocess would have, and gets the same :class:`subprocess.CompletedProcess` back. What only a real process
shows stays a subprocess test: the ``python -m traceml_tui`` entry point itself (one test per command), a
closed stdout pipe, which modules a command imports, signals (README, "test lanes").
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional, Union


def _exit_code(code: object) -> int:
    """The process exit status ``sys.exit(code)`` gives: None is 0, an int is itself, anything else 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def run_main(args: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
             cwd: Optional[Union[str, Path]] = None, stdin: str = "") -> subprocess.CompletedProcess:
    """Run ``traceml ARGS`` in this process and return what a subprocess would: exit code, stdout, stderr.

    ``env`` replaces the whole environment for the call (as ``subprocess.run(env=...)`` does) and ``cwd`` the
    working folder; both, and ``sys.stdin``/``sys.stdout``/``sys.stderr``, are restored afterwards. A
    ``SystemExit`` (argparse) becomes its exit code; any other exception propagates, so a crash fails the
    test with its traceback instead of hiding in a captured stderr.
    """
    from traceml_tui.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                _stdin(io.StringIO(stdin)):
            try:
                code = _exit_code(main(list(args)))
            except SystemExit as exc:
                code = _exit_code(exc.code)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["traceml", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _stdin(stream: io.StringIO):
    import sys

    saved = sys.stdin
    sys.stdin = stream
    try:
        yield
    finally:
        sys.stdin = saved
