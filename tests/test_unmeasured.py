"""Unmeasured streams, end to end: ``traceml.report_unmeasured`` in a real 2-rank run, read by every surface.

One real ``traceml run --nproc-per-node 2`` of ``tests/scripts/unmeasured_train.py``
(gloo DDP) whose ranks report ``forward`` dark (rank 1 also ``lr``), each twice,
before anything else of traceml. The records, rank 0's stderr line, the daemon's
index (a real ``traceml daemon --once``), the summary and ``traceml status`` must
all say which streams are missing and why, in the words of ``core/coverage.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.core import coverage, records

from support.cli import run_main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SCRIPT = Path(__file__).parent / "scripts" / "unmeasured_train.py"
FORWARD_WHY = "the step is traced without its model"
LR_WHY = "no scheduler was reachable from this rank"


def _cli(args: list[str], env: dict, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_tui", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def dark_run(tmp_path_factory):
    """(run_dir, launcher result, env, work dir) of the real run."""
    from support.realruns import subprocess_env

    work = tmp_path_factory.mktemp("unmeasured")
    env = subprocess_env(work / "state")
    logs = work / "logs"
    proc = _cli(["run", str(SCRIPT), "--run-name", "dark", "--logs-dir", str(logs), "--nproc-per-node", "2",
                 "--args", "--report", "forward", FORWARD_WHY, "--report-rank1", "lr", LR_WHY], env, work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return logs / "dark", proc, env, work


def _unmeasured_records(run_dir: Path, rank: int) -> list[records.Unmeasured]:
    lines = (run_dir / "ranks" / f"rank_{rank}" / "steps-0.jsonl").read_bytes().splitlines()
    return [r for r in map(records.decode, lines) if isinstance(r, records.Unmeasured)]


def test_one_record_per_stream_per_rank(dark_run):
    """Reported twice, written once; the report before init started the session (the header comes first)."""
    run_dir, _proc, _env, _work = dark_run
    rank0 = _unmeasured_records(run_dir, 0)
    rank1 = _unmeasured_records(run_dir, 1)
    assert [(r.rank, r.stream, r.reason) for r in rank0] == [(0, "forward", FORWARD_WHY)]
    assert [(r.rank, r.stream, r.reason) for r in rank1] == [(1, "forward", FORWARD_WHY), (1, "lr", LR_WHY)]
    first = records.decode((run_dir / "ranks" / "rank_0" / "steps-0.jsonl").read_bytes().splitlines()[0])
    assert isinstance(first, records.Header)


def test_rank0_prints_the_line_once(dark_run):
    run_dir, proc, _env, _work = dark_run
    line = "traceml: " + coverage.unmeasured_line("forward", FORWARD_WHY)
    stderr = (run_dir / "nodes" / "node_0" / "training.stderr.log").read_text()
    assert stderr.count(line) == 1, stderr[-2000:]
    assert "lr not measured" not in stderr  # rank 1's own stream: its records and the summary say it


@pytest.fixture(scope="module")
def dark_index(dark_run, tmp_path_factory):
    """The index a real ``traceml daemon --once`` made of the run (read, never written, by the tests)."""
    run_dir, _proc, env, work = dark_run
    index = tmp_path_factory.mktemp("dark-index") / "index.sqlite"
    done = _cli(["daemon", str(run_dir.parent), "--once", "--index", str(index), "--no-inotify"], env, work)
    assert done.returncode == 0, done.stderr
    return index


def test_daemon_indexes_the_records(dark_index):
    """No ingest error for the new kind; the reader lists each rank's dark streams."""
    from daemon.reader import Reader

    with Reader(dark_index) as reader:
        (run,) = reader.list_runs()
        assert reader.events.errors(run.run_id) == ()
        assert list(reader.events.unmeasured(run.run_id)) == [
            {"rank": 0, "stream": "forward", "reason": FORWARD_WHY},
            {"rank": 1, "stream": "forward", "reason": FORWARD_WHY},
            {"rank": 1, "stream": "lr", "reason": LR_WHY},
        ]


EXPECTED = [
    {"rank": 0, "stream": "forward", "reason": FORWARD_WHY},
    {"rank": 1, "stream": "forward", "reason": FORWARD_WHY},
    {"rank": 1, "stream": "lr", "reason": LR_WHY},
]


