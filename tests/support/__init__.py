"""Helpers shared by the tests (no tests here); pytest puts ``tests/`` on ``sys.path`` (``pythonpath`` in
pyproject.toml), so a test writes ``from support import realruns``.

- ``realruns``: real run directories made by the real SDK and ``traceml run`` (the ``real_runs`` fixture).
- ``shared_runs``: those real runs built once per test session, shared by parallel workers.
- ``parallel``, ``lanes``: the suite on pytest-xdist workers, and the rule that keeps the fast lane fast.
- ``fixture_runs``: the committed real runs under ``tests/fixtures/runs`` and live copies of them.
- ``tui_data``: index builders and App drivers for the screen tests.
- ``fake_source``: a fake ``Source`` for screen tests, serving snapshots the real reader took of the committed runs.
- ``daemon_files``: writers of rank streams for the daemon tests (also a writer process: ``python -m``).
- ``integrations``: launch and read the Hugging Face / Lightning example runs.
- ``fuzz_streams``, ``fuzz_mutations``: hypothesis strategies of damaged streams and files.
- ``cli``: the ``traceml`` command run in the test process (``run_main``), for tests of a command's output.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

#: The ``tests/`` folder and the repository root.
TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def python_env(env: Optional[dict[str, str]] = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with ``tests/`` and the repository first on
    ``PYTHONPATH``, so that a ``python -m support.…`` or ``python -c`` subprocess imports these helpers and
    this checkout's code."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), str(REPO), env.get("PYTHONPATH", "")) if p)
    return env
