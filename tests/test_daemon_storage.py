"""How step rows are stored (docs/daemon.md, "How a step row is stored") and the upgrade of a version-2 index.

Records are written by the real encoder and ingested by the real ingester into
real SQLite files; what is read back goes through the ``steps`` view and
``daemon.reader.Reader``.
"""

from __future__ import annotations

import dataclasses
import math
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from daemon import index as idx
from daemon.reader import IndexVersionError, Reader
from daemon.service import Ingester
from traceml_tui.core import records

from support.daemon_files import (
    US_ROUNDING,
    V2_STEP_COLUMNS,
    append_raw,
    make_v2_index,
    rows_match,
    steps_path,
    v2_step_rows,
    write_steps,
)
from support.daemon_files import (
    index_rows as _rows,
)

CLOCK = 5000.0  # the ingesters' "now": both indexes record the same last_seen
NOW = 5100.0  # the readers' "now"


def _ingest(index: Path, root: Path) -> int:
    ing = Ingester(index, [str(root)], poll_interval=0.05, use_inotify=False, clock=lambda: CLOCK)
    try:
        return ing.run_once()
    finally:
        ing.close()


def _phases(rng: random.Random, loader: bool) -> records.Phases:
    traced = rng.uniform(20.0, 150.0)
    return records.Phases(step=traced, input_wait=rng.uniform(0.0, 9.0), h2d=rng.uniform(0.1, 2.0),
                          forward=traced * 0.3, backward=traced * 0.5, optimizer=traced * 0.1,
                          data_wait=rng.uniform(0.0, 5.0) if loader else None,
                          data_in_step=rng.uniform(0.0, 1.0) if loader else None)


def _rank(run_dir: Path, rank: int, n: int, *, gpu: bool, loader: bool, end: str | None, seed: int) -> None:
    """One rank stream of ``n`` steps: CPU timings (h2d only on GPU runs), GPU timings when ``gpu``, loader waits
    when ``loader``, a learning rate that is a short decimal, then a schedule's arbitrary doubles, page-sized RSS,
    task metrics on some steps; a ``rank_end`` when ``end``."""
    rng = random.Random(seed)
    path = steps_path(run_dir, rank)
    append_raw(path, records.encode(records.Header(v=1, run=run_dir.name, rank=rank, attempt=0,
                                                   uuid=f"{run_dir.name}-{rank}", ts=1_700_000_000.0, node_rank=0)))
    for s in range(1, n + 1):
        cpu = _phases(rng, loader)
        if not gpu:
            cpu.h2d = None
        if s == 1:
            cpu.input_wait = None
        g = _phases(rng, loader) if gpu else None
        lr = 3e-4 if s < n // 2 else 3e-4 * 0.5 * (1 + math.cos(math.pi * s / n))
        mem = records.Memory(rss=4096 * rng.randint(100_000, 4_000_000),
                             cuda_peak_allocated=rng.randint(1, 1 << 34) if gpu else None)
        append_raw(path, records.encode(records.Step(
            v=1, run=run_dir.name, rank=rank, attempt=0, step=s, ts=1_700_000_000.0 + s * 0.137 + rng.random() / 1e4,
            cpu_ms=cpu, gpu_ms=g, loss=2.0 / (1 + s * rng.random()), lr=lr, grad_norm=rng.uniform(0.5, 3.0),
            examples=64 * s, mem=mem, metrics={"acc": rng.random()} if s % 7 == 0 else None,
            components={"mse": records.Component(value=0.5, target_ms=1.0, ratio=rng.random())})))
    if end is not None:
        append_raw(path, records.encode(records.RankEnd(v=1, run=run_dir.name, rank=rank, attempt=0, step=n,
                                                        ts=1_700_000_000.0 + n * 0.2, status=end, exit_code=0)))


def _write_runs(root: Path) -> None:
    for rank in (0, 1):
        _rank(root / "cpu", rank, 1500, gpu=False, loader=rank == 1, end=None, seed=rank)
        _rank(root / "gpu", rank, 700, gpu=True, loader=True, end="completed", seed=10 + rank)
    _rank(root / "gone", 0, 300, gpu=False, loader=False, end="completed", seed=20)


