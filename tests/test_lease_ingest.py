"""The launcher lease from writer to word: the real LeaseKeeper (run/lease.py) beats, a real Ingester reads it
into a real SQLite index, the Reader decides with core.state. The ingester's clock is injected, so "not seen
to change for L" is exact here; tests/test_run_lease.py proves the same on real launches and processes."""

from __future__ import annotations

import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from daemon.reader import Reader
from daemon.service import Ingester
from traceml_tui.core import lease as core_lease
from traceml_tui.core.rundir import RunDir
from traceml_tui.core.state import RunStatus
from traceml_tui.run.cli import parse_options
from traceml_tui.run.lease import LeaseKeeper
from traceml_tui.run.options import LaunchError

L = 2.0


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _keeper(run: RunDir, node: int) -> LeaseKeeper:
    """A real keeper whose beats the test triggers itself (no thread: the test is the clock)."""
    run.node_dir(node).mkdir(parents=True, exist_ok=True)
    keeper = LeaseKeeper(run.lease(node), node, L)
    keeper._write()
    return keeper


@pytest.fixture
def world(tmp_path: Path):
    root = tmp_path / "logs"
    run = RunDir(root / "r1")
    clock = Clock()
    ingester = Ingester(tmp_path / "index.sqlite", [str(root)], use_inotify=False, clock=clock)
    yield run, clock, ingester, tmp_path / "index.sqlite"
    ingester.close()


def _status(index: Path, now: float):
    with Reader(index) as reader:
        (run,) = reader.list_runs(now=now)
        return run


def test_a_lease_that_stops_changing_expires_by_the_ingesters_clock_and_revives_when_it_beats(world) -> None:
    run, clock, ingester, index = world
    keeper = _keeper(run, 0)
    ingester.run_once()
    assert _status(index, clock.t).status is RunStatus.RUNNING
    clock.t += L - 0.5  # no beat, but not yet the lease
    ingester.run_once()
    assert _status(index, clock.t).status is RunStatus.RUNNING
    clock.t += 1.0  # unchanged for longer than the lease, seen at two looks
    ingester.run_once()
    assert _status(index, clock.t).status is RunStatus.LOST
    # the reader's own "now" plays no part: an hour later without a look it is still the same word
    assert _status(index, clock.t + 3600).status is RunStatus.LOST
    keeper._write()  # it beats again (a stopped launcher continued): live
    clock.t += 0.1
    ingester.run_once()
    assert _status(index, clock.t).status is RunStatus.RUNNING
    keeper.finish()  # the done beat: never expires
    clock.t += 100 * L
    ingester.run_once()
    clock.t += 100 * L
    ingester.run_once()
    assert _status(index, clock.t).status is RunStatus.RUNNING  # no final word, no rank: nothing says more


def test_a_beating_lease_never_expires_however_far_apart_the_looks(world) -> None:
    run, clock, ingester, index = world
    keeper = _keeper(run, 0)
    for _ in range(4):
        ingester.run_once()
        clock.t += 10 * L  # the ingester looks rarely (a cron `--once`); every look sees a new beat
        keeper._write()
    ingester.run_once()
    assert _status(index, clock.t).status is RunStatus.RUNNING


def test_one_node_of_two_expired_is_named_and_the_rest_of_the_run_goes_on(world) -> None:
    run, clock, ingester, index = world
    k0, _k1 = _keeper(run, 0), _keeper(run, 1)
    ingester.run_once()
    for _ in range(3):
        clock.t += L * 0.75
        k0._write()
        ingester.run_once()
    summary = _status(index, clock.t)
    assert summary.lost_nodes == (1,) and summary.status is RunStatus.RUNNING
    assert summary.status_text == "running · lost node 1"
    k0.finish()  # node 0 ends; no final word (no manifest here) and no lease lives: the run is lost
    clock.t += 0.1
    ingester.run_once()
    summary = _status(index, clock.t)
    assert summary.status is RunStatus.LOST and summary.lost_nodes == (1,)


def test_a_file_that_is_not_a_lease_is_one_error_row_and_changes_no_word(world) -> None:
    run, clock, ingester, index = world
    run.node_dir(0).mkdir(parents=True)
    run.lease(0).write_bytes(b'{"v":1,"kind":"lease","node":0,"launch":"x","beat":1,"lease_s":NaN,"state":"live"}')
    for _ in range(3):
        ingester.run_once()
        clock.t += 10 * L
    summary = _status(index, clock.t)
    assert summary.status is RunStatus.RUNNING and summary.errors == 1
    with sqlite3.connect(index) as conn:
        (message,) = conn.execute("SELECT message FROM errors").fetchone()
    assert "nodes/node_0/launcher.lease" in message and "not a launcher lease" in message


@pytest.mark.parametrize("text", ["abc", "0.5", "-3", "nan", "inf", "1e9"])
def test_a_bad_lease_length_is_one_line_before_launch(tmp_path: Path, text: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    with pytest.raises(LaunchError) as err:
        parse_options([str(script)], environ={core_lease.LEASE_ENV: text})
    assert core_lease.LEASE_ENV in str(err.value) and "\n" not in str(err.value)
    assert parse_options([str(script)], environ={core_lease.LEASE_ENV: "4"}).lease_s == 4.0
    assert parse_options([str(script)], environ={}).lease_s == core_lease.DEFAULT_LEASE_S


def test_the_keeper_beats_on_its_own_and_its_last_beat_is_done(tmp_path: Path) -> None:
    path = tmp_path / "launcher.lease"
    keeper = LeaseKeeper(path, 3, lease_s=1.2).start()  # beats every 0.2 s
    first = core_lease.decode(path.read_bytes())
    assert first is not None and first.node == 3 and not first.done and first.lease_s == 1.2
    deadline = 200
    while core_lease.decode(path.read_bytes()).beat == first.beat and deadline:
        deadline -= 1
        time.sleep(0.05)
    assert deadline, "the keeper never beat again"
    keeper.finish()
    last = core_lease.decode(path.read_bytes())
    assert last.done and last.launch == first.launch
    keeper.finish()  # idempotent
    assert path.read_bytes() == core_lease.encode(node=3, launch=last.launch, beat=last.beat, lease_s=1.2, done=True)
    assert [p.name for p in tmp_path.iterdir()] == ["launcher.lease"]  # no temp file left behind


def test_traceml_run_refuses_a_bad_lease_length_in_one_line_and_writes_nothing(tmp_path: Path, cli_env,
                                                                               traceml_cmd) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    env = dict(cli_env, **{core_lease.LEASE_ENV: "0.1"})
    proc = subprocess.run([*traceml_cmd, "run", "train.py", "--run-name", "r"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and core_lease.LEASE_ENV in proc.stderr, proc.stderr
    assert not (tmp_path / "logs").exists()
