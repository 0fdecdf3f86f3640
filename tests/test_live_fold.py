"""The merge's one fold of many ranks (``Aggregates.write_series_columns``; docs/daemon.md, "Live path", ninth
round) equals the per-rank fold it replaced (``Aggregates.write_series``, the definition): the same series
rows, bucket widths and ratio series, value for value, on real SQLite indexes.

A live daemon's merge folds every waiting row of a pass's thousand ranks at once, from the live table's flat
log (rows of all ranks interleaved in arrival order); ``--once`` and the cold path fold one rank's block at a
time. Hypothesis draws batches of rows of several ranks and attempts (steps that cross bucket widths, so that
stored buckets merge when the width grows; NULL, NaN and infinite timings; repeated component names) and folds
each batch both ways into two indexes; after every batch the series tables are the same.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import aggregates, live
from daemon import index as idx
from daemon.service import Ingester

from support.daemon_files import append_raw, header_line, step_line
from support.lanes import examples

_timing = st.one_of(st.none(), st.floats(-5, 1e4, allow_nan=False), st.just(math.nan), st.just(math.inf))
_value = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False))


@st.composite
def _batches(draw):
    """Batches of ``(key, row, ratios)`` in arrival order: keys (run, rank, attempt), rows as
    ``live.row_tuples`` builds them, ratios ``{name: ratio}``; each key's steps increase across batches."""
    keys = draw(st.lists(st.tuples(st.integers(1, 2), st.integers(0, 3), st.integers(0, 1)), min_size=1,
                         max_size=5, unique=True))
    step = {k: draw(st.integers(1, 600)) for k in keys}
    out = []
    for _ in range(draw(st.integers(1, 4))):
        batch = []
        for _ in range(draw(st.integers(1, 24))):
            key = draw(st.sampled_from(keys))
            step[key] += draw(st.sampled_from([1, 1, 1, 7, 300, 2000]))
            s = step[key]
            row = (key[1], key[2], s, 1000.0 + s, draw(_timing), draw(_timing), None, draw(_timing), None, None,
                   draw(_timing), draw(_timing), None, None, None, None,
                   draw(_value), draw(st.one_of(st.none(), st.just(1e-3))), draw(_value), None, None, None, None, None)
            ratios = draw(st.dictionaries(st.sampled_from(["mse", "kl", "aux"]), st.floats(0, 1), max_size=2))
            batch.append((key, row, ratios))
        out.append(batch)
    return out


def _fold_per_rank(agg: aggregates.Aggregates, batch: list) -> None:
    """The definition: one ``write_series`` per (run, rank) of the batch, its rows in arrival order."""
    by_rank: dict = {}
    for key, row, ratios in batch:
        rows, pairs = by_rank.setdefault((key[0], key[1]), ([], {}))
        rows.append(row)
        for name, ratio in ratios.items():
            pairs.setdefault(name, []).append((row[live.COL_STEP], ratio))
    for (run_id, rank), (rows, pairs) in by_rank.items():
        agg.write_series(run_id, rank, list(zip(*rows)), pairs)


def _fold_together(agg: aggregates.Aggregates, batch: list) -> None:
    """The merge's way: every row of the batch in one call, flat."""
    keys = [key for key, _, _ in batch]
    ratios = [(key, name, row[live.COL_STEP], ratio) for key, row, got in batch for name, ratio in got.items()]
    agg.write_series_columns(keys, list(zip(*[row for _, row, _ in batch])), ratios)


def _fold_items(agg: aggregates.Aggregates, batch: list) -> None:
    """``write_series_many``'s items (a pass's small folds on the cold path), one per row."""
    agg.write_series_many([(key[0], key[1], list(zip(row)), {n: [(row[live.COL_STEP], r)] for n, r in got.items()})
                           for key, row, got in batch])


