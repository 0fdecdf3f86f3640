"""A run started without ``traceml run`` ends with ``final_summary.json`` (docs/run.md; seed 000).

Real training, no launcher: ``python tests/scripts/ddp_train.py`` (one process) and plain
``torchrun --standalone --nproc-per-node 2`` (2-rank gloo DDP). Rank 0 writes the summary once, at
exit, after the other rank's ``rank_end``; ``run_context`` is an empty object; it covers every rank;
an existing summary is never overwritten.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.core import artifacts, records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

DDP_SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"
STEPS = 5


def _env(tmp_path: Path) -> dict[str, str]:
    from support.realruns import subprocess_env

    return subprocess_env(tmp_path / "state")


def _only_run(logs: Path) -> Path:
    (run_dir,) = [p for p in logs.iterdir() if p.is_dir()]
    return run_dir


def _summary(run_dir: Path) -> dict:
    data = (run_dir / "final_summary.json").read_bytes()
    assert artifacts.decode_summary(data) is not None  # the shape `traceml compare` and the daemon read
    return json.loads(data)


def _ends(run_dir: Path, rank: int) -> list[records.RankEnd]:
    lines = (run_dir / "ranks" / f"rank_{rank}" / "steps-0.jsonl").read_bytes().splitlines()
    return [r for r in map(records.decode, lines) if isinstance(r, records.RankEnd)]


def test_a_direct_one_process_run_writes_its_summary(tmp_path):
    done = subprocess.run([sys.executable, str(DDP_SCRIPT), "--steps", str(STEPS)], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    run_dir = _only_run(tmp_path / "logs")
    summary = _summary(run_dir)
    assert summary["run_context"] == {}
    assert summary["meta"]["world_size"] == 1 and summary["meta"]["run_name"] == run_dir.name
    window = summary["step_time"]["global"]["window"]
    assert (window["steps_analyzed"], window["start_step"], window["end_step"]) == (STEPS, 1, STEPS)
    assert summary["step_time"]["global"]["average"]["step_time_ms"] > 0
    assert summary["training"]["steps_completed"] == STEPS
    assert (run_dir / "final_summary.txt").read_text().rstrip("\n") == summary["text"]
    assert f"traceml: summary: logs/{run_dir.name}/final_summary.json" in done.stderr
    assert str(tmp_path) not in (run_dir / "final_summary.json").read_text()  # no absolute path in the artifact


def test_plain_torchrun_two_ranks_summary_covers_both(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run([*torchrun, str(DDP_SCRIPT), "--steps", str(STEPS)], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = _only_run(tmp_path / "logs")
    summary = _summary(run_dir)
    assert summary["run_context"] == {}
    assert summary["meta"]["world_size"] == 2
    assert sorted(summary["step_time"]["groups"]["rows"]) == ["0", "1"]
    window = summary["step_time"]["global"]["window"]
    assert (window["steps_analyzed"], window["end_step"]) == (STEPS, STEPS)
    # rank 0 waited for rank 1's end record: the summary was written after both ranks ended
    written = os.stat(run_dir / "final_summary.json").st_mtime
    for rank in (0, 1):
        (end,) = _ends(run_dir, rank)
        assert end.ts <= written + 1e-3
    assert done.stderr.count("traceml: summary:") == 1  # rank 0 only
    assert "had not ended" not in done.stderr

    # What rank 0 waits on: rank 1's newest attempt ending with its rank_end line (this run's own files).
    from traceml_tui.sdk import direct

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    rank1 = copy / "ranks" / "rank_1" / "steps-0.jsonl"
    whole = rank1.read_bytes()
    assert direct.rank_ended(copy, 1) and direct.wait_for_peers(copy, 2, timeout_s=0.0) == []
    rank1.write_bytes(whole[: whole.rstrip(b"\n").rfind(b"\n") + 1])  # rank 1 still running: no end record yet
    assert not direct.rank_ended(copy, 1)
    assert direct.wait_for_peers(copy, 2, timeout_s=0.2) == [1]
    rank1.write_bytes(whole[:-1])  # the end record half written: not ended yet
    assert not direct.rank_ended(copy, 1)


_TWICE = """
import sys
import traceml_tui as traceml
traceml.init("same-name")
with traceml.trace_step():
    pass
traceml.log(loss=float(sys.argv[1]))
with traceml.trace_step():
    pass
"""


def test_an_existing_summary_is_never_overwritten(tmp_path):
    """The same run name run again (a new attempt): the first summary stands, byte for byte."""
    script = tmp_path / "twice.py"
    script.write_text(_TWICE)
    env = _env(tmp_path)
    first = subprocess.run([sys.executable, str(script), "1.0"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    path = tmp_path / "logs" / "same-name" / "final_summary.json"
    before = path.read_bytes()
    second = subprocess.run([sys.executable, str(script), "2.0"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "logs" / "same-name" / "ranks" / "rank_0" / "steps-1.jsonl").is_file()  # it did run
    assert path.read_bytes() == before
    assert "traceml: summary:" not in second.stderr


def test_under_the_launcher_the_sdk_leaves_the_summary_to_it(tmp_path):
    """A rank with TRACEML_RUN_DIR set writes no summary of its own (the launcher writes it after training)."""
    script = tmp_path / "one.py"
    script.write_text(_TWICE)
    env = dict(_env(tmp_path), TRACEML_RUN_DIR=str(tmp_path / "run"), TRACEML_RUN_NAME="run")
    done = subprocess.run([sys.executable, str(script), "1.0"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "ranks" / "rank_0" / "steps-0.jsonl").is_file()
    assert not (tmp_path / "run" / "final_summary.json").exists()


def test_two_sessions_of_one_run_folder_share_one_summary_over_both(tmp_path):
    # init() -> steps -> finish() -> init() of the same run -> steps -> exit, no launcher: the summary, written
    # once at exit, covers the second session's steps too (every session is closed before any summary is
    # written; the second session's summary once came first and left out its held steps and rank_end).
    script = tmp_path / "two.py"
    script.write_text(
        "import time\nimport traceml_tui as traceml\n"
        "for session in range(2):\n"
        "    traceml.init('r')\n"
        "    for step in range(3):\n"
        "        with traceml.trace_step():\n"
        "            time.sleep(0.001)\n"
        "    if session == 0:\n"
        "        traceml.finish()\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    run_dir = tmp_path / "logs" / "r"
    assert sorted(p.name for p in (run_dir / "ranks" / "rank_0").glob("steps-*.jsonl")) == \
        ["steps-0.jsonl", "steps-1.jsonl"]
    window = _summary(run_dir)["step_time"]["global"]["window"]
    assert window["end_step"] == 6
