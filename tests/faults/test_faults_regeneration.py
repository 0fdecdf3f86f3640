"""Item 7: a new generation that re-supplies rows counts them once (events, steps, window, series)."""

from __future__ import annotations

import os
import sqlite3

import pytest

from daemon.reader import Reader

from support.daemon_files import append_raw, header_line, step_line, steps_path, write_steps

pytestmark = pytest.mark.faults


def _eval(step: int) -> bytes:
    return (b'{"kind":"eval","v":1,"run":"r","rank":0,"attempt":0,"step":%d,"ts":2.0,"metrics":{"acc":0.5}}\n'
            % step)


def _series_n(env, metric="step_ms"):
    with Reader(env.index) as r:
        run = r.find_run("r")
        return sum(p.n for p in r.series.points(run.run_id, 0, metric).points)


def test_transient_truncation_stores_events_once(env):
    path = write_steps(env.root / "r", 0, range(1, 4))
    append_raw(path, _eval(3))
    append_raw(path, b"not json\n")
    write_steps(env.root / "r", 0, range(4, 7), header=False)
    append_raw(path, _eval(6))
    env.ingest()
    full = path.read_bytes()
    head_end = full.index(b"\n") + 1
    os.truncate(path, head_end + 10)  # the file shrinks (NFS), then the very same content comes back
    env.ingest()
    path.write_bytes(full)
    env.ingest()
    _, steps, errors, events = env.run("r")
    assert steps == 6
    assert sorted(e.step for e in events if e.kind == "eval") == [3, 6]
    assert len(errors) == 1
    assert _series_n(env) == 6
    with sqlite3.connect(env.index) as db:
        assert db.execute("SELECT records, first_step, last_step FROM rank_live").fetchall() == [(6, 1, 6)]


def test_truncated_and_regrown_while_down_replaces_rows(env):
    write_steps(env.root / "r", 0, range(1, 6), step_ms=100.0)
    env.ingest()
    path = steps_path(env.root / "r", 0)
    # While the daemon is down the file is rewritten (same path), longer than the committed offset.
    lines = [header_line("r", 0)] + [step_line("r", 0, s, step_ms=200.0) for s in range(1, 12)]
    path.write_bytes(b"".join(x if x.endswith(b"\n") else x + b"\n" for x in lines))
    env.ingest()
    _, steps, _, _ = env.run("r")
    assert steps == 11
    with sqlite3.connect(env.index) as db:
        assert db.execute("SELECT count(*) FROM steps WHERE step_ms != 200.0").fetchone() == (0,)
        assert db.execute("SELECT records, first_step, last_step FROM rank_live").fetchall() == [(11, 1, 11)]
        median = db.execute("SELECT median_step_ms FROM rank_live").fetchone()[0]
    assert _series_n(env) == 11
    with Reader(env.index) as r:
        pts = r.series.points(r.find_run("r").run_id, 0, "step_ms").points
    assert min(p.vmin for p in pts) > 200.0 and median > 200.0  # no stale 100 ms step left anywhere
