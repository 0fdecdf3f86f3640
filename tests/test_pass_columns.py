"""A live pass on columns (daemon/columns.py; docs/daemon.md, "Live path") stores what the pass block by block
stores, row for row.

Two real ingesters with the live daemon's settings read the same real files into two real SQLite indexes,
pass after pass: one routes each pass on columns (the default), the other with the column path turned off
(every block through ``decode.prepare_blocks`` and ``Store.route``, as before it existed). After every pass the
step rows (both tables, through the ``steps`` view), the rows waiting in the live table with their ratios, the
rank rows with their windows' figures and ratios, and after the merge the series, are the same; and both equal a
fresh ``--once`` of the files.
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import columns
from daemon import index as idx
from daemon.service import Ingester
from traceml_tui.core import records

from support.daemon_files import append_raw, header_line, steps_path


def _line(run: str, rank: int, step: int, rng: random.Random, comps: int, gpu: bool, writer_rank=None) -> bytes:
    """A real-shaped step record: CPU timings, loss, lr, examples, RSS; ``comps``: 0 none, 1 one ratio, 2 one
    ratio and one null ratio, 3 only a null ratio; ``gpu``: GPU timings too."""
    ms = 80 + rng.random() * 40
    components = {0: None, 1: {"mse": records.Component(value=0.4, target_ms=1.0, ratio=0.4 + step / 1000)},
                  2: {"mse": records.Component(value=0.3, target_ms=1.0, ratio=0.3),
                      "kl": records.Component(value=None, target_ms=None, ratio=None)},
                  3: {"kl": records.Component(value=None, target_ms=None, ratio=None)}}[comps]
    return records.encode(records.Step(
        v=1, run=run, rank=rank if writer_rank is None else writer_rank, attempt=0, step=step, ts=1000.0 + step,
        cpu_ms=records.Phases(step=ms, input_wait=ms * 0.05, forward=ms * 0.3, backward=ms * 0.5, optimizer=ms * 0.1),
        gpu_ms=records.Phases(step=ms * 0.9, input_wait=ms * 0.06) if gpu else None,
        loss=2.0 / (1 + step), lr=1e-3, grad_norm=1.0 + rng.random(), examples=32 * step,
        mem=records.Memory(rss=2_000_000_000 + step * 4096), components=components))


def _ro(index: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{index}?mode=ro", uri=True)


def _state(index: Path) -> dict:
    """What a reader can see of an index, by run name: step rows (the view over both tables), the rows waiting
    in the live table (their ratios as JSON objects), rank rows, run counts and the series."""
    conn = _ro(index)
    try:
        names = dict(conn.execute("SELECT run_id, name FROM runs"))
        rows = sorted((names[r[0]], *r[1:]) for r in conn.execute("SELECT * FROM steps"))
        waiting = sorted((names[r[0]], *r[1:-1], json.loads(r[-1]) if r[-1] else None) for r in conn.execute(
            f"SELECT run_id, rank, attempt, step, ratios FROM {idx.LIVE_TABLE}"))
        ranks = sorted((names[r[0]], *r[1:-1], json.loads(r[-1]) if r[-1] else None) for r in conn.execute(
            "SELECT run_id, rank, attempt, records, first_step, last_step, last_ts, loss, median_step_ms,"
            " median_input_wait_ms, median_interval_s, steps_per_s, examples_per_s, step_parts, ratios"
            " FROM rank_live"))
        runs = sorted((names[r[0]], *r[1:]) for r in conn.execute(
            "SELECT run_id, records, last_step, ranks_total, median_interval_s FROM runs"))
        series = sorted((names[r[0]], *r[1:]) for r in conn.execute("SELECT * FROM series"))
        extra = sorted((names[r[0]], *r[1:]) for r in conn.execute("SELECT * FROM series_extra"))
        return {"rows": rows, "waiting": waiting, "ranks": ranks, "runs": runs, "series": series, "extra": extra}
    finally:
        conn.close()


class _Pair:
    """Two live ingesters over the same root: on columns, and block by block."""

    def __init__(self, tmp: Path, root: Path, monkeypatch) -> None:
        self.root = root
        self.on = self._open(tmp / "columns.sqlite")
        self.off = self._open(tmp / "blocks.sqlite")
        self.taken = 0
        real = columns.route_pass

        def route_pass(store, items, batch, set_aside):
            if store is self.off.store:
                return False
            took = real(store, items, batch, set_aside)
            self.taken += took
            return took

        monkeypatch.setattr(columns, "route_pass", route_pass)

    def _open(self, index: Path) -> Ingester:
        ing = Ingester(index, [str(self.root)], use_inotify=False)
        ing.open()
        ing.live_settings()
        ing.store.live.merge_every = math.inf  # merged when the test says: the waiting rows are compared too
        ing.store.agg.figures_every = 0.0  # figures on every write: each pass's figures are compared
        return ing

    def step(self) -> None:
        for ing in (self.on, self.off):
            ing.scan()
            ing.poll(ing.plan.everything())
            ing.commit_pass()
        assert _state(self.on.index_path) == _state(self.off.index_path)

    def merge(self) -> None:
        for ing in (self.on, self.off):
            ing.merge_live()
        assert _state(self.on.index_path) == _state(self.off.index_path)

    def close(self) -> None:
        self.on.close()
        self.off.close()


def _files(root: Path, runs: int, ranks: int) -> dict[tuple[str, int], Path]:
    paths = {}
    for r in range(runs):
        for k in range(ranks):
            path = steps_path(root / f"run{r}", k)
            append_raw(path, header_line(f"run{r}", k))
            paths[(f"run{r}", k)] = path
    return paths


def _cold(tmp: Path, root: Path) -> dict:
    ing = Ingester(tmp / "cold.sqlite", [str(root)], use_inotify=False)
    try:
        ing.run_once()
    finally:
        ing.close()
    return _state(tmp / "cold.sqlite")


def _same_but_live(got: dict, want: dict) -> None:
    """A merged live index against a ``--once`` one: the same rows, ranks' counts and steps, series; the
    figures computed at another time, and ``--once`` has no live table."""
    assert got["waiting"] == []
    assert got["rows"] == want["rows"]
    assert [r[:8] for r in got["ranks"]] == [r[:8] for r in want["ranks"]]
    assert [r[:4] for r in got["series"]] == [r[:4] for r in want["series"]]
    assert len(got["series"]) == len(want["series"])
    assert [r[:6] for r in got["extra"]] == [r[:6] for r in want["extra"]]


def test_a_pass_on_columns_stores_what_block_by_block_stores(tmp_path, monkeypatch):
    """The live load's shapes, pass by pass: one new line per stream (the 1/s load), several (the 10/s load),
    ratios and null ratios, GPU timings, a repeated and an older step, a line of another rank in a stream, a
    header arriving with a stream's first steps; every pass compared, then the merge, then a cold ingest."""
    root = tmp_path / "logs"
    paths = _files(root, 2, 4)
    pair = _Pair(tmp_path, root, monkeypatch)
    rng = random.Random(7)
    try:
        pair.step()
        step = {key: 0 for key in paths}

        def append(key, count, comps, gpu):
            for j in range(count):  # a block's lines with ratios, null ratios and none, in turn
                step[key] += 1
                append_raw(paths[key], _line(*key, step[key], rng, (comps + j) % 4, gpu))

        for p in range(6):  # one line per stream per pass, every shape of ratios, one stream with GPU timings
            for i, key in enumerate(paths):
                append(key, 1, comps=(p + i) % 4, gpu=i == 3)
            pair.step()
        taken = pair.taken
        assert taken == 6  # the column path took those passes
        for _ in range(3):  # several lines per stream per pass
            for i, key in enumerate(paths):
                append(key, 1 + i % 5, comps=i % 4, gpu=i == 3)
            pair.step()
        assert pair.taken == taken + 3
        # A repeated step, an older one (a rank's steps it may hold already: that block goes block by block),
        # and a line of another rank in a stream, beside new lines of every other stream.
        key0, key1, key2 = list(paths)[:3]
        append_raw(paths[key0], _line(*key0, step[key0], rng, comps=0, gpu=False))  # its ratios as first written
        append_raw(paths[key1], _line(*key1, 2, rng, comps=0, gpu=False))
        append_raw(paths[key2], _line(*key2, 10_000, rng, comps=1, gpu=False, writer_rank=3))  # a step rank 3 never writes
        for key in list(paths)[3:]:
            append(key, 2, comps=1, gpu=False)
        pair.step()
        # A new stream: its header comes with its first steps (not all steps: the pass goes block by block).
        new = steps_path(root / "run1", 9)
        append_raw(new, header_line("run1", 9) + _line("run1", 9, 1, rng, 1, False))
        for key in paths:
            append(key, 1, comps=1, gpu=False)
        pair.step()
        for key in paths:
            append(key, 1, comps=2, gpu=False)
        pair.step()
        pair.merge()
        got = _state(pair.on.index_path)
    finally:
        pair.close()
    # Every step once: the repeated and the older step were stored already; rank 3's step 10,000 written by
    # another stream, and the new stream's one step, are rows of their own.
    assert len(got["rows"]) == sum(step.values()) + 2
    _same_but_live(got, _cold(tmp_path, root))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(passes=st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(-2, 3), st.integers(0, 3),
                                          st.booleans()), min_size=3, max_size=3), min_size=1, max_size=5))
