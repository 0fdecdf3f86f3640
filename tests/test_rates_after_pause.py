"""Rates over seconds on a real live run: a paused rank's steps/s falls, and after it resumes the reader's
steps/s is back within 10 % of the run's true pace within 5 s (daemon/rates.py, docs/contracts.md "One set
of figures").

A real 2-rank gloo DDP run under ``traceml run`` (a few steps per second) is indexed by a real ``traceml daemon``
process while the test reads the index with the reader every few tenths of a second. Rank 1 is SIGSTOPped
for several seconds (rank 0 waits for it in its next all-reduce), then SIGCONTinued. Every assertion is on
the records' own timestamps and on what the reader returned with them, never on how long the test took:
the true pace is measured from the step records written after the pause.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon import live, rates
from daemon.reader import Reader
from traceml_tui.core import jsonl, records
from traceml_tui.core.state import RunStatus

from support import realruns

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

#: The run's pace: each step sleeps this long (a few steps per second).
STEP_SLEEP_S = 0.2
STEPS = 150
#: Steps rank 1 completes before it is stopped (over the rate window's worth of records at this pace).
PAUSE_AFTER = 40
#: How long rank 1 stays stopped (under the script's 30 s collective timeout and the 30 s stall limit).
PAUSE_S = 16.0
#: What the rule promises: within this many seconds of records after resuming ...
BACK_WITHIN_S = 5.0
#: ... the run's steps/s within this fraction of its true pace.
TOLERANCE = 0.10


def _wait(predicate, timeout: float, what: str, launch=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if launch is not None and launch.proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}\n{launch.stderr_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _step_times(run_dir: Path) -> dict[int, list[tuple[int, float]]]:
    """(step, ts) of every step record, per rank, from the ranks' own files."""
    out = {}
    for rank in (0, 1):
        path = run_dir / "ranks" / f"rank_{rank}" / "steps-0.jsonl"
        out[rank] = sorted((r.step, r.ts) for r in jsonl.file_records(path, (records.Step,)))
    return out


def _read(index: Path, name: str) -> tuple:
    """One reading: (decision time, the run's newest record ts, its steps/s, its status)."""
    now = time.time()
    with Reader(index) as reader:
        run = next((r for r in reader.list_runs(now=now) if r.name == name), None)
    if run is None:
        return None
    return now, run.last_ts, run.steps_per_s, run.status


def test_a_paused_rank_falls_and_the_rate_is_back_within_five_seconds_of_resuming(tmp_path, cli_env):
    index = tmp_path / "index.sqlite"
    name = "pause"
    launch, run_dir = realruns.start_ddp(tmp_path, name, "--steps", STEPS, "--sleep", STEP_SLEEP_S, env=cli_env)
    daemon = subprocess.Popen([sys.executable, "-m", "traceml_tui", "daemon", str(run_dir.parent), "--index",
                               str(index), "--poll-interval", "0.2"], env=cli_env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    readings: list[tuple] = []

    def read() -> None:
        try:
            got = _read(index, name)
        except (FileNotFoundError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 - an index the daemon is creating: read again
            if "schema" in str(exc).lower():
                raise
            return
        if got is not None and got[2] is not None:
            readings.append(got)

    try:
        with launch:
            pid_file = tmp_path / "pids" / "rank_1.pid"
            _wait(lambda: realruns.count_steps(run_dir, 1) >= PAUSE_AFTER and pid_file.is_file(), 180,
                  f"rank 1's first {PAUSE_AFTER} steps", launch)
            _wait(lambda: index.is_file(), 60, "the index")
            rank1 = int(pid_file.read_text())
            os.kill(rank1, signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                while time.monotonic() - stopped < PAUSE_S:
                    read()
                    time.sleep(0.2)
            finally:
                os.kill(rank1, signal.SIGCONT)
            while launch.proc.poll() is None:
                read()
                time.sleep(0.2)
            assert launch.proc.returncode == 0, launch.stderr_tail()
    finally:
        daemon.send_signal(signal.SIGINT)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()

    # The pause and the true pace, from the records' own timestamps.
    times = _step_times(run_dir)
    assert all(len(t) == STEPS for t in times.values())
    gaps = {rank: max(range(1, len(t)), key=lambda i: t[i][1] - t[i - 1][1]) for rank, t in times.items()}
    paused_at = max(times[r][gaps[r] - 1][1] for r in times)  # the newest record before the pause
    resumed = {r: times[r][gaps[r]] for r in times}  # the first record after it: (step, ts)
    resumed_ts = max(ts for _, ts in resumed.values())
    assert resumed_ts - paused_at >= PAUSE_S * 0.8, "the pause is not in the records"
    paces = []
    for rank, t in times.items():
        after = [(s, ts) for s, ts in t if ts >= resumed[rank][1]]
        paces.append((after[-1][0] - after[0][0]) / (after[-1][1] - after[0][1]))
    true_pace = min(paces)  # the run's: its slowest rank's
    assert true_pace > 1.0  # a few steps per second

    # The test means something: 64 steps after resuming + 5 s still hold the pause, a count of steps would not do.
    rank0 = times[0]
    at = next(i for i, (_, ts) in enumerate(rank0) if ts >= resumed[0][1] + BACK_WITHIN_S)
    first = max(0, at - live.WINDOW + 1)
    counted = (rank0[at][0] - rank0[first][0]) / (rank0[at][1] - rank0[first][1])
    assert counted < true_pace * (1 - TOLERANCE), (counted, true_pace)

    # While paused, the rate falls instead of keeping the old pace.
    # From the reading that holds the last record before the pause on: a reading taken while that record was
    # still on its way holds the rate of fewer records, and the record's arrival may raise it a little.
    during = [(now, sps) for now, last_ts, sps, status in readings
              if last_ts is not None and paused_at - 1e-6 <= last_ts <= paused_at and status is RunStatus.RUNNING]
    assert during, "no reading while rank 1 was stopped"
    # past the grace (the core's quiet threshold, core.state.quiet_limit_s: the rate falls when the rank greys)
    grace = rates.grace_s(None, true_pace)
    late = [sps for now, sps in during if now - paused_at >= grace + 5.0]
    assert late and max(late) < 0.6 * true_pace, (late, true_pace)
    assert all(b <= a * 1.001 for (_, a), (_, b) in zip(during, during[1:])), during  # falling, never rising

    # Once the index holds 5 s of records after resuming, steps/s is the true pace within 10 %.
    back = [(last_ts - resumed_ts, sps) for now, last_ts, sps, status in readings
            if last_ts is not None and resumed_ts + BACK_WITHIN_S <= last_ts <= resumed_ts + 3 * BACK_WITHIN_S
            and status is RunStatus.RUNNING]
    assert len(back) >= 3, (back, readings[-5:])
    off = [(after_s, sps) for after_s, sps in back if abs(sps - true_pace) > TOLERANCE * true_pace]
    assert not off, (off, true_pace)
