"""The live table and its merge (daemon/live_table.py; docs/daemon.md, "Live path"), and the WAL's bound
(daemon/wal.py).

Real ingesters over real files and a real SQLite index: a live daemon's rows wait in the append-ordered
table, count as stored there, and are moved (sorted) and folded into the series by a merge; the index a live
daemon leaves equals the one ``--once`` builds from the same files, merges or not, kills or not.
"""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import index as idx
from daemon import store
from daemon.reader import Reader
from daemon.service import Ingester

from support import python_env
from support.daemon_files import append_raw, header_line, step_line
from support.lanes import examples
from support.live_kill import RANKS, RUNS, make_streams, pass_lines, stream_paths


def _ro(index: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{index}?mode=ro", uri=True)


def _state(index: Path) -> dict:
    """What every surface reads of the index, by run name (run ids differ between two indexes): the step
    rows, the rank and run counts, and the series (sums apart: compared with a tolerance)."""
    conn = _ro(index)
    try:
        names = dict(conn.execute("SELECT run_id, name FROM runs"))
        rows = sorted((names[r[0]], *r[1:]) for r in conn.execute("SELECT * FROM steps"))
        ranks = sorted((names[r[0]], *r[1:]) for r in conn.execute(
            "SELECT run_id, rank, attempt, records, first_step, last_step, last_ts, loss FROM rank_live"))
        runs = sorted((names[r[0]], r[1]) for r in conn.execute("SELECT run_id, records FROM runs"))
        metric_cols = ", ".join(f"{m}_min, {m}_max, {m}_n" for m in idx.SERIES_METRICS)
        series = sorted((names[r[0]], *r[1:]) for r in conn.execute(
            f"SELECT run_id, rank, bucket, step_lo, step_hi, {metric_cols} FROM series"))
        sums = sorted((names[r[0]], *r[1:]) for r in conn.execute(
            # a metric's sum where it has no value is read by nobody (the reader skips n = 0; a fold may leave 0)
            f"SELECT run_id, rank, bucket, {', '.join(f'nullif({m}_sum * ({m}_n > 0), 0)' for m in idx.SERIES_METRICS)}"
            " FROM series"))
        extra = sorted((names[r[0]], *r[1:]) for r in conn.execute(
            "SELECT run_id, rank, metric, bucket, step_lo, step_hi, vmin, vmax, n FROM series_extra"))
        extra_sums = sorted((names[r[0]], *r[1:]) for r in conn.execute(
            "SELECT run_id, rank, metric, bucket, vsum FROM series_extra"))
        widths = sorted((names[r[0]], *r[1:]) for r in conn.execute("SELECT * FROM series_width"))
        return {"rows": rows, "ranks": ranks, "runs": runs, "series": series, "sums": sums, "extra": extra,
                "extra_sums": extra_sums, "widths": widths}
    finally:
        conn.close()


def _assert_same(got: dict, want: dict) -> None:
    for key in ("rows", "ranks", "runs", "series", "extra", "widths"):
        assert got[key] == want[key], key
    for key in ("sums", "extra_sums"):
        assert len(got[key]) == len(want[key])
        for a, b in zip(got[key], want[key]):
            assert a[:4] == b[:4]
            assert [x for x in a[4:]] == pytest.approx([x for x in b[4:]], rel=1e-12, nan_ok=True)


def _cold(tmp: Path, root: Path) -> dict:
    """The state ``--once`` builds from the files under ``root`` (a fresh index)."""
    index = tmp / f"cold-{time.monotonic_ns()}.sqlite"
    ing = Ingester(index, [str(root)], use_inotify=False)
    try:
        ing.run_once()
    finally:
        ing.close()
    return _state(index)


def _counts(index: Path) -> tuple[int, int, int]:
    """(step rows, distinct step keys, rows waiting in the live table) of an index, read-only."""
    conn = _ro(index)
    try:
        total, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT run_id || '/' || rank || '/' || attempt || '/' || step) FROM steps"
        ).fetchone()
        return total, distinct, conn.execute(f"SELECT count(*) FROM {idx.LIVE_TABLE}").fetchone()[0]
    finally:
        conn.close()


