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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
