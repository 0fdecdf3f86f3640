"""`traceml watch` during a first launch: the header says how far indexing is, and runs fill in newest first.

The real embedded ingester (serving in its thread) over real run folders, the real Textual app. The ingester
is held after one of its commits (``on_progress``) so that the screen is looked at mid-backlog, every time.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from daemon import cold, service
from traceml_tui.core.rundir import RunDir
from traceml_tui.tui.app import create_app
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.runs_table import RunsTable

from support import tui_data as d

pytestmark = pytest.mark.timeout(90)

RUNS, RANKS, STEPS = 5, 2, 400


def test_runs_fill_in_newest_first_while_the_header_shows_indexing(tmp_path, monkeypatch):
    monkeypatch.setattr(cold, "PROGRESS_MIN_BYTES", 64 << 10)  # this backlog counts as a large one
    monkeypatch.setattr(service, "BATCH_ROWS", 200)  # … committed in many batches
    root = tmp_path / "logs"
    root.mkdir()
    names = [f"exp{i}" for i in range(RUNS)]  # exp4 changed last: read first
    for age, name in enumerate(names):
        run = d.write_run(root, name, ranks=RANKS, steps=STEPS, finished=False, evals=False)
        for rank in range(RANKS):
            os.utime(RunDir(run).steps_file(rank, 0), (d.T0 + 100 * age, d.T0 + 100 * age))
    index = tmp_path / "index.sqlite"
    ingester = service.Ingester(index, [str(root)], poll_interval=0.05, use_inotify=False, mode="test")
    held, release = threading.Event(), threading.Event()
    commits = []

    def hold(fields: dict) -> None:
        commits.append(fields)
        if len(commits) == 3:  # mid-backlog: the first runs are in, the oldest are not
            held.set()
            release.wait(60)

    ingester.on_progress = hold
    ingester.start()
    source = IndexSource(index, clock=lambda: d.T0 + 5, ingester=ingester)
    app = create_app(source, poll_interval=0.02)

    async def body() -> None:
        async with app.run_test(size=(120, 30)) as pilot:
            screen = pilot.app.screen
            for _ in range(1000):
                await pilot.pause(0.02)
                snap = screen.snapshot
                if held.is_set() and snap is not None and snap.indexing and any(r.step for r in snap.rows):
                    break
            snap = screen.snapshot
            steps = {r.name: r.step for r in snap.rows}
            assert screen.sub_title.startswith("runs · indexing ") and " records" in screen.sub_title
            assert steps.get("exp4") == STEPS  # the newest run is in, whole
            assert not steps.get("exp0")  # the oldest is not read yet
            assert screen.query_one(RunsTable).row_count >= 1
            release.set()
            for _ in range(1500):
                await pilot.pause(0.02)
                snap = screen.snapshot
                if snap is not None and snap.indexing is None and all(r.step == STEPS for r in snap.rows) \
                        and len(snap.rows) == RUNS:
                    break
            assert {r.name: r.step for r in screen.snapshot.rows} == {n: STEPS for n in names}
            assert screen.sub_title == "runs"

    try:
        asyncio.run(body())
    finally:
        release.set()
        source.close()
    assert commits[-1]["done"] and commits[-1]["records_done"] == RUNS * RANKS * STEPS
