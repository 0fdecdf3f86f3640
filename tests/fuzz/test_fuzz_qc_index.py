"""The heavy QC backlog in the index against damaged files (docs/qc.md "In the index", docs/security.md "Fuzzing").

Start: the committed real hygiene run with a heavy QC backlog made by the real code
(``fixture_runs.declare_worker_qc``: QC requests, receipts, failures, one blocked), indexed by one pass of the
real daemon. Each example damages one of its QC files. Contract — one implementation, two kinds:

* the daemon's side-file parser stores a QC file's error exactly when the backlog decoder refuses it, with the
  file side's line word for word;
* the index side's worker-QC report (``reader.backlog.worker_qc``: what ``traceml status --json``, the metrics
  and the Backlog screen show) equals the file side's (``qc_backlog.worker_qc_report``: the summary's) — the
  same entries, the same word by ``core.state.decide_worker_qc``, the same error lines;
* pending or failed QC is never ``passed``: a damaged file never turns the blocked request into a pass.
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
from hypothesis import strategies as st

from daemon import sidefiles
from daemon.reader import Reader
from traceml_tui.core import hygiene_files
from traceml_tui.core.rundir import BACKLOG_SIDE_KINDS
from traceml_tui.hygiene import qc_backlog

from support import fixture_runs
from support.fuzz_mutations import damaged


@pytest.fixture(scope="module")
def heavy_qc(tmp_path_factory):
    """The copied hygiene run with its QC backlog, and its index built by one pass of the real daemon."""
    base = tmp_path_factory.mktemp("fuzz-qc-index")
    root = base / "logs"
    root.mkdir()
    shutil.copytree(fixture_runs.FIXTURE_RUNS / fixture_runs.name_of("hygiene"), root / fixture_runs.name_of("hygiene"))
    run = fixture_runs.declare_worker_qc(root, base)
    index = base / "idx.sqlite"
    env = {**os.environ, "XDG_STATE_HOME": str(base / "state")}
    subprocess.run([sys.executable, "-m", "traceml_tui", "daemon", str(root), "--once", "--no-inotify",
                    "--index", str(index)], env=env, check=True, capture_output=True, timeout=300)
    with Reader(index) as reader:
        (summary,) = reader.list_runs()
    files = sorted(p.relative_to(run).as_posix() for p in (run / "qc").glob("*/*.json"))
    assert len(files) == 9  # 3 requests, 2 receipts, 4 failures (update 4 once, update 8 three times)
    return run, index, summary.run_id, files


def test_the_fixture_qc_backlog_is_indexed_as_the_files_hold_it(heavy_qc):
    run, index, run_id, _ = heavy_qc
    with Reader(index) as reader:
        report = reader.backlog.worker_qc(run_id)
    assert report == qc_backlog.worker_qc_report(run)
    assert report["state"] == "failed" and report["counts"] == {"blocked": 1, "completed": 2}


@given(data=st.data())
def test_index_side_worker_qc_equals_the_file_side_for_any_damaged_qc_file(heavy_qc, data):
    run, index, run_id, files = heavy_qc
    rel = data.draw(st.sampled_from(files), label="file")
    path = run / rel
    original = path.read_bytes()
    bad_bytes = data.draw(damaged(original), label="bytes")
    folder, name = Path(rel).parent.name, Path(rel).name
    try:
        hygiene_files.decode_named(folder, name, bad_bytes)
        refused = None
    except hygiene_files.DamagedFile as exc:
        refused = f"{rel}: {exc}"

    # what the daemon stores for these bytes (its one parser), put in place of the file's row
    stored = sidefiles.parse(BACKLOG_SIDE_KINDS["qc"][folder], rel, Path(rel).stem, bad_bytes)
    assert stored.error == refused  # an error exactly when the decoder refuses it, in the file side's words
    with sqlite3.connect(index) as conn:
        before = conn.execute("SELECT key, content, error FROM side_files WHERE run_id = ? AND path = ?",
                              (run_id, rel)).fetchone()
        conn.execute("UPDATE side_files SET key = ?, content = ?, error = ? WHERE run_id = ? AND path = ?",
                     (stored.key, stored.content, stored.error, run_id, rel))
    path.write_bytes(bad_bytes)
    try:
        with Reader(index) as reader:
            index_side = reader.backlog.worker_qc(run_id)
        file_side = qc_backlog.worker_qc_report(run)
    finally:
        path.write_bytes(original)
        with sqlite3.connect(index) as conn:
            conn.execute("UPDATE side_files SET key = ?, content = ?, error = ? WHERE run_id = ? AND path = ?",
                         (*before, run_id, rel))
    assert index_side == file_side
    assert index_side["state"] != "passed"  # the blocked request (or a damaged one) is never a pass


def test_a_damaged_blocked_request_never_lets_worker_qc_pass(heavy_qc, tmp_path):
    """Found by the property above: a damaged request has no entry, so the blocked request it was would leave two
    completed ones — "passed". It counts as blocked instead, on both sides, and the not-passed line names it."""
    run, _, _, _ = heavy_qc
    copy = tmp_path / "logs" / run.name
    shutil.copytree(run, copy)
    (copy / "qc/requests/step-00000008.json").write_bytes(b"")
    index = tmp_path / "idx.sqlite"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    subprocess.run([sys.executable, "-m", "traceml_tui", "daemon", str(copy.parent), "--once", "--no-inotify",
                    "--index", str(index)], env=env, check=True, capture_output=True, timeout=300)
    with Reader(index) as reader:
        (summary,) = reader.list_runs()
        report = reader.backlog.worker_qc(summary.run_id)
    assert report == qc_backlog.worker_qc_report(copy)
    assert report["state"] == "failed" and report["counts"] == {"completed": 2} and report["outstanding"] == []
    assert qc_backlog.not_passed_line(report) == (
        "worker QC not passed (failed): damaged QC request file(s): qc/requests/step-00000008.json")
