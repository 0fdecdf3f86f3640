"""Shared fixtures: a clean environment for subprocesses of the real CLI."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for `traceml …` subprocesses: one BLAS thread, a private state dir."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env.pop("TRACEML_RUN_DIR", None)
    return env


@pytest.fixture
def traceml_cmd() -> list[str]:
    """The `traceml` command as run by users (module form: no PATH dependence)."""
    return [sys.executable, "-m", "traceml_tui"]