def _wait_for(cond, timeout: float = 60.0) -> bool:
    """Poll ``cond`` until it holds or ``timeout`` passes (a bound for a hung test, not a measured time)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _live_ingester(index: Path, root: Path, merge_every: float = math.inf, merge_rows: int = 1 << 40,
                   poll_interval: float = 1.0) -> Ingester:
    """An ingester with the live daemon's settings whose merges come only when asked (or as given)."""
    ing = Ingester(index, [str(root)], use_inotify=False, poll_interval=poll_interval)
    ing.open()
    ing.live_settings()
    ing.store.live.merge_every = merge_every
    ing.store.live.merge_rows = merge_rows
    return ing


def _live_pass(ing: Ingester) -> None:
    ing.scan()
    ing.poll(ing.plan.everything())
    ing.commit_pass()


# --------------------------------------------------------------------------- one value, both tables

_real = st.one_of(st.none(), st.floats(-1e12, 1e12, allow_nan=False), st.integers(-10**6, 10**6).map(float))
_lr = st.one_of(st.none(), st.integers(0, 10**6).map(lambda k: k / 1e6), st.floats(0, 10, allow_nan=False))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.tuples(st.floats(0, 4e9, allow_nan=False), *[_real] * 12, _real, _lr, _real,
                        st.one_of(st.none(), st.integers(0, 2**53)), st.one_of(st.none(), st.integers(0, 2**48)),
                        st.one_of(st.none(), st.just('{"metrics":{"acc":0.5}}')), _real, _real))
def test_a_live_row_reads_back_as_the_merge_stores_it(tmp_path, values):
    """Any step row, read through ``steps`` while it waits in the live table and after a merge moved it into
    the step table, gives the very same values and types: a merge changes nothing any reader sees."""
    index = tmp_path / "view.sqlite"
    conn = idx.connect_writer(index)
    try:
        s = store.Store(conn)
        step = conn.execute("SELECT count(*) FROM steps").fetchone()[0] + 1
        row = (0, 0, step, *values)  # rank, attempt, step, then the row tuple's other columns
        keep = tuple(i for i, v in enumerate(row) if v is not None)
        conn.execute("BEGIN")
        s.live.add((1, 0, 0), keep, (1, *(row[i] for i in keep), None), row, None)
        s.live.flush()
        read = f"SELECT {', '.join(idx.STEP_COLUMNS)}, {', '.join(f'typeof({c})' for c in idx.STEP_COLUMNS)}" \
               " FROM steps WHERE run_id = 1 AND step = ?"
        waiting = conn.execute(read, (step,)).fetchall()
        s.live.move(s.agg)
        stored = conn.execute(read, (step,)).fetchall()
        conn.execute("COMMIT")
        assert len(waiting) == len(stored) == 1
        assert waiting == stored
    finally:
        conn.close()


# --------------------------------------------------------------------------- a live daemon


def test_rows_count_as_stored_in_the_live_table_and_a_quiet_pass_merges_them(tmp_path):
    """Live passes put their rows in the live table: they are counted and read as stored there (records, the
    ``steps`` view, the reader). A serving ingester whose pass reads nothing new merges them; the index then
    equals a cold ingest of the same files (rows, counts, series)."""
    root = tmp_path / "logs"
    make_streams(root)
    index = tmp_path / "live.sqlite"
    ing = _live_ingester(index, root, poll_interval=0.05)
    paths = stream_paths(root)
    expected = 0
    try:
        for p in range(3):
            for (run, rank), path in paths.items():
                append_raw(path, pass_lines(run, rank, p))
            expected += len(paths) * (1 if p % 5 else 3)
            _live_pass(ing)
        assert _counts(index) == (expected, expected, expected)  # nothing merged yet: all of them wait
        with Reader(index) as r:
            assert sum(run.records for run in r.list_runs()) == expected
            assert sum(r.series.step_count(run.run_id) for run in r.list_runs()) == expected
        ing.start()
        for p in range(3, 6):
            for (run, rank), path in paths.items():
                append_raw(path, pass_lines(run, rank, p))
            expected += len(paths) * (1 if p % 5 else 3)
        assert _wait_for(lambda: _counts(index) == (expected, expected, 0))
    finally:
        ing.stop()
    assert _counts(index) == (expected, expected, 0)
    _assert_same(_state(index), _cold(tmp_path, root))


