"""The launcher's curve refresher: no render outlives it (run/curve_refresh.py, docs/hygiene.md).

Found by running the Lightning example under `traceml run` again and again: a
refresh still rendering when training ended kept running after the launcher
returned, and wrote ``learning_curve.png`` into the run folder afterwards (the
next launch of the same run name was refused: "logs/r holds learning_curve.png").
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil

from traceml_tui.run.curve_refresh import CurveRefresher

#: A stand-in for `traceml curve` that says it started, then takes longer than any test waits.
SLOW_RENDER = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1]).write_text(str(os.getpid()))
time.sleep(60)
Path(sys.argv[2]).write_text("written after the launcher stopped")
"""


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def test_stop_kills_the_render_in_flight_and_waits_for_it(tmp_path):
    started, late = tmp_path / "started", tmp_path / "late.png"
    warnings: list[str] = []
    refresher = CurveRefresher([sys.executable, "-c", SLOW_RENDER, str(started), str(late)], cadence=10,
                               last_step=lambda: 10, warn=warnings.append, poll_s=0.05).start()
    _wait_for(started)
    render = psutil.Process(int(started.read_text()))
    refresher.stop()
    assert not render.is_running()  # killed and reaped before stop() returned
    assert not late.exists()
    assert warnings == []


def test_one_render_per_bucket_of_cadence_updates(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    render = f"import time; from pathlib import Path; Path({str(marks)!r}, str(time.monotonic_ns())).touch()"
    steps = iter([0, 3, 9, 10, 11, 19, 20, 20, 45])
    last = [0]

    def last_step() -> int:
        last[0] = next(steps, last[0])
        return last[0]

    refresher = CurveRefresher([sys.executable, "-c", render], cadence=10, last_step=last_step,
                               warn=print, poll_s=0.01).start()
    deadline = time.monotonic() + 60.0
    while last[0] != 45 or len(list(marks.iterdir())) < 4:
        assert time.monotonic() < deadline, sorted(p.name for p in marks.iterdir())
        time.sleep(0.05)
    refresher.stop()
    # buckets 0 (steps 3, 9), 1 (10, 11, 19), 2 (20), 4 (45): one render each, none before the first step
    assert len(list(marks.iterdir())) == 4


#: `traceml curve` itself, its render held in the middle of its atomic write (the temp file written, not yet
#: renamed) until the launcher stops it.
CURVE_HELD_IN_ITS_WRITE = """
import os, sys, time
from pathlib import Path
from traceml_tui.core.atomic import atomic_write_with
from traceml_tui.hygiene import curve, curve_cli

started = Path(sys.argv[1])

def held_render(run_dir, out=None):
    def write(handle):
        handle.write(b"half a png")
        handle.flush()
        started.write_text(str(os.getpid()))
        time.sleep(60)
    target = Path(run_dir) / "learning_curve.png"
    atomic_write_with(target, write)
    return target

curve.render_learning_curve = held_render
sys.exit(curve_cli.main([sys.argv[2]]))
"""


def test_a_stopped_render_leaves_no_temp_file_in_the_run_folder(tmp_path):
    """The render is stopped with SIGTERM, on which `traceml curve` unwinds through its atomic write: a SIGKILL
    left the hidden `.learning_curve.png.*.tmp` behind in the run folder for good."""
    run_dir, started = tmp_path / "run", tmp_path / "started"
    (run_dir / "ranks").mkdir(parents=True)
    refresher = CurveRefresher([sys.executable, "-c", CURVE_HELD_IN_ITS_WRITE, str(started), str(run_dir)],
                               cadence=10, last_step=lambda: 10, warn=print, poll_s=0.05).start()
    _wait_for(started)
    assert [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]  # held inside the write
    render = psutil.Process(int(started.read_text()))
    refresher.stop()
    assert not render.is_running()
    assert sorted(p.name for p in run_dir.iterdir()) == ["ranks"]  # no curve, no temp file


def test_the_final_render_past_its_time_is_ended_without_leaving_its_temp_file(tmp_path):
    """The launcher's final render (run/curve_refresh.py ``render``, no stop event) past its time gets SIGTERM too:
    it was ended by SIGKILL (subprocess.run's timeout), which left the hidden temp file (an independent review)."""
    from traceml_tui.run.curve_refresh import render

    run_dir, started = tmp_path / "run", tmp_path / "started"
    (run_dir / "ranks").mkdir(parents=True)
    warnings: list[str] = []
    render([sys.executable, "-c", CURVE_HELD_IN_ITS_WRITE, str(started), str(run_dir)], warnings.append,
           timeout_s=3.0)
    assert started.exists()  # it was inside its write when its time ran out
    assert sorted(p.name for p in run_dir.iterdir()) == ["ranks"]
    assert warnings == ["could not render the learning curve: no result within 3 s"]