def test_the_summary_names_the_dark_streams(dark_run):
    """`integration.unmeasured` beside `training`; one card line per stream and reason, naming the ranks."""
    run_dir, proc, _env, _work = dark_run
    summary = json.loads((run_dir / "final_summary.json").read_text())
    assert summary["integration"] == {"steps_traced": True, "unmeasured": EXPECTED}
    text = (run_dir / "final_summary.txt").read_text()
    assert f"Unmeasured: forward not measured (ranks 0, 1): {FORWARD_WHY}" in text.splitlines()
    assert f"Unmeasured: lr not measured (rank 1): {LR_WHY}" in text.splitlines()
    assert summary["text"] in proc.stderr  # the card the launcher printed
    assert coverage.NO_STEP_LINE not in proc.stderr  # steps were traced


def test_status_says_which_run_has_dark_streams(dark_run, dark_index):
    """`traceml status` (table and --json) shows what the summary says, for the same records in the index
    (in this process: support/cli.py; README "test lanes")."""
    run_dir, _proc, env, work = dark_run
    index = dark_index
    as_json = run_main(["status", "--json", "--index", str(index)], env=env, cwd=work)
    assert as_json.returncode == 0, as_json.stderr
    (run,) = json.loads(as_json.stdout)["runs"]
    summary = json.loads((run_dir / "final_summary.json").read_text())
    assert run["unmeasured"] == summary["integration"]["unmeasured"] == EXPECTED
    table = run_main(["status", "--index", str(index)], env=env, cwd=work)
    header, row = table.stdout.splitlines()[:2]
    at = header.index("UNMEASURED")
    assert row[at:].split()[0] == "forward,lr", table.stdout
    assert header.index("DIR") == row.index(str(run_dir))  # the columns after it stay aligned


@pytest.mark.realruns("completed")
def test_status_of_a_run_without_dark_streams_shows_a_dash(real_runs, tmp_path):
    run = real_runs["completed"]
    env = dict(os.environ)
    index = tmp_path / "index.sqlite"
    assert _cli(["daemon", str(run.logs_dir), "--once", "--index", str(index), "--no-inotify"], env, tmp_path
                ).returncode == 0
    (row,) = json.loads(run_main(["status", "--json", "--index", str(index)], env=env, cwd=tmp_path).stdout)["runs"]
    assert row["unmeasured"] == []
    header, line = run_main(["status", "--index", str(index)], env=env, cwd=tmp_path).stdout.splitlines()[:2]
    assert line[header.index("UNMEASURED"):].split()[0] == "-"


_FAIL_OPEN = r"""
import os, sys
import traceml_tui as traceml
from traceml_tui.core import records
traceml.report_unmeasured("forward", "first")            # starts the session (no init() before)
traceml.report_unmeasured(None, "not a string stream")   # ignored, no exception
traceml.report_unmeasured("", "empty stream")            # ignored
traceml.report_unmeasured("lr", object())                # any reason is made a line of text
traceml.report_unmeasured("eval", "x" * 5000)            # cut to the record's bound
traceml.finish()
traceml.report_unmeasured("loss", "after finish")        # nothing: the rank has ended
session = traceml.current_run()
lines = session.path.read_bytes().splitlines()
got = [(r.stream, len(r.reason)) for r in map(records.decode, lines) if isinstance(r, records.Unmeasured)]
print(got)
"""

_BROKEN_RUN_DIR = r"""
import traceml_tui as traceml
traceml.report_unmeasured("all", "the run directory cannot be created")
print("still running")
"""


def test_report_unmeasured_is_fail_open(tmp_path, cli_env):
    """Odd arguments, a finished session and a run directory that cannot exist never raise."""
    done = subprocess.run([sys.executable, "-c", _FAIL_OPEN], cwd=tmp_path, env=cli_env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    got = eval(done.stdout.strip())  # noqa: S307 - our own subprocess's repr of a list of tuples
    assert [stream for stream, _ in got] == ["forward", "lr", "eval"]
    assert got[2][1] == records.MAX_REASON_CHARS
    assert done.stderr.count("not measured") == 3  # rank 0: one line per recorded stream

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    env = dict(cli_env, TRACEML_RUN_DIR=str(blocker / "run"))
    done = subprocess.run([sys.executable, "-c", _BROKEN_RUN_DIR], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "still running", done.stderr