def test_merges_while_serving_fold_every_row_once_across_a_bucket_widening(tmp_path):
    """Merges every few dozen rows while a rank writes past 512 steps (its series buckets widen between
    merges): the series equal a cold ingest's, bucket by bucket, and the live table ends empty."""
    root = tmp_path / "logs"
    paths = {k: root / "wide" / "ranks" / f"rank_{k}" / "steps-0.jsonl" for k in range(3)}
    for k, path in paths.items():
        path.parent.mkdir(parents=True)
        path.write_bytes(header_line("wide", k, uuid=f"w{k}"))
    index = tmp_path / "live.sqlite"
    ing = _live_ingester(index, root, merge_rows=40)
    merges = []
    real_merge = ing.merge_live
    ing.merge_live = lambda: (merges.append(ing.store.live.rows), real_merge())[1]
    try:
        step = 0
        while step < 700:
            chunk = 1 + step % 37  # one to 37 lines per stream per pass
            for k, path in paths.items():
                append_raw(path, b"".join(step_line("wide", k, s, step_ms=80.0 + (s * 13 + k) % 29 + 1e-3 * s,
                                                    ratio=0.5 + 0.001 * s)
                                          for s in range(step + 1, step + 1 + chunk)))
            step += chunk
            _live_pass(ing)
        assert len([m for m in merges if m]) > 10
        ing.store.live.merge_rows = 1 << 40  # the last pass's rows stay in the live table
        step += 1
        for k, path in paths.items():
            append_raw(path, step_line("wide", k, step, step_ms=90.0, ratio=0.5))
        _live_pass(ing)
    finally:
        ing.close()
    assert _counts(index)[2] > 0  # closed without a stop: the next open merges what waits
    reopened = Ingester(index, [str(root)], use_inotify=False)
    reopened.open()
    reopened.close()
    assert _counts(index) == (3 * step, 3 * step, 0)
    state = _state(index)
    assert {w[2] for w in state["widths"]} == {2}
    _assert_same(state, _cold(tmp_path, root))


def test_a_cold_block_for_a_rank_with_waiting_rows_moves_them_first(tmp_path):
    """A rank whose rows wait in the live table gets a block too large for the live path (a cut, stored
    straight into the step table), repeating steps that wait: its live rows are moved first, so no step is
    in both tables, each is stored once with its first line's values, and the series fold each once."""
    root = tmp_path / "logs"
    path = root / "r" / "ranks" / "rank_0" / "steps-0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(header_line("r", 0, uuid="u"))
    index = tmp_path / "live.sqlite"
    ing = _live_ingester(index, root)
    try:
        for s in range(1, 11):
            append_raw(path, step_line("r", 0, s, step_ms=10.0 * s, ratio=0.1 * s))
            _live_pass(ing)
        assert _counts(index) == (10, 10, 10)
        big = b"".join(step_line("r", 0, s, step_ms=999.0, ratio=9.0) for s in range(5, 1500))
        assert len(big) > 64 * 1024  # read as a cut, not as a live append
        append_raw(path, big)
        _live_pass(ing)
        assert _counts(index) == (1499, 1499, 0)
        ing.merge_live()
    finally:
        ing.close()
    state = _state(index)
    assert [r[5] for r in state["rows"][:10]] == [10.0 * s for s in range(1, 11)]  # the first lines won
    _assert_same(state, _cold(tmp_path, root))


@pytest.mark.faults
def test_a_file_regenerated_while_its_rows_wait_replaces_them_once(tmp_path):
    """A stream rewritten in place (a new generation re-supplies its rows) while its rank's rows wait in the
    live table: they are moved before the new generation's rows replace them, and the rank's counts and
    series are rebuilt once, exactly as an ingester without a live table rebuilds them."""
    roots = {mode: tmp_path / mode / "logs" for mode in ("live", "plain")}
    ings = {}
    for mode, root in roots.items():
        path = root / "r" / "ranks" / "rank_0" / "steps-0.jsonl"
        path.parent.mkdir(parents=True)
        path.write_bytes(header_line("r", 0, uuid="u"))
        index = tmp_path / mode / "index.sqlite"
        ings[mode] = _live_ingester(index, root) if mode == "live" else Ingester(index, [str(root)],
                                                                                 use_inotify=False)
    try:
        for mode, root in roots.items():
            path = root / "r" / "ranks" / "rank_0" / "steps-0.jsonl"
            for s in range(1, 9):
                append_raw(path, step_line("r", 0, s, step_ms=10.0 * s, ratio=0.1 * s))
                _live_pass(ings[mode]) if mode == "live" else ings[mode].run_once()
            # rewritten: a different header (a new generation read from byte 0) and other values
            path.write_bytes(header_line("r", 0, uuid="v") + b"".join(
                step_line("r", 0, s, step_ms=50.0 + s, ratio=0.5) for s in range(1, 6)))
            _live_pass(ings[mode]) if mode == "live" else ings[mode].run_once()
            append_raw(path, step_line("r", 0, 6, step_ms=77.0, ratio=0.7))
            _live_pass(ings[mode]) if mode == "live" else ings[mode].run_once()
        assert _counts(tmp_path / "live" / "index.sqlite")[0] == 8
        ings["live"].merge_live()
    finally:
        for ing in ings.values():
            ing.close()
    _assert_same(_state(tmp_path / "live" / "index.sqlite"), _state(tmp_path / "plain" / "index.sqlite"))


