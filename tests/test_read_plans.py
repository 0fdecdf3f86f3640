"""Every query the read side runs searches the step tables by key; none scans them whole.

``steps`` is a view over two tables (docs/daemon.md, "Live path"). SQLite pushes bound values into both arms of
the view, but a correlated subquery over it is planned as a scan of every step row — at 200 runs × 8 ranks ×
5,000 steps that made the Runs screen's first paint take minutes (tests/benchmarks/bench_tui.py). This test
records the SQL of a whole read (the runs list, a run's view with its charts, the backlog) and asks SQLite for
each statement's plan.
"""

from __future__ import annotations

import sqlite3

import daemon.index as idx
from daemon.reader import Reader
from traceml_tui.tui.source import IndexSource

from support import tui_data as d

STEP_TABLES = ("steps_stored", "steps_live")


def _full_scans(index, statements: set[str]) -> list[tuple[str, str]]:
    """``(statement, plan line)`` for every plan step that scans a step table without a key."""
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    found = []
    for sql in sorted(statements):
        if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
            continue
        for *_, detail in conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall():
            if detail.startswith("SCAN") and any(detail.split()[1] == t for t in STEP_TABLES):
                found.append((sql, detail))
    conn.close()
    return found


def test_a_whole_read_never_scans_the_step_tables(tmp_path, monkeypatch):
    root = tmp_path / "logs"
    root.mkdir()
    for i in range(3):
        d.write_run(root, f"run-{i}", ranks=4, steps=60, straggler=1)
    index = tmp_path / "index.sqlite"
    d.ingest(index, [root])
    statements: set[str] = set()
    connect = idx.connect_reader

    def traced(path):
        conn = connect(path)
        conn.set_trace_callback(statements.add)  # expanded SQL: bound values written in
        return conn
    monkeypatch.setattr(idx, "connect_reader", traced)

    reader = Reader(index)
    for run in reader.runs_view(now=d.FIXED_NOW).runs:
        reader.run_view(run.run_id, now=d.FIXED_NOW)
        reader.backlog_view(run.run_id, now=d.FIXED_NOW)
    reader.close()

    source = IndexSource(index, clock=lambda: d.FIXED_NOW)
    snapshot = source.runs()
    for row in snapshot.rows:
        source.run_detail(row.run_id, snapshot)
        source.run_detail(row.run_id, snapshot, chart=("loss", None))
    source.close()

    assert len(statements) > 10, statements  # the trace saw the read
    assert _full_scans(index, statements) == []
