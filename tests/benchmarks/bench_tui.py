"""Benchmark of `traceml watch` over a large index: 200 runs × 8 ranks × 5,000 steps.

One run (8 ranks × 5,000 steps, with evals, system samples and a backlog) is
written with traceml_tui.core.records and ingested by the real daemon Ingester;
its rows are then cloned inside SQLite into 200 runs (8M step rows), so the
index has the real schema, real aggregates and a realistic size.

Prints: time to first paint (target < 1.5 s; also its CPU time, which a loaded machine barely changes), CPU time per refresh (target
< 50 ms: worker build + UI apply), RSS (target < 250 MB), each with its ratio
to a baseline measured in the same run on an empty index; and the Run screen's
UI apply with its chosen chart redrawn (``run_ui_chart_ms``) and with
unchanged data (``run_ui_same_ms``: nothing redrawn).

    python tests/benchmarks/bench_tui.py [--runs 200] [--ranks 8] [--steps 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from daemon.index import STEPS_TABLE  # noqa: E402
from traceml_tui.tui.app import create_app  # noqa: E402
from traceml_tui.tui.source import IndexSource  # noqa: E402

from support import tui_data as d  # noqa: E402

# Step rows are cloned in the table that stores them (``steps`` is a view over it, docs/daemon.md).
CLONED = ("rank_live", "series", "series_extra", "series_width", "side_files", "system", STEPS_TABLE)


def build_index(tmp: Path, runs: int, ranks: int, steps: int) -> Path:
    root = tmp / "logs"
    root.mkdir()
    run = d.write_run(root, "base", ranks=ranks, steps=steps, straggler=3)
    d.write_backlog(run, now=d.FIXED_NOW)
    index = tmp / "index.sqlite"
    t = time.perf_counter()
    d.ingest(index, [root])
    print(f"ingested 1 run ({ranks} ranks × {steps} steps) with the real Ingester in {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    conn = sqlite3.connect(index, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    cols = {tbl: [r[1] for r in conn.execute(f"PRAGMA table_info({tbl})")] for tbl in CLONED + ("runs", "events")}
    conn.execute("BEGIN")
    for k in range(2, runs + 1):
        rc = [c for c in cols["runs"]]
        sel = ", ".join({"run_id": str(k), "dir": f"dir || '-{k}'", "name": f"name || '-{k}'"}.get(c, c) for c in rc)
        conn.execute(f"INSERT INTO runs ({', '.join(rc)}) SELECT {sel} FROM runs WHERE run_id = 1")
        for tbl in CLONED:
            sel = ", ".join(str(k) if c == "run_id" else c for c in cols[tbl])
            conn.execute(f"INSERT INTO {tbl} SELECT {sel} FROM {tbl} WHERE run_id = 1")
        sel = ", ".join({"run_id": str(k), "identity": f"identity || '-{k}'"}.get(c, c) for c in cols["events"])
        conn.execute(f"INSERT INTO events SELECT {sel} FROM events WHERE run_id = 1")
    conn.execute("UPDATE version SET v = v + 1")
    conn.execute("COMMIT")
    n = conn.execute("SELECT count(*) FROM steps").fetchone()[0]
    conn.close()
    size = index.stat().st_size + (Path(str(index) + "-wal").stat().st_size if Path(str(index) + "-wal").exists() else 0)
    print(f"cloned to {runs} runs in {time.perf_counter() - t:.1f} s: {n:,} step rows, index {size / 2**20:.0f} MiB")
    return index


async def measure(index: Path, refreshes: int = 20) -> dict[str, float]:
    proc = psutil.Process()
    source = IndexSource(index, clock=lambda: d.FIXED_NOW)
    t0, c0 = time.perf_counter(), time.process_time()
    app = create_app(source, poll_interval=0.05)
    out: dict[str, float] = {}
    async with app.run_test(size=(160, 48)) as pilot:
        while app.refreshes < 1:
            await pilot.pause(0.005)
        await pilot.pause()  # the first frame with the rows
        out["first_paint_s"] = time.perf_counter() - t0
        out["first_paint_cpu_s"] = time.process_time() - c0  # every thread's CPU: what the wall time is on a quiet machine
        out["rows"] = app.screen.query_one("#runs").row_count
        # Worker side: the runs list, warm (nothing changed) and cold (every run changed).
        warm, cold = [], []
        for _ in range(refreshes):
            c = time.thread_time()
            source.runs()
            warm.append(time.thread_time() - c)
        for _ in range(5):
            source._row_cache.clear()
            c = time.thread_time()
            source.runs()
            cold.append(time.thread_time() - c)
        # UI side: applying a new runs snapshot to the screen (table refill of every row).
        ui = []
        screen = app.screen
        for _ in range(refreshes):
            snap = source.runs()
            c = time.process_time()
            screen.snapshot = snap
            await pilot.pause()
            ui.append(time.process_time() - c)
        # The Run screen of one 8-rank × 5,000-step run.
        detail = []
        rid = app.runs_snapshot.rows[0].run_id if app.runs_snapshot.rows else None
        if rid is not None:
            for _ in range(5):
                c = time.thread_time()
                source.run_detail(rid, source.runs())
                detail.append(time.thread_time() - c)
        # UI side of the Run screen: applying a detail whose chosen chart changed (the braille chart redrawn by
        # textual-plot, docs/watch.md "Charts") and one holding the same data (nothing redrawn). CPU time of the
        # UI thread only: the refresh worker keeps building details on its own thread meanwhile.
        drawn, same = [], []
        if rid is not None:
            app.open_run(rid)
            for _ in range(400):
                if getattr(app.screen, "detail", None) is not None:
                    break
                await pilot.pause(0.01)
            run_screen = app.screen
            pair = (source.run_detail(rid, source.runs()), source.run_detail(rid, source.runs(), chart=("loss", None)))
            for i in range(refreshes):
                c = time.thread_time()
                run_screen.detail = pair[i % 2]
                await pilot.pause()
                drawn.append(time.thread_time() - c)
            for _ in range(refreshes):
                c = time.thread_time()
                run_screen.detail = dataclasses.replace(pair[1])
                await pilot.pause()
                same.append(time.thread_time() - c)
        out["run_ui_chart_ms"] = statistics.median(drawn) * 1000 if drawn else 0.0
        out["run_ui_same_ms"] = statistics.median(same) * 1000 if same else 0.0
        out["runs_warm_ms"] = statistics.median(warm) * 1000
        out["runs_cold_ms"] = statistics.median(cold) * 1000
        out["ui_apply_ms"] = statistics.median(ui) * 1000
        out["refresh_cpu_ms"] = out["runs_warm_ms"] + out["ui_apply_ms"]
        # A refresh while the Run screen is open: the runs list (for alerts) plus the run's detail.
        out["run_detail_refresh_ms"] = statistics.median(detail) * 1000 if detail else 0.0
        out["rss_mb"] = proc.memory_info().rss / 2**20
    source.close()
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=5000)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "empty").mkdir()
        (tmp / "empty" / "logs").mkdir()
        d.ingest(tmp / "empty" / "index.sqlite", [tmp / "empty" / "logs"])
        base = asyncio.run(measure(tmp / "empty" / "index.sqlite"))
        (tmp / "big").mkdir()
        index = build_index(tmp / "big", args.runs, args.ranks, args.steps)
        big = asyncio.run(measure(index))
    print(f"load average while measured: {os.getloadavg()[0]:.2f} (wall times grow with it; CPU times barely)")
    print(f"\n{'metric':<28}{'empty index':>14}{'large index':>14}{'ratio':>8}   target")
    targets = {"first_paint_s": "< 1.5 s", "first_paint_cpu_s": "(< 1.5 s quiet)", "refresh_cpu_ms": "< 50 ms", "rss_mb": "< 250 MB"}
    for key in ("first_paint_s", "first_paint_cpu_s", "refresh_cpu_ms", "runs_warm_ms", "ui_apply_ms", "runs_cold_ms", "run_detail_refresh_ms",
                "run_ui_chart_ms", "run_ui_same_ms", "rss_mb"):
        ratio = big[key] / base[key] if base[key] else float("nan")
        print(f"{key:<28}{base[key]:>14.3f}{big[key]:>14.3f}{ratio:>8.2f}   {targets.get(key, '')}")
    print(f"rows shown: {int(big['rows'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
