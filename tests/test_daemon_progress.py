"""A first launch over a large backlog says how far it is (docs/daemon.md, "First launch").

The real ingester over real files and a real SQLite index; progress is read back through the reader
(``Reader.ingest_progress``) from inside ``on_progress``, i.e. right after each commit.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from daemon import cli, cold, service, stream
from daemon.reader import Reader

from support.daemon_files import header_line, step_line, steps_path

RUNS, RANKS, STEPS = 6, 3, 1500


def _backlog(root: Path) -> list[str]:
    """RUNS runs × RANKS ranks × STEPS steps; returns the run names newest first (by their files' mtime)."""
    names = [f"run{i}" for i in range(RUNS)]
    for age, name in enumerate(names):
        for rank in range(RANKS):
            path = steps_path(root / name, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(header_line(name, rank) + b"".join(step_line(name, rank, s) for s in range(1, STEPS + 1)))
            os.utime(path, (1_700_000_000 + 1000 * age, 1_700_000_000 + 1000 * age))
    return names[::-1]


@pytest.fixture
def small_batches(monkeypatch):
    """A backlog of a few MiB counts as large, and commits every 1,000 rows: many observations, quickly."""
    monkeypatch.setattr(cold, "PROGRESS_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(service, "BATCH_ROWS", 1000)


def test_progress_moves_during_a_cold_ingest_and_runs_appear_newest_first(tmp_path, small_batches):
    root = tmp_path / "logs"
    newest_first = _backlog(root)
    index = tmp_path / "index.sqlite"
    ing = service.Ingester(index, [str(root)], use_inotify=False)
    seen = []

    def observe(fields: dict) -> None:
        with Reader(index) as r:
            runs = {run.name: run.records for run in r.list_runs()}
            seen.append((fields, r.ingest_progress(), [n for n in newest_first if runs.get(n)]))

    ing.on_progress = observe
    try:
        assert ing.run_once() == RUNS * RANKS * STEPS
    finally:
        ing.close()
    live = [(f, p, present) for f, p, present in seen if not f["done"]]
    assert len(live) >= 5
    done_counts = [p.records_done for _, p, _ in live]
    assert done_counts == sorted(done_counts) and len(set(done_counts)) == len(done_counts)  # it moves
    assert [p.files_done for _, p, _ in live] == sorted(p.files_done for _, p, _ in live)
    mid = live[len(live) // 2][1]
    assert mid.files_total == RUNS * RANKS and 0 < mid.records_done < RUNS * RANKS * STEPS
    assert mid.records_total == pytest.approx(RUNS * RANKS * STEPS, rel=0.05) and mid.eta_s is not None
    assert mid.text().startswith("indexing ") and " records · " in mid.text() and mid.text().endswith(" s left")
    # Runs show up while the backlog is read, newest first: each observation holds a prefix of that order.
    for _, _, present in live:
        assert present == newest_first[:len(present)]
    assert 0 < len(live[0][2]) < RUNS
    final, after, _ = seen[-1]
    assert final["done"] and final["records_done"] == RUNS * RANKS * STEPS
    assert after is None  # a finished backlog is not shown
    with Reader(index) as r:
        assert r.ingest_progress() is None


def test_a_small_backlog_reports_nothing(tmp_path):
    root = tmp_path / "logs"
    _backlog(root)  # ≈ 5 MiB: below the 16 MiB a first launch reports
    ing = service.Ingester(tmp_path / "index.sqlite", [str(root)], use_inotify=False)
    calls = []
    ing.on_progress = calls.append
    try:
        ing.run_once()
    finally:
        ing.close()
    assert calls == []


def test_the_daemon_prints_plain_progress_lines_when_not_on_a_tty(tmp_path, small_batches):
    root = tmp_path / "logs"
    _backlog(root)
    out = io.StringIO()
    ing = service.Ingester(tmp_path / "index.sqlite", [str(root)], use_inotify=False)
    ing.on_progress = cli.progress_printer(out)
    try:
        ing.run_once()
    finally:
        ing.close()
    lines = out.getvalue().splitlines()
    assert lines and "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert lines[0].startswith("traceml daemon: indexing ") and " files · " in lines[0] and "records/s" in lines[0]
    assert lines[-1].startswith("traceml daemon: indexed ") and f"from {RUNS * RANKS} files" in lines[-1]


def test_a_progress_row_left_by_a_stopped_ingester_is_not_shown(tmp_path, small_batches):
    root = tmp_path / "logs"
    _backlog(root)
    index = tmp_path / "index.sqlite"
    ing = service.Ingester(index, [str(root)], use_inotify=False)
    rows = []

    def stop_after_first(fields: dict) -> None:
        with Reader(index) as r:
            rows.append(r.ingest_progress(now=fields["updated"]))
            rows.append(r.ingest_progress(now=fields["updated"] + 61))
        ing.request_stop()  # a daemon stopped mid-backlog leaves its last row behind

    ing.on_progress = stop_after_first
    try:
        ing.run_once()
    finally:
        ing.close()
    assert rows[0] is not None and not rows[0].done
    assert rows[1] is None


def _contents(index: Path) -> tuple:
    with Reader(index) as r:
        out = []
        for run in sorted(r.list_runs(), key=lambda x: x.name):
            ranks = [(k.rank, k.records, k.last_step, k.median_step_ms, k.loss) for k in r.rank_rows(run.run_id)]
            series = [tuple((p.step_lo, p.step_hi, p.vmin, p.vmax, p.n)
                            for p in r.series.points(run.run_id, k[0], m).points)
                      for k in ranks for m in ("step_ms", "loss", "ratio/mse")]
            errors = [(e.path, e.offset, e.message) for e in r.events.errors(run.run_id)]
            out.append((run.name, run.records, r.series.step_count(run.run_id), ranks, series, errors))
        return tuple(out)


def test_a_backlog_decoded_by_the_worker_process_is_the_same_index(tmp_path, monkeypatch):
    """The decode worker is speculative: rows, errors, windows and series come out as when the writer decodes."""
    root = tmp_path / "logs"
    for i in range(3):
        for rank in range(2):
            path = steps_path(root / f"run{i}", rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = [header_line(f"run{i}", rank)]
            lines += [step_line(f"run{i}", rank, s, step_ms=100.0 + s % 7, ratio=0.5) for s in range(1, 3001)]
            lines.insert(1500, b'{"kind": "step", "v": 1, "broken\n')  # one malformed line: one error row
            path.write_bytes(b"".join(lines))
    monkeypatch.setattr(cold, "PROGRESS_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(cold, "AHEAD_MIN_BYTES", 1 << 10)
    monkeypatch.setattr(cold, "core_free", lambda: True)
    monkeypatch.setattr(stream, "READ_BYTES", 256 << 10)  # several blocks per file: read ahead within one
    results = {}
    for mode, threshold in (("writer", 1 << 60), ("worker", 1 << 20)):
        monkeypatch.setattr(cold, "WORKER_MIN_BYTES", threshold)
        ing = service.Ingester(tmp_path / f"{mode}.sqlite", [str(root)], use_inotify=False)
        used = []
        take = ing.cold.prepared

        def prepared(file_id, block, offset, take=take, ing=ing, used=used):
            ahead = ing.cold.ahead.get(file_id)
            used.append(ahead is not None and ahead[0] == offset and ahead[1] == block)
            return take(file_id, block, offset)

        ing.cold.prepared = prepared
        try:
            assert ing.run_once() == 3 * 2 * 3000
        finally:
            ing.close()
        results[mode] = (_contents(tmp_path / f"{mode}.sqlite"), sum(used), len(used))
    assert results["writer"][1] == 0
    assert results["worker"][1] >= results["worker"][2] // 2  # most blocks were decoded by the worker
    assert results["worker"][0] == results["writer"][0]
    assert all(len(run[5]) == 2 for run in results["worker"][0])  # the malformed lines of both ranks