# --------------------------------------------------------------------------- SIGKILL


@pytest.mark.faults
@pytest.mark.parametrize("where", ["commit", "INSERT INTO steps_stored", "INSERT OR REPLACE INTO series_width",
                                   "INSERT INTO series (", "INSERT INTO series_extra", "DELETE FROM steps_live",
                                   "COMMIT", "never"])
def test_sigkill_anywhere_around_a_merge_stores_every_line_once(tmp_path, where):
    """A live ingester SIGKILLed after committing rows it has not merged (between a row commit and its
    series write), or inside the merge at each of its statements: the index holds every line exactly once
    (either table) as it stands, and the next ingester merges what waits; rows, counts and every series then
    equal a fresh cold ingest of the same files."""
    root = tmp_path / "logs"
    make_streams(root)
    index = tmp_path / "index.sqlite"
    passes = 40
    proc = subprocess.run([sys.executable, "-m", "support.live_kill", str(index), str(root), str(passes), where],
                          env=python_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == (0 if where == "never" else -9), proc.stderr
    distinct_lines = RUNS * RANKS * sum(1 if p % 5 else 3 for p in range(passes))
    total, distinct, waiting = _counts(index)
    assert total == distinct == distinct_lines
    assert waiting == (0 if where == "never" else distinct_lines)  # a killed merge moved nothing
    after = Ingester(index, [str(root)], use_inotify=False)
    try:
        assert after.run_once() == 0  # every line was stored before the kill: nothing is read again
    finally:
        after.close()
    assert _counts(index) == (distinct_lines, distinct_lines, 0)
    _assert_same(_state(index), _cold(tmp_path, root))


# --------------------------------------------------------------------------- the WAL


def _many_streams(root: Path, runs: int = 4, ranks: int = 16) -> list[Path]:
    paths = []
    for r in range(runs):
        for k in range(ranks):
            path = root / f"run{r}" / "ranks" / f"rank_{k}" / "steps-0.jsonl"
            path.parent.mkdir(parents=True)
            path.write_bytes(header_line(f"run{r}", k, uuid=f"{r}-{k}"))
            paths.append(path)
    return paths


def test_a_long_live_ingest_keeps_the_wal_under_its_bound(tmp_path):
    """Pass after pass of a live ingester (merges included) writes many times the bound through the WAL;
    after every commit the WAL file is under it (the file SQLite would otherwise keep at its largest size)."""
    root = tmp_path / "logs"
    paths = _many_streams(root)
    index = tmp_path / "index.sqlite"
    ing = _live_ingester(index, root, merge_rows=2000)
    limit = 256 << 10
    ing.wal.set_limit(limit)
    sizes = []
    try:
        for p in range(60):
            for i, path in enumerate(paths):
                append_raw(path, b"".join(step_line(path.parents[2].name, i % 16, 1 + 4 * p + j) for j in range(4)))
            _live_pass(ing)
            sizes.append(ing.wal.size())
        assert ing.wal.truncations > 0
        assert max(sizes) <= limit, sizes
    finally:
        ing.close()


def test_a_reader_holding_the_wal_never_blocks_the_ingester_and_the_bound_comes_back(tmp_path):
    """A reader in the middle of a read transaction holds the WAL: the ingester's passes go on (the
    truncation never waits for it) and the WAL may grow past the bound; once the reader ends, the next
    commit brings it back under."""
    root = tmp_path / "logs"
    paths = _many_streams(root, runs=2)
    index = tmp_path / "index.sqlite"
    ing = _live_ingester(index, root, merge_rows=1000)
    limit = 128 << 10
    ing.wal.set_limit(limit)
    try:
        _live_pass(ing)
        reader = _ro(index)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM steps").fetchone()  # holds its snapshot until COMMIT
        for p in range(30):
            for i, path in enumerate(paths):
                append_raw(path, b"".join(step_line(path.parents[2].name, i % 16, 1 + 4 * p + j) for j in range(4)))
            _live_pass(ing)
        held = ing.wal.size()
        assert held > limit  # the reader kept the frames it may still read
        reader.execute("COMMIT")
        reader.close()
        for i, path in enumerate(paths):
            append_raw(path, step_line(path.parents[2].name, i % 16, 1000))
        _live_pass(ing)
        assert ing.wal.size() <= limit
    finally:
        ing.close()


def test_a_new_step_found_stored_rolls_the_pass_back_and_it_is_read_again_counted_exactly(tmp_path):
    """The pass's new steps share one INSERT on the assumption that a step past a rank's newest stored one
    cannot be stored; a row stored behind the ingester's back breaks it: the pass fails whole (nothing
    half-counted), and read again (as the serve loop does after a rollback) each row is inserted and
    counted on its own: the step is stored once and every count agrees with the rows."""
    root = tmp_path / "logs"
    make_streams(root)
    index = tmp_path / "index.sqlite"
    ing = _live_ingester(index, root)
    paths = stream_paths(root)
    try:
        for (run, rank), path in paths.items():
            append_raw(path, pass_lines(run, rank, 1))
        _live_pass(ing)
        run_id = ing.conn.execute("SELECT run_id FROM runs WHERE name = 'run0'").fetchone()[0]
        ing.conn.execute(f"INSERT INTO {idx.STEPS_TABLE} (run_id, rank, attempt, step) VALUES (?, 0, 0, 7)",
                         (run_id,))  # step 7 of run0 rank 0, stored behind the ingester's back
        for (run, rank), path in paths.items():
            append_raw(path, pass_lines(run, rank, 2))  # step 7 for every stream
        with pytest.raises(RuntimeError, match="read again"):
            _live_pass(ing)
        ing.rollback()
        _live_pass(ing)
        ing.merge_live()
    finally:
        ing.close()
    total, distinct, waiting = _counts(index)
    assert total == distinct == 2 * len(paths) and waiting == 0
    conn = _ro(index)
    try:
        assert conn.execute("SELECT sum(records) FROM rank_live").fetchone()[0] == 2 * len(paths) - 1
        assert conn.execute("SELECT rank_live.records FROM rank_live JOIN runs USING (run_id) WHERE name = 'run0'"
                            " AND rank = 0").fetchone()[0] == 1  # its step 7 was not stored by the ingester
    finally:
        conn.close()


def test_an_index_written_before_the_live_table_gains_it_and_keeps_every_row(tmp_path):
    """An index of the earlier layout (``steps`` a view over the step table alone, no live table) opened by
    this writer: the live table is made, the view is replaced by one over both tables, every stored row
    reads back as before, and a live daemon's rows then show through the view."""
    root = tmp_path / "logs"
    make_streams(root)
    paths = stream_paths(root)
    for (run, rank), path in paths.items():
        append_raw(path, pass_lines(run, rank, 0) + pass_lines(run, rank, 1))
    index = tmp_path / "index.sqlite"
    ing = Ingester(index, [str(root)], use_inotify=False)
    ing.run_once()
    ing.close()
    before = _state(index)["rows"]
    conn = sqlite3.connect(index, isolation_level=None)
    old_view = ",\n  ".join(idx.STEP_DERIVED[c] if idx.STEP_DERIVED[c] == c else f"{idx.STEP_DERIVED[c]} AS {c}"
                            for c in idx.STEP_COLUMNS)
    conn.execute("DROP VIEW steps")
    conn.execute(f"DROP TABLE {idx.LIVE_TABLE}")
    conn.execute(f"CREATE VIEW steps AS SELECT\n  {old_view}\nFROM {idx.STEPS_TABLE}")
    conn.close()
    ing = _live_ingester(index, root)
    try:
        view = ing.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'steps'").fetchone()[0]
        assert idx.LIVE_TABLE in view
        assert _state(index)["rows"] == before
        for (run, rank), path in paths.items():
            append_raw(path, pass_lines(run, rank, 2))
        _live_pass(ing)
        assert _counts(index) == (len(before) + len(paths), len(before) + len(paths), len(paths))
    finally:
        ing.close()


# --------------------------------------------------------------------------- a merge cut into slices


@pytest.mark.faults
@pytest.mark.parametrize("where,committed", [("INSERT INTO steps_stored@2", 1), ("UPDATE runs SET updated_version@2", 1),
                                             ("DELETE FROM steps_live@3", 2), ("COMMIT@2", 1)])
def test_sigkill_inside_a_later_slice_of_a_merge_stores_every_line_once(tmp_path, where, committed):
    """A merge cut into slices (4 ranks per transaction: three slices over 3 runs × 4 ranks) SIGKILLed inside
    a later slice: the slices before it stay moved and folded, the rest waits, every line is stored exactly
    once, and the next ingester merges what waits; rows, counts and every series then equal a cold ingest."""
    root = tmp_path / "logs"
    make_streams(root)
    index = tmp_path / "index.sqlite"
    passes = 12
    proc = subprocess.run([sys.executable, "-m", "support.live_kill", str(index), str(root), str(passes), where, "4"],
                          env=python_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    distinct_lines = RUNS * RANKS * sum(1 if p % 5 else 3 for p in range(passes))
    total, distinct, waiting = _counts(index)
    assert total == distinct == distinct_lines
    assert waiting == distinct_lines * (RUNS - committed) // RUNS  # each stream got the same lines
    after = Ingester(index, [str(root)], use_inotify=False)
    try:
        assert after.run_once() == 0
    finally:
        after.close()
    assert _counts(index) == (distinct_lines, distinct_lines, 0)
    _assert_same(_state(index), _cold(tmp_path, root))


def _peaks(ing: Ingester) -> list[int]:
    """The WAL's size after each commit of ``ing``, before its bound is enforced (what one transaction left)."""
    peaks = []
    enforce = ing.wal.after_commit
    ing.wal.after_commit = lambda: (peaks.append(ing.wal.size()), enforce())[1]
    return peaks


def test_a_merge_of_many_ranks_commits_in_slices_and_the_wal_stays_bounded_while_a_reader_polls(tmp_path):
    """A merge rewrites each moved rank's last pages of the step table and the series, all in the WAL before
    a checkpoint may copy them back: one transaction over every rank made the WAL of a 6,400-rank load grow
    to 100–200 MiB, past its bound. Cut into slices of ``merge_keys`` ranks, a merge over 256 ranks commits
    in 8 transactions of at most 32 ranks each, and while a reader polls the index without pause the WAL
    is under its bound after every commit once enforced, and never past it by more than one slice's pages;
    the index equals a cold ingest's."""
    root = tmp_path / "logs"
    paths = _many_streams(root, runs=4, ranks=64)
    for i, path in enumerate(paths):  # each rank's rows past a leaf page of their own, as in a long run
        append_raw(path, b"".join(step_line(path.parents[2].name, i % 64, s) for s in range(1, 61)))
    index = tmp_path / "index.sqlite"
    cold = Ingester(index, [str(root)], use_inotify=False)
    try:
        cold.run_once()
    finally:
        cold.close()
    ing = _live_ingester(index, root)
    ing.store.live.merge_keys = 32
    limit = 1 << 20
    ing.wal.set_limit(limit)
    peaks = _peaks(ing)
    stop = threading.Event()
    polls = [0]

    def poll() -> None:
        with Reader(index) as r:
            while not stop.is_set():
                r.list_runs()
                polls[0] += 1

    reader = threading.Thread(target=poll, daemon=True)
    reader.start()
    commits = []
    trace: list[str] = []
    ing.conn.set_trace_callback(lambda sql: trace.append(sql) if sql.startswith("COMMIT") else None)
    try:
        for p in range(3):
            for i, path in enumerate(paths):
                append_raw(path, b"".join(step_line(path.parents[2].name, i % 64, 61 + 5 * p + j) for j in range(5)))
            _live_pass(ing)
            assert ing.store.live.rows == 5 * len(paths)
            before = len(trace)
            moved = ing.store.live.rows
            ing.merge_live()
            commits.append(len(trace) - before)
            assert moved and ing.store.live.rows == 0
        assert _wait_for(lambda: polls[0] > 0)
        assert ing.wal.size() <= limit
    finally:
        stop.set()
        reader.join(timeout=60)
        ing.close()
    assert commits == [8, 8, 8]
    assert max(peaks) <= limit + 32 * 8 * 4096, peaks  # the bound and at most one slice's pages (~5 a rank)
    _assert_same(_state(index), _cold(tmp_path, root))
