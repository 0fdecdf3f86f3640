"""A live pass on columns (docs/daemon.md, "Live path"): one decode, one loop of rows, one loop of routing.

A live daemon's pass reads a line or a few from each of a thousand streams. Block by block, each of them went
through the decoder's per-block grouping (``decode.prepare_block``: rows, ratio pairs, newest ratios), then the
store's per-block routing (``Store.route``), a dozen Python calls per record. Here the pass's appends are
decoded together (``decode.steps_of_blocks``), every rank's row tuples are built in one loop
(``live.row_tuples``), and one loop routes them: a new step of a rank (past its newest stored one) goes into its
rank window, with its ratios, without the per-block ``Prepared``, and is gathered with the pass's other new steps
(:class:`_NewSteps`) for the live table's shared ``INSERT`` of the pass, handed over in one call
(``LiveTable.add_many``: one column mask for them all, their values built in C).

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

from typing import Callable, Optional

import msgspec

from . import decode, live

_encode = msgspec.json.Encoder().encode


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
    ranks = batch.ranks
    new = _NewSteps(rows)
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
                fresh = shared and (last is None or first.step > last)
            else:
                block = recs[a:b]
                fresh = shared and (last is None or first.step > last) and all(
                    r.rank == first.rank and r.attempt == first.attempt for r in block) and all(
                    x.step < y.step for x, y in zip(block, block[1:]))
            if not fresh:  # a step the rank may hold already, or ranks mixed: the block's own Prepared, routed
                new.emit(table)  # the pass's new steps so far first, as the per-block path inserts them
                store.route(run, f, cur, _prepared(recs[a:b], rows[a:b]), batch, append=True)
                continue
            latest = new.take(recs, a, b, run_id, key)
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
    new.emit(table)
    return True


class _NewSteps:
    """The new steps of a pass (each past its rank's newest stored step), gathered for one
    ``LiveTable.add_many``: the columns a pass's rows carry are found once for all of them (a row per record
    was masked on its own before), and the values built in C (``zip``)."""

    __slots__ = ("rows", "at", "keys", "runs", "texts", "ratios")

    def __init__(self, rows: list) -> None:
        self.rows = rows  # the pass's row tuples (``live.row_tuples``)
        self.at: list[int] = []  # which of them are new steps, in arrival order
        self.keys: list = []
        self.runs: list[int] = []
        self.texts: list[Optional[str]] = []  # each one's ratios as the live table keeps them (JSON; None)
        self.ratios: list[tuple] = []  # (key, name, step, ratio) of their component ratios (the series fold's)

    def take(self, recs: list, a: int, b: int, run_id: int, key: tuple) -> Optional[dict]:
        """Records ``a``..``b`` (one rank's block, new steps); returns the block's newest ratios (of its last
        records, as ``decode`` takes them) or None when none of those has components."""
        latest = None
        texts = self.texts
        tail = b - decode.WINDOW_TAIL
        for i in range(a, b):
            comps = recs[i].components
            if comps:
                got = {name: c.ratio for name, c in comps.items() if c.ratio is not None}
                if got:
                    texts.append(_encode(got).decode())
                    step = recs[i].step
                    self.ratios.extend([(key, name, step, ratio) for name, ratio in got.items()])
                else:
                    texts.append(None)
                if i >= tail:
                    latest = got
            else:
                texts.append(None)
        n = b - a
        if n == 1:
            self.at.append(a)
            self.keys.append(key)
            self.runs.append(run_id)
        else:
            self.at.extend(range(a, b))
            self.keys.extend([key] * n)
            self.runs.extend([run_id] * n)
        return latest

    def emit(self, table) -> None:
        """Hand what was gathered to the live table (its shared INSERT at the pass's end) and start again."""
        if not self.at:
            return
        rows = self.rows
        picked = [rows[i] for i in self.at]
        cols = list(zip(*picked))
        n = len(picked)
        # The columns not NULL in every new row (rank, attempt and step always): binding None costs an adapter
        # lookup per value, and an omitted column is stored NULL all the same.
        keep = tuple(j for j, col in enumerate(cols) if col[0] is not None or col.count(None) != n)
        values = list(zip(self.runs, *[cols[j] for j in keep], self.texts))
        table.add_many(keep, values, self.keys, picked, self.ratios)
        self.at, self.keys, self.runs, self.texts, self.ratios = [], [], [], [], []


def _prepared(recs: list, rows: list) -> decode.Prepared:
    """``decode.prepare_block``'s ``Prepared`` for a block of nothing but the step records ``recs`` (their rows
    ``rows`` built already)."""
    first = recs[0]
    if all(r.rank == first.rank and r.attempt == first.attempt for r in recs):
        return decode.Prepared([], [], {(first.rank, first.attempt): (
            rows, live.ratio_pairs(recs), live.latest_ratios(recs, decode.WINDOW_TAIL))})
    return decode.prepared_steps(recs)
