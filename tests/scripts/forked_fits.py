"""Run several one-process training scripts from one interpreter that imported their framework once.

    python -m traceml_tui.integrations.bootstrap forked_fits.py SPEC.json

A Lightning process spends most of its CPU importing Lightning (docs/trainers.md, "The tests, and what they
cost"), so the one-process fits of the trainer tests (tests/support/integrations.py, :class:`Fit`) share
this process: it is started through traceml's bootstrap like a rank of `traceml run`, imports the modules
SPEC names (``preload``; the bootstrap's import hook attaches to the trainer module as it loads, as in a
script), then forks one child per fit, one at a time. Each child is a fresh process in every other way: it
changes to the fit's working folder, sends its stdout and stderr to the fit's files and runs the fit's
script through the bootstrap exactly as ``python -m traceml_tui.integrations.bootstrap SCRIPT ARGS`` would
(as ``__main__``; an uncaught exception or ``sys.exit`` is the child's exit status; the interpreter's own
exit, atexit handlers included, ends it). Nothing of traceml ran before the fork: every child starts its
own traceml session, and the parent writes ``{name: exit status}`` to SPEC's ``results`` file.

SPEC: ``{"preload": [module, ...], "results": path, "timeout_s": seconds per fit,
"fits": [{"name", "script", "args", "cwd", "stdout", "stderr"}, ...]}``.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time


def _child(fit: dict) -> None:
    """In the forked child: become ``python -m bootstrap SCRIPT ARGS`` started in the fit's folder; never returns."""
    os.chdir(fit["cwd"])
    for fd, path in ((1, fit["stdout"]), (2, fit["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    from traceml_tui.integrations import bootstrap

    bootstrap.main([fit["script"], *fit["args"]])
    raise SystemExit(0)  # the script returned: exit as the interpreter would, never back into the parent's loop


def _wait(pid: int, timeout_s: float) -> int:
    """The child's exit status (negative: the signal that ended it); killed after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        time.sleep(0.05)


with open(sys.argv[1]) as source:
    spec = json.load(source)
for module in spec["preload"]:
    importlib.import_module(module)
if threading.active_count() != 1:  # a thread does not survive fork(): the children would be broken copies
    sys.exit(f"forked_fits: {threading.active_count()} threads after importing {spec['preload']}; cannot fork safely")
results: dict[str, int] = {}
for fit in spec["fits"]:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(fit)
    results[fit["name"]] = _wait(pid, float(spec["timeout_s"]))
    with open(spec["results"], "w") as handle:  # after each fit: a fit that hangs still leaves the others' results
        json.dump(results, handle)