def _series(conn: sqlite3.Connection) -> dict:
    return {t: conn.execute(f"SELECT * FROM {t} ORDER BY {key}").fetchall()
            for t, key in (("series", "1, 2, 3"), ("series_extra", "1, 2, 3, 4"), ("series_width", "1, 2"))}


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=_batches())
def test_one_fold_of_many_ranks_equals_a_fold_per_rank(tmp_path: Path, batches):
    """Batch after batch, the flat fold of all ranks together, and ``write_series_many``'s items, leave the
    series tables exactly as one ``write_series`` per rank does (widened buckets merged, NULL and NaN values
    left out of the counts, the ratio series per component)."""
    ways = (_fold_per_rank, _fold_together, _fold_items)
    conns = []
    try:
        for i, _ in enumerate(ways):
            path = tmp_path / f"fold{i}.sqlite"
            if path.exists():
                path.unlink()
            conns.append(idx.connect_writer(path))
        aggs = [aggregates.Aggregates(c) for c in conns]
        for batch in batches:
            for way, agg in zip(ways, aggs):
                way(agg, batch)
            want = _series(conns[0])
            assert want["series"], "the batch folded nothing"
            for conn in conns[1:]:
                assert _series(conn) == want
    finally:
        for c in conns:
            c.close()


def _by_name(index: Path) -> dict:
    """Step rows and series of an index by run name (run ids differ between two indexes); sums apart."""
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        names = dict(conn.execute("SELECT run_id, name FROM runs"))
        metric_cols = ", ".join(f"{m}_min, {m}_max, {m}_n" for m in idx.SERIES_METRICS)
        return {
            "rows": sorted((names[r[0]], *r[1:]) for r in conn.execute("SELECT * FROM steps")),
            "series": sorted((names[r[0]], *r[1:]) for r in conn.execute(
                f"SELECT run_id, rank, bucket, step_lo, step_hi, {metric_cols} FROM series")),
            "extra": sorted((names[r[0]], *r[1:]) for r in conn.execute(
                "SELECT run_id, rank, metric, bucket, step_lo, step_hi, vmin, vmax, n FROM series_extra")),
            "waiting": conn.execute(f"SELECT count(*) FROM {idx.LIVE_TABLE}").fetchone()[0],
        }
    finally:
        conn.close()


def test_a_rank_moved_on_its_own_leaves_the_log_and_the_merge_folds_the_others_once(tmp_path: Path):
    """Three ranks' rows wait in the live table, remembered in its log; one rank gets a block too large for the
    live path, so its waiting rows are moved (and folded) on their own first. The merge that follows folds the
    other ranks' logged rows and that rank's later ones, each once: the step rows and series equal a cold
    ingest of the same files."""
    root = tmp_path / "logs"
    paths = [root / "r" / "ranks" / f"rank_{k}" / "steps-0.jsonl" for k in range(3)]
    for k, path in enumerate(paths):
        path.parent.mkdir(parents=True)
        path.write_bytes(header_line("r", k, uuid=f"u{k}"))
    index = tmp_path / "live.sqlite"
    ing = Ingester(index, [str(root)], use_inotify=False)
    try:
        ing.open()
        ing.live_settings()
        ing.store.live.merge_every = math.inf
        ing.store.live.merge_rows = 1 << 40

        def live_pass() -> None:
            ing.scan()
            ing.poll(ing.plan.everything())
            ing.commit_pass()

        for s in range(1, 9):
            for k, path in enumerate(paths):
                append_raw(path, step_line("r", k, s, step_ms=10.0 * s + k, ratio=0.01 * s))
            live_pass()
        assert ing.store.live.rows == 24
        big = b"".join(step_line("r", 0, s, step_ms=999.0, ratio=0.9) for s in range(5, 1500))
        assert len(big) > 64 * 1024  # read as a cut, not as a live append
        append_raw(paths[0], big)
        live_pass()
        assert ing.store.live.rows == 16  # rank 0's waiting rows moved on their own, the others still wait
        for s in range(1500, 1504):
            for k, path in enumerate(paths):
                append_raw(path, step_line("r", k, s if k == 0 else s - 1490, step_ms=5.0, ratio=0.5))
            live_pass()
        ing.merge_live()
    finally:
        ing.close()
    cold = Ingester(tmp_path / "cold.sqlite", [str(root)], use_inotify=False)
    try:
        cold.run_once()
    finally:
        cold.close()
    got, want = _by_name(index), _by_name(tmp_path / "cold.sqlite")
    assert got["waiting"] == 0 and got["rows"] and got["extra"]
    assert got == want
