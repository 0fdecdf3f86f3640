"""A live pass on columns (docs/daemon.md, "Live path"): one decode, one loop of rows, one loop of routing.

A live daemon's pass reads a line or a few from each of a thousand streams. Block by block, each of them went
through the decoder's per-block grouping (``decode.prepare_block``: rows, ratio pairs, newest ratios), then the
store's per-block routing (``Store.route``), a dozen Python calls per record. Here the pass's appends are
decoded together (``decode.steps_of_blocks``), every rank's row tuples are built in one loop
(``live.row_tuples``), and one loop routes them: a new step of a rank (past its newest stored one) goes to the
live table's shared ``INSERT`` of the pass (``LiveTable.add``) and into its rank window, with its ratios, without
the per-block ``Prepared``.

What the column path takes is the common shape only: every line of the pass a step record on the decoder's
fast path, streams of a first generation, the live table on (``Ingester.live_settings``). A block whose steps
are not all new to its rank (or mix ranks) is routed by ``Store.route`` with the very ``Prepared``
``decode.prepare_blocks`` gives it; a pass of any other shape goes block by block as before
(:func:`route_pass` returns False before it writes anything). What it stores is what the per-block path stores,
row for row (held by ``tests/test_pass_columns.py`` on real files, and the decoder's part by
``tests/fuzz/test_fuzz_block_fastpath.py``).

Rule 2 is unchanged: the rows join the pass's one open transaction with their files' new offsets.
"""

from __future__ import annotations

import operator
from itertools import compress, repeat
from typing import Callable, Optional

import msgspec

from . import decode, live

_NONES = repeat(None)  # map(operator.is_not, row, _NONES): which values of a row are not NULL
_POSITIONS = range(64)  # column positions of a step row (more than it has)
_encode = msgspec.json.Encoder().encode
_STEP = live.COL_STEP


def _ratios_of(rec) -> tuple[dict, dict, Optional[str]]:
    """One step record's component ratios: ``{name: ratio}`` (nulls left out: the window's newest ratios), the
    same as ``{name: [(step, ratio)]}`` (the series fold's pairs) and as the live table's JSON text (None
    without any)."""
    latest = {name: c.ratio for name, c in rec.components.items() if c.ratio is not None}
    step = rec.step
    return latest, {name: [(step, r)] for name, r in latest.items()}, _encode(latest).decode() if latest else None


def route_pass(store, items: list, batch, set_aside: Callable[[object, Exception], None]) -> bool:
    """Decode and route a pass's small appends (``items``: ``(run, file, cursor, bytes, offset)``, see
    ``Ingester._flush_deferred``) on columns, into ``batch``; False, having written nothing, when the pass
    is not of the shape this path takes (the caller then routes it block by block). ``set_aside(file, exc)``
    is called before an exception of one block's routing goes up, as the per-block path does."""
    table = store.live
    if not table.enabled or any(cur["generation"] for _, _, cur, _, _ in items):
        return False
    joined = decode.steps_of_blocks([data for _, _, _, data, _ in items])
    if joined is None:
        return False
    recs, counts = joined
    rows = live.row_tuples(recs)
    agg = store.agg
    windows = agg.windows
    shared = table.shared_inserts
    add = table.add
    ranks = batch.ranks
    is_not = operator.is_not
    keeps: dict[tuple, tuple[int, ...]] = {}
    a = 0
    for (run, f, cur, _, _), n in zip(items, counts):
        if not n:
            continue  # an append is complete lines: never empty
        b = a + n
        try:
            first = recs[a]
            run_id = run.run_id
            key = (run_id, first.rank, first.attempt)
            w = windows.get(key) or agg.window(key)
            last = w.last_step
            if n == 1:
                row = rows[a]
                new = shared and (last is None or row[_STEP] > last)
            else:
                block = recs[a:b]
                new = shared and (last is None or first.step > last) and all(
                    r.rank == first.rank and r.attempt == first.attempt for r in block) and all(
                    x.step < y.step for x, y in zip(block, block[1:]))
            if not new:  # a step the rank may hold already, or ranks mixed: the block's own Prepared, routed
                store.route(run, f, cur, _prepared(recs[a:b], rows[a:b]), batch, append=True)
                continue
            latest = None
            for i in range(a, b):
                row = rows[i]
                rec = recs[i]
                if rec.components:
                    got, pairs, text = _ratios_of(rec)
                    if i >= b - decode.WINDOW_TAIL:  # the newest ratios: of the block's last records, as decode's
                        latest = got
                else:
                    pairs, text = None, None
                mask = tuple(map(is_not, row, _NONES))
                keep = keeps.get(mask)
                if keep is None:  # the columns a row carries: the same for nearly every row of a pass
                    keep = keeps[mask] = tuple(compress(_POSITIONS, mask))
                add(key, keep, (run_id, *compress(row, mask), text), row, pairs)
            batch.rows += n
            batch.records += n
            if n == 1:
                w.add_row(rows[a], 1)
            else:
                w.add_columns(list(zip(*rows[a:b])), n)
            if latest is not None:
                w.ratios = latest
            ranks.add(key)
        except Exception as exc:
            set_aside(f, exc)
            raise
        finally:
            a = b
    return True


def _prepared(recs: list, rows: list) -> decode.Prepared:
    """``decode.prepare_block``'s ``Prepared`` for a block of nothing but the step records ``recs`` (their rows
    ``rows`` built already)."""
    first = recs[0]
    if all(r.rank == first.rank and r.attempt == first.attempt for r in recs):
        return decode.Prepared([], [], {(first.rank, first.attempt): (
            rows, live.ratio_pairs(recs), live.latest_ratios(recs, decode.WINDOW_TAIL))})
    return decode.prepared_steps(recs)