def test_any_pass_shape_on_columns_equals_block_by_block(tmp_path_factory, monkeypatch, passes):
    """Per pass and stream: how many lines, where they start (past the rank's newest step, or at or before
    it), the ratios' shape and GPU timings — the column path and the block-by-block path leave the same index
    after every pass and after the merge."""
    tmp = tmp_path_factory.mktemp("shape")
    root = tmp / "logs"
    paths = _files(root, 1, 3)
    rng = random.Random(1)
    with monkeypatch.context() as m:
        pair = _Pair(tmp, root, m)
        try:
            pair.step()
            newest = {key: 0 for key in paths}
            for shape in passes:
                for key, (count, start, comps, gpu) in zip(paths, shape):
                    first = max(1, newest[key] + 1 if start > 0 else newest[key] + start)
                    for s in range(first, first + count):
                        append_raw(paths[key], _line(*key, s, rng, (comps + s) % 4, gpu))
                        newest[key] = max(newest[key], s)
                pair.step()
            pair.merge()
        finally:
            pair.close()


@pytest.mark.parametrize("damage", [b"{not json\n", b"\n"])
def test_a_pass_with_a_bad_line_goes_block_by_block(tmp_path, monkeypatch, damage):
    """A pass the column path does not take (a malformed line, a blank line) is routed block by block, with its
    error row, and the column path wrote nothing of it."""
    root = tmp_path / "logs"
    paths = _files(root, 1, 2)
    pair = _Pair(tmp_path, root, monkeypatch)
    rng = random.Random(2)
    try:
        pair.step()
        (k0, p0), (k1, p1) = paths.items()
        append_raw(p0, _line(*k0, 1, rng, 1, False))
        append_raw(p1, _line(*k1, 1, rng, 1, False) + damage)
        pair.step()
        assert pair.taken == 0
        got = _state(pair.on.index_path)
        assert len(got["waiting"]) == 2
    finally:
        pair.close()
