"""Fault-injection tests of the daemon (``pytest -m faults``): one bad file, a full disk, a damaged index…"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from daemon.reader import Reader
from daemon.service import Ingester


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "logs"
        self.root.mkdir()
        self.index = tmp_path / "state" / "index.sqlite"

    def ingest(self, **kw) -> int:
        ing = Ingester(self.index, [str(self.root)], poll_interval=0.05, use_inotify=False, **kw)
        try:
            return ing.run_once()
        finally:
            ing.close()

    def run(self, name: str):
        """(summary, step count, errors, events) of one run."""
        with Reader(self.index) as r:
            run = r.find_run(name)
            assert run is not None, f"run {name} not in the index"
            return run, r.series.step_count(run.run_id), r.events.errors(run.run_id), r.events.recent(run.run_id)

    def cli(self, *args: str, index: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "traceml_tui", *args, "--index", str(index or self.index)],
                              capture_output=True, text=True, timeout=120)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)

