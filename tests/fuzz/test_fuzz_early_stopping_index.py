"""``early_stopping.json`` on the index side against damage (docs/security.md, "Fuzzing"; docs/daemon.md).

Start: the state the real :class:`EarlyStopping` writes over the committed hygiene run's receipts, indexed by
one pass of the real daemon. Each example damages the file's bytes. Contract: the daemon's pure side-file
parser never raises; it keeps the text of any JSON object and gives an error (one line, naming the file)
exactly when the policy's own decoder refuses the bytes; the reader then shows the policy's view of those very
bytes, or no state at all for a damaged file — never figures read by another rule.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given

from daemon import sidefiles
from daemon.reader import Reader
from traceml_tui.core import hygiene_files, stopping
from traceml_tui.core.rundir import EARLY_STOPPING, RunDir
from traceml_tui.hygiene.early_stopping import EarlyStopping

from support.fuzz_mutations import damaged

FIXTURE = Path(__file__).parents[1] / "fixtures" / "runs" / "hygiene"


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """The hygiene run with a state written by the real policy, indexed by the real daemon; (index, run id, bytes)."""
    base = tmp_path_factory.mktemp("fuzz-es-index")
    run = base / "logs" / "hygiene"
    shutil.copytree(FIXTURE, run)
    EarlyStopping(run, metric="r2", direction="max", min_delta=0.01, patience=2).update(step=10)
    index = base / "idx.sqlite"
    env = {**os.environ, "XDG_STATE_HOME": str(base / "state")}
    subprocess.run([sys.executable, "-m", "traceml_tui", "daemon", str(run.parent), "--once", "--no-inotify",
                    "--index", str(index)], env=env, check=True, capture_output=True, timeout=300)
    with Reader(index) as reader:
        (summary,) = reader.list_runs()
        assert reader.backlog.early_stopping(summary.run_id) is not None
    return index, summary.run_id, RunDir(run).early_stopping.read_bytes()


def test_damaged_states_are_one_error_or_the_policys_view(indexed):
    index, run_id, good = indexed

    @given(data=damaged(good))
    def check(data):
        read = sidefiles.parse("early_stopping", EARLY_STOPPING, None, data)
        try:
            decoded = hygiene_files.decode_early_stopping(data)
        except hygiene_files.DamagedFile:
            decoded = None
        assert (read.error is None) == (decoded is not None and read.content is not None)
        if read.error is not None:
            assert "\n" not in read.error and read.error.startswith(f"{EARLY_STOPPING}: ")
        with sqlite3.connect(index) as conn:
            before = conn.execute("SELECT content, error FROM side_files WHERE run_id = ? AND kind = 'early_stopping'",
                                  (run_id,)).fetchone()
            conn.execute("UPDATE side_files SET content = ?, error = ? WHERE run_id = ? AND kind = 'early_stopping'",
                         (read.content, read.error, run_id))
        try:
            with Reader(index) as reader:
                view = reader.backlog.early_stopping(run_id)
        finally:
            with sqlite3.connect(index) as conn:
                conn.execute("UPDATE side_files SET content = ?, error = ? WHERE run_id = ?"
                             " AND kind = 'early_stopping'", (*before, run_id))
        assert view == (stopping.stopping_view(decoded) if read.error is None else None)

    check()