def _close(a, b, path="") -> list[str]:
    """Where ``a`` and ``b`` differ beyond rounding (floats within US_ROUNDING), as a list of paths."""
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        return [d for f in dataclasses.fields(a) for d in _close(getattr(a, f.name), getattr(b, f.name),
                                                                  f"{path}.{f.name}")]
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        if len(a) != len(b):
            return [f"{path}: {len(a)} != {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _close(x, y, f"{path}[{i}]")]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in _close(a[k], b[k], f"{path}[{k!r}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if abs(a - b) <= US_ROUNDING else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _answers(r: Reader) -> dict:
    """Every answer the reader gives about the index's runs."""
    out = {"runs": r.list_runs(now=NOW)}
    for run in out["runs"]:
        rid = run.run_id
        ranks = r.rank_rows(rid, now=NOW)
        out[rid] = {
            "run": r.run(rid, now=NOW), "find": r.find_run(run.name, now=NOW), "detail": r.run_detail(rid, now=NOW),
            "ranks": ranks, "metrics": r.series.metrics(rid), "events": r.events.recent(rid),
            "errors": r.events.errors(rid), "nodes": r.series.node_samples(rid),
            "backlog": r.backlog.entries(rid, now=NOW), "steps": r.series.step_count(rid),
            "evaluated": r.backlog.newest_evaluated_step(rid),
            "series": {(k.rank, m): r.series.points(rid, k.rank, m) for k in ranks for m in r.series.metrics(rid)},
            "tails": {(k.rank, m): r.series.tail(rid, k.rank, m, 8) for k in ranks for m in idx.SERIES_METRICS},
        }
    out["outstanding"] = r.backlog.outstanding()
    return out


def test_a_version_2_index_is_upgraded_in_place_and_reads_as_a_new_one(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    _write_runs(root)
    old, new = tmp_path / "old" / "index.sqlite", tmp_path / "new" / "index.sqlite"
    # A version-2 index: written by an ingest of these files, its steps table holding what version 2 stored.
    assert _ingest(old, root) == 2 * 1500 + 2 * 700 + 300
    v2_rows = v2_step_rows(old, root)
    make_v2_index(old, rows=v2_rows)
    assert _rows(old, "SELECT type FROM sqlite_master WHERE name = 'steps'") == [("table",)]
    assert _rows(old, "SELECT count(*) FROM steps") == [(len(v2_rows),)]
    with pytest.raises(IndexVersionError, match="schema version 2"):
        Reader(old)
    _ingest(new, root)
    shutil.rmtree(root / "gone")  # its rows must survive the upgrade (rule 7)
    _ingest(old, root)  # the writer upgrades, then marks the run missing
    _ingest(new, root)

    assert _rows(old, "SELECT value FROM meta WHERE key = 'schema_version'") == [(str(idx.SCHEMA_VERSION),)]
    assert _rows(old, "SELECT value FROM meta WHERE key = 'rederive'") == []  # nothing was missing
    assert _rows(old, "SELECT type, name FROM sqlite_master WHERE name IN ('steps', ?) ORDER BY name",
                 (idx.STEPS_TABLE,)) == [("view", "steps"), ("table", idx.STEPS_TABLE)]
    cols = ", ".join(V2_STEP_COLUMNS)
    got = _rows(old, f"SELECT {cols} FROM steps ORDER BY run_id, rank, attempt, step")
    # Every row kept, converted by the same expressions as a new row: the same stored values, byte for byte.
    assert got == _rows(new, f"SELECT {cols} FROM steps ORDER BY run_id, rank, attempt, step")
    assert _rows(old, f"SELECT * FROM {idx.STEPS_TABLE}") == _rows(new, f"SELECT * FROM {idx.STEPS_TABLE}")
    # What version 2 stored, timings within µs rounding and ts within ms rounding (both 0.0005 in their
    # units); the learning rate and RSS (pages) exactly.
    assert rows_match(got, v2_rows)
    lr, rss = V2_STEP_COLUMNS.index("lr"), V2_STEP_COLUMNS.index("rss")
    assert [(g[lr], g[rss]) for g in got] == [(w[lr], w[rss]) for w in v2_rows]
    gone = [r for r in got if r[0] == _rows(old, "SELECT run_id FROM runs WHERE name = 'gone'")[0][0]]
    assert len(gone) == 300

    with Reader(old) as a, Reader(new) as b:
        answers = _answers(a)
        assert sorted(run.name for run in answers["runs"]) == ["cpu", "gone", "gpu"]
        assert {run.name: str(run.status) for run in answers["runs"]}["gone"] == "missing"
        assert sum(len(answers[run.run_id]["series"]) for run in answers["runs"]) > 10
        assert _close(answers, _answers(b)) == []


def test_a_staging_insert_select_stores_what_the_bound_insert_stores(tmp_path: Path) -> None:
    """``index.step_values_sql`` with a staging table's columns in place of parameters: the same stored row."""
    root = tmp_path / "logs"
    _rank(root / "gpu", 0, 50, gpu=True, loader=True, end=None, seed=3)
    _rank(root / "cpu", 0, 50, gpu=False, loader=False, end=None, seed=4)
    index = tmp_path / "index.sqlite"
    _ingest(index, root)
    rows = v2_step_rows(index, root)
    conn = idx.connect_writer(tmp_path / "staged.sqlite")
    try:
        names = ", ".join(idx.STEP_COLUMNS)
        conn.execute(f"CREATE TEMP TABLE staging ({names})")
        conn.executemany(f"INSERT INTO staging VALUES ({', '.join('?' * len(idx.STEP_COLUMNS))})", rows)
        pairs = idx.step_values_sql({c: f"s.{c}" for c in idx.STEP_COLUMNS})
        conn.execute(f"INSERT INTO {idx.STEPS_TABLE} ({', '.join(c for c, _ in pairs)})"
                     f" SELECT {', '.join(e for _, e in pairs)} FROM staging s")
        staged = conn.execute(f"SELECT * FROM {idx.STEPS_TABLE} ORDER BY run_id, rank, step").fetchall()
    finally:
        conn.close()
    assert staged == _rows(index, f"SELECT * FROM {idx.STEPS_TABLE} ORDER BY run_id, rank, step")
    assert any(r[-1] is not None for r in staged) and any(r[-1] is None for r in staged)  # folded and not


def test_stored_values_read_back_within_rounding_and_the_learning_rate_exactly(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    path = steps_path(root / "r", 0)
    append_raw(path, records.encode(records.Header(v=1, run="r", rank=0, attempt=0, uuid="u", ts=0.0)))
    lrs = [1e-3, 3e-4, 5e-6, 0.1, 2.0, 1e-7, 2.5e-7, 1e10, 1e300, 1.2345678901234567e-4, -1e-3, 0.0]
    timings = [0.0, 0.0004, 0.0005, 0.0006, 1.23456789, -2.5, 3600_000.123456, 1e12]
    for s, lr in enumerate(lrs, start=1):
        t = timings[s % len(timings)]
        append_raw(path, records.encode(records.Step(
            v=1, run="r", rank=0, attempt=0, step=s, ts=1_764_000_000.123456 + s, lr=lr,
            cpu_ms=records.Phases(step=t, input_wait=t, data_wait=t), gpu_ms=records.Phases(optimizer=t),
            mem=records.Memory(rss=4096 * s + (1000 if s == 3 else 0)))))
    index = tmp_path / "index.sqlite"
    assert _ingest(index, root) == len(lrs)
    got = _rows(index, "SELECT step, lr, ts, step_ms, input_wait_ms, data_wait_ms, gpu_optimizer_ms, gpu_step_ms,"
                       " rss FROM steps ORDER BY step")
    for step, lr, ts, *ms, gpu_step, rss in got:
        t = timings[step % len(timings)]
        assert lr == lrs[step - 1] and type(lr) is float  # bit for bit, whatever the value
        assert abs(ts - (1_764_000_000.123456 + step)) <= 0.0005  # integer milliseconds
        assert all(abs(v - t) <= US_ROUNDING for v in ms), (step, ms, t)
        assert gpu_step is None
        assert rss == 4096 * step or (step == 3 and abs(rss - (4096 * 3 + 1000)) <= 512)  # KiB
    decimal = _rows(index, f"SELECT count(*) FROM {idx.STEPS_TABLE} WHERE typeof(lr_e6) = 'integer'")[0][0]
    assert decimal == 8  # 1e-3, 3e-4, 5e-6, 0.1, 2.0, 1e10, -1e-3, 0.0; the others are kept as REAL


def test_a_cpu_step_row_is_stored_compactly(tmp_path: Path) -> None:
    """The benchmark's row shape (docs/daemon.md, "Benchmarks"): integers in place of REALs and one NULL byte for
    the nine timings a CPU run leaves out keep a row's payload near 60 bytes (version 2: ~108)."""
    conn = sqlite3.connect(":memory:")
    try:
        if not conn.execute("SELECT count(*) FROM pragma_compile_options WHERE compile_options = 'ENABLE_DBSTAT_VTAB'"
                            ).fetchone()[0]:
            pytest.skip("SQLite without dbstat")
    finally:
        conn.close()
    root = tmp_path / "logs"
    path = steps_path(root / "run0", 3)
    append_raw(path, records.encode(records.Header(v=1, run="run0", rank=3, attempt=0, uuid="u", ts=0.0)))
    rng = random.Random(0)
    for s in range(1, 2001):
        ms = 100 + rng.random() * 10
        append_raw(path, records.encode(records.Step(
            v=1, run="run0", rank=3, attempt=0, step=s, ts=1000.0 + s * 0.1,
            cpu_ms=records.Phases(step=ms, input_wait=ms * 0.05, forward=ms * 0.3, backward=ms * 0.5,
                                  optimizer=ms * 0.1),
            loss=2.0 / (1 + s * 0.01), lr=1e-3, grad_norm=1.0 + rng.random(), examples=64 * s,
            mem=records.Memory(rss=2_000_000_000))))
    index = tmp_path / "index.sqlite"
    _ingest(index, root)
    # An index b-tree moves its dividers up: the rows are the cells of every page, interior ones included.
    payload, cells = _rows(index, "SELECT sum(payload), sum(ncell) FROM dbstat WHERE name = ?", (idx.STEPS_TABLE,))[0]
    assert cells == 2000
    assert payload / cells <= 62  # 18 header bytes, 16 for loss and grad_norm, 2-3 per integer


def test_a_version_3_index_is_refused_by_a_version_2_traceml(tmp_path: Path, monkeypatch) -> None:
    """Version 2's checks (the same code, its SCHEMA_VERSION): one line, nothing written."""
    root = tmp_path / "logs"
    _rank(root / "r", 0, 5, gpu=False, loader=False, end=None, seed=1)
    index = tmp_path / "index.sqlite"
    _ingest(index, root)
    before = _rows(index, f"SELECT * FROM {idx.STEPS_TABLE}")
    monkeypatch.setattr(idx, "SCHEMA_VERSION", 2)
    with pytest.raises(idx.IndexSchemaError, match="schema version 3, newer than this traceml's 2"):
        idx.connect_writer(index)
    with pytest.raises(IndexVersionError, match="schema version 3; this traceml reads 2: use a newer traceml"):
        Reader(index)
    assert _rows(index, f"SELECT * FROM {idx.STEPS_TABLE}") == before
    assert _rows(index, "SELECT value FROM meta WHERE key = 'schema_version'") == [("3",)]


def test_an_upgrade_on_a_full_disk_says_so_and_keeps_the_old_index(tmp_path: Path, monkeypatch) -> None:
    """The upgrade rewrites every step row: on a disk without room for them it stops with one line naming the
    full disk (not damage: moving the index aside would not help), and the version-2 index is left as it
    was, every row in place, to be upgraded once there is room."""
    root = tmp_path / "logs"
    write_steps(root / "r", 0, range(1, 3001))
    index = tmp_path / "index.sqlite"
    _ingest(index, root)
    make_v2_index(index)
    before = _rows(index, "SELECT * FROM steps ORDER BY rank, attempt, step")
    real_connect = sqlite3.connect

    def connect_on_a_full_disk(*args, **kw):  # the index's own pages plus a few: SQLITE_FULL as a full disk gives
        conn = real_connect(*args, **kw)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages + 4}")
        return conn

    monkeypatch.setattr(idx.sqlite3, "connect", connect_on_a_full_disk)
    with pytest.raises(idx.IndexDamagedError) as err:
        idx.connect_writer(index)
    monkeypatch.undo()
    message = str(err.value)
    assert "is full" in message and str(index) in message and "move it aside" not in message
    assert "\n" not in message
    assert _rows(index, "SELECT value FROM meta WHERE key = 'schema_version'") == [("2",)]
    assert _rows(index, "SELECT * FROM steps ORDER BY rank, attempt, step") == before


def test_the_daemon_says_once_that_it_upgraded_an_index(tmp_path: Path, traceml_cmd, cli_env) -> None:
    """An upgrade changes the index's shape (an older traceml can no longer read it): `traceml daemon` says so in
    one line naming the index and both versions; the next start, on the upgraded index, says nothing."""
    import subprocess

    root = tmp_path / "logs"
    write_steps(root / "r", 0, range(1, 50))
    index = tmp_path / "index.sqlite"
    _ingest(index, root)
    make_v2_index(index)

    def daemon_once() -> subprocess.CompletedProcess:
        return subprocess.run([*traceml_cmd, "daemon", str(root), "--once", "--index", str(index)], env=cli_env,
                              capture_output=True, text=True, timeout=120)

    first = daemon_once()
    assert first.returncode == 0, first.stderr
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 1 and f"upgraded the index {index} from schema version 2 to {idx.SCHEMA_VERSION}" in lines[0]
    again = daemon_once()
    assert (again.returncode, again.stderr) == (0, "")
