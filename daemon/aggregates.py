"""The rows derived at ingest time: ``rank_live``, the ``runs`` rollup and facts, the series tables.

:class:`Aggregates` keeps one :class:`live.RankWindow` per (run, rank,
attempt) and writes it to ``rank_live``; folds step columns into the
downsampled ``series``/``series_extra`` tables; and rolls the rank rows up
into the run's row. The module-level functions copy side-file facts (parsed
by :mod:`daemon.sidefiles`) into ``runs``. Everything here runs inside the
ingester's open transaction (docs/daemon.md rule 2); nothing commits.

Whether a rank failed and whether an outcome reports a failure are decided by
:mod:`traceml_tui.core.state` only.
"""

from __future__ import annotations

import heapq
import json
import math
import sqlite3
import time
from itertools import chain
from typing import Optional, Sequence

import msgspec
import numpy as np

from traceml_tui.core import state

from . import figures, live, rates, sidefiles
from . import index as idx

RankKey = tuple[int, int, int]  # (run_id, rank, attempt)
_NEWEST_SQL = idx.steps_newest_sql(live.WINDOW_COLUMNS)  # a rank's newest rows, from both step tables


class Aggregates:
    """Live aggregates of the writer connection ``conn`` (caches are cleared with :meth:`reset`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.windows: dict[RankKey, live.RankWindow] = {}
        self._widths: dict[tuple[int, int], int] = {}
        self.figures_every = 0.0  # seconds between recomputations of a rank's rolling figures (0: every write)
        #: ... and, once that long has passed, new steps a rank needs for its figures to be recomputed before
        #: ``figures_max_s`` (see :meth:`write_rank_live_many`)
        self.figures_new_steps = 0
        self.figures_max_s = 0.0
        self.tick = time.monotonic  # the clock of those intervals (injectable for tests)
        #: when a rank's figures were computed, its record count and how many steps its window held then
        self._figures: dict[RankKey, tuple[float, int, int]] = {}
        self.stale: dict[RankKey, float] = {}  # ranks written with older figures -> when they are due
        self._ratio_texts: dict[RankKey, tuple[dict, str]] = {}  # the last ratios written and their JSON
        self._stale_heap: list[tuple[float, RankKey]] = []  # (due, key); entries not matching ``stale`` are outdated

    def due_stale(self) -> list[RankKey]:
        """Ranks whose figures were left stale and are due now (their windows are still loaded).

        A heap ordered by when each is due: a live daemon calls this every pass, and with a thousand ranks
        written every pass a scan of them all would cost more than the figures.
        """
        tick = self.tick()
        heap = self._stale_heap
        out = []
        while heap and heap[0][0] <= tick:
            due, key = heapq.heappop(heap)
            if self.stale.get(key) != due:
                continue  # written since, or due later now: an outdated entry
            if key not in self.windows:
                self.window(key)  # left stale before a rollback (reset): reloaded from the index
            out.append(key)
        for key in out:  # still stale until written: handed back again by the next call
            heapq.heappush(heap, (self.stale[key], key))
        return out

    def next_stale_due(self) -> float:
        """When the next stale rank falls due (monotonic clock; infinity when none is stale)."""
        heap = self._stale_heap
        while heap and self.stale.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def _mark_stale(self, key: RankKey, due: float) -> None:
        if self.stale.get(key) != due:
            self.stale[key] = due
            heapq.heappush(self._stale_heap, (due, key))

    def reset(self) -> None:
        """Forget every cached window and series width (after a rollback: reload from the index).

        Ranks whose committed figures were left stale stay listed, due at once: nothing else may ever
        write them again (a rank that went quiet).
        """
        stale = list(self.stale)
        self.windows.clear()
        self._widths.clear()
        self._figures.clear()
        self.stale.clear()
        self._stale_heap.clear()
        self._ratio_texts.clear()
        for key in stale:
            self._mark_stale(key, -math.inf)

    def write_stale(self) -> list[RankKey]:
        """Every rank left with stale figures, to be written with fresh ones (a daemon stopping): the keys
        to add to the batch; their figures are computed whatever their schedule."""
        keys = list(self.stale)
        for key in keys:
            self.window(key)  # loaded again when a rollback dropped it
            self._figures.pop(key, None)
        return keys

    # ----------------------------------------------------------------- rank_live
    def window(self, key: RankKey) -> live.RankWindow:
        """The rolling window of one (run, rank, attempt), loaded from the index on first use."""
        w = self.windows.get(key)
        if w is not None:
            return w
        w = live.RankWindow()
        row = self.conn.execute(
            "SELECT records, first_step, last_step, last_ts, loss, ratios, ended, exit_code, end_ts, node, last_seen"
            " FROM rank_live WHERE run_id = ? AND rank = ? AND attempt = ?", key).fetchone()
        if row is not None:
            (w.records, w.first_step, w.last_step, w.last_ts, w.loss, ratios, w.ended, w.exit_code, w.end_ts,
             w.node, w.seen) = row
            w.ratios = json.loads(ratios) if ratios else None
            self._load_tail(w, key)
        if w.node is None:
            w.node = self.header_node(key)
        self.windows[key] = w
        return w

    def _load_tail(self, w: live.RankWindow, key: RankKey) -> None:
        """Fill ``w``'s rolling window with the rank's newest stored rows (at most ``live.WINDOW``)."""
        tail = self.conn.execute(_NEWEST_SQL, (*key, live.WINDOW)).fetchall()
        if len(tail) == live.WINDOW and tail[0][1] is not None and tail[-1][1] is not None \
                and tail[-1][1] > tail[0][1] - rates.RATE_WINDOW_S:
            # A fast rank: its last 64 steps span less than the rate's seconds; the steps before them within
            # those seconds (and one mark's time) become its marks, as the live window made them (daemon/rates.py)
            since = tail[0][1] - rates.RATE_WINDOW_S - rates.MARK_S
            older = []
            for row in self.conn.execute(_NEWEST_SQL, (*key, -1)):
                if row[0] >= tail[-1][0]:
                    continue  # the window's own steps
                if row[1] is not None and row[1] < since:
                    break
                older.append((row[0], row[1], row[2]))
            w.add_marks(older[::-1])
        w.add_stored(tail[::-1])

    def header_node(self, key: RankKey) -> Optional[int]:
        """``node_rank`` from the committed header of the rank's stream (None when unknown)."""
        row = self.conn.execute(
            "SELECT header FROM files WHERE run_id = ? AND rank = ? AND attempt = ? AND stream = 'steps'"
            " AND header IS NOT NULL ORDER BY file_id LIMIT 1", key).fetchone()
        return header_node(row[0]) if row else None

    def write_rank_live(self, key: RankKey, now: float) -> None:
        self.write_rank_live_many([key], now)

    def write_rank_live_many(self, keys, now: float) -> None:
        """Write the ``rank_live`` row of every key (one statement for all of them, two at most).

        With ``figures_every`` > 0 (the live daemon) a rank's rolling figures (medians, step parts)
        are recomputed at most that often, and after that only once half of the window is new records or
        ``figures_max_s`` passed (:meth:`_figures_due`; docs/daemon.md, "Live path"): the median of a 64-step window
        barely moves before half of it is new, and a thousand ranks at one step per second would otherwise
        recompute theirs every 2 s. Records, steps, times, loss and the rates (daemon/rates.py) are always
        current. A rank whose figures were left stale is listed in ``stale`` until :meth:`due_stale` hands it
        back, and its row (written in full when its figures were computed) gets only the current columns, in place.
        """
        full, current, computed = [], [], []
        every = self.figures_every
        tick = self.tick()
        texts = self._ratio_texts
        for key in keys:
            w = self.windows[key]
            ratios = None
            if w.ratios:
                last = texts.get(key)
                if last is not None and last[0] == w.ratios:
                    ratios = last[1]
                else:
                    ratios = json.dumps(w.ratios)
                    texts[key] = (w.ratios, ratios)
            cached = self._figures.get(key) if every else None
            if cached is not None and w.ended is None:
                due = self._figures_due(cached, w.records)
                if tick < due:
                    self._mark_stale(key, due)
                    # the rates are not a median of the window: cheap, and a pause must leave them at once
                    steps_per_s, examples_per_s = w.rates()
                    current.append((w.node, w.records, w.first_step, w.last_step, w.last_ts, w.seen_at(now), w.loss,
                                    ratios, steps_per_s, examples_per_s, *key))
                    continue
            if every:
                self._figures[key] = (tick, w.records, len(w.steps))
                self.stale.pop(key, None)
            computed.append((key, w, ratios))
        # Every due rank's figures in one pass on arrays (daemon/figures.py: the window's own, bit for bit).
        for (key, w, ratios), fig in zip(computed, figures.figures_many([w for _, w, _ in computed])):
            full.append((*key, w.node, w.records, w.first_step, w.last_step, w.last_ts, w.seen_at(now),
                         fig["median_step_ms"],
                         fig["median_input_wait_ms"], fig["median_interval_s"], fig["steps_per_s"],
                         fig["examples_per_s"], w.loss, ratios, w.ended, w.exit_code, w.end_ts,
                         _parts_json(fig["step_parts"])))
        if full:
            self.conn.executemany(
                "INSERT OR REPLACE INTO rank_live (run_id, rank, attempt, node, records, first_step, last_step,"
                " last_ts, last_seen, median_step_ms, median_input_wait_ms, median_interval_s, steps_per_s,"
                " examples_per_s, loss, ratios, ended, exit_code, end_ts, step_parts)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", full)
        if current:  # the row was written in full with these figures (in this process, since the last reset)
            self.conn.executemany(
                "UPDATE rank_live SET node = ?, records = ?, first_step = ?, last_step = ?, last_ts = ?,"
                " last_seen = ?, loss = ?, ratios = ?, steps_per_s = ?, examples_per_s = ?"
                " WHERE run_id = ? AND rank = ? AND attempt = ?", current)

    def _figures_due(self, cached: tuple[float, int, int], records: int) -> float:
        """When figures computed at ``cached`` (tick, record count, window length) fall due, the rank having
        ``records`` now: ``figures_every`` after them once half of the window they were computed over is
        new (at most ``figures_new_steps``: a young window of a few warm-up steps is refreshed as soon as
        it doubles), else ``figures_max_s`` after them."""
        computed, count, length = cached
        need = min(self.figures_new_steps, max(1, length // 2))
        if records - count >= need:
            return computed + self.figures_every
        return computed + self.figures_max_s

    def refresh_step_figures(self, key: RankKey) -> None:
        """Recompute a stored rank's step-time figures from its window in the index (after an upgrade).

        Only ``median_step_ms``, ``median_input_wait_ms`` and ``step_parts``
        change; ``last_seen`` keeps saying when the rank's records last came in.
        """
        fig = self.window(key).figures()
        self.conn.execute(
            "UPDATE rank_live SET median_step_ms = ?, median_input_wait_ms = ?, step_parts = ? WHERE run_id = ?"
            " AND rank = ? AND attempt = ?",
            (fig["median_step_ms"], fig["median_input_wait_ms"], _parts_json(fig["step_parts"]), *key))

    # ----------------------------------------------------------------- runs rollup
    def write_run_rollup(self, run_id: int, version: int, now: float) -> None:
        """Roll the newest attempt of each rank up into the run's row (and mark it changed at ``version``)."""
        # One scan of the run's rows (every attempt), the newest attempt of each rank picked here: a
        # correlated max(attempt) per row and a second scan for the total cost more than the rollup itself,
        # and a live daemon rolls every run that changed up once per pass (docs/daemon.md, "Live path").
        latest: dict[int, tuple] = {}
        total_records = 0
        for row in self.conn.execute(
                "SELECT rank, attempt, records, median_interval_s, last_step, last_ts, last_seen, ended, exit_code"
                " FROM rank_live WHERE run_id = ?", (run_id,)):
            total_records += row[2]
            have = latest.get(row[0])
            if have is None or row[1] > have[1]:
                latest[row[0]] = row
        rows = list(latest.values())  # (rank, attempt, records, median_interval_s, last_step, last_ts, …)

        def most(i):
            vals = [r[i] for r in rows if r[i] is not None]
            return max(vals) if vals else None

        ended = [r for r in rows if r[7] is not None]
        failed = sum(1 for r in ended if state.rank_end_state(r[7], r[8]) is state.RankState.FAILED)
        self.conn.execute(
            "UPDATE runs SET updated_version = ?, last_change = ?, median_interval_s = ?, ranks_total = ?,"
            " ranks_ended = ?, ranks_failed = ?, last_step = ?, last_ts = ?, last_seen = ?, records = ? WHERE run_id = ?",
            (version, now, live.run_median_interval(r[3] for r in rows), len(rows), len(ended), failed, most(4), most(5), most(6),
             total_records, run_id),
        )

    # ----------------------------------------------------------------- series
    def _width(self, run_id: int, rank: int) -> int:
        key = (run_id, rank)
        w = self._widths.get(key)
        if w is None:
            row = self.conn.execute("SELECT width FROM series_width WHERE run_id = ? AND rank = ?", key).fetchone()
            w = row[0] if row else 0
            self._widths[key] = w
        return w

    def write_series(self, run_id: int, rank: int, cols: list, ratios: dict) -> None:
        """Fold a batch into the series tables: ``cols`` are the step-row columns (``zip(*rows)``),
        ``ratios`` maps each loss component to its (step, ratio) pairs (see :func:`live.step_rows`)."""
        steps, values = live.series_values((), cols)
        current = self._width(run_id, rank)
        width = live.series_width(int(steps.max()), current or 1)
        if width != current:
            if current:
                self.merge_series(run_id, rank, width // current)
            self.conn.execute("INSERT OR REPLACE INTO series_width VALUES (?, ?, ?)", (run_id, rank, width))
            self._widths[(run_id, rank)] = width
        b, lo, hi, vmin, vmax, vsum, n = live.bucket_aggregates(steps, values, width)
        m = len(idx.SERIES_METRICS)
        out = np.empty((len(b), 3 + 4 * m), dtype=np.float64)
        out[:, 0], out[:, 1], out[:, 2] = b, lo, hi
        empty = n == 0
        vsum[empty] = np.nan  # NaN binds as NULL: an empty metric stays NULL after the merge
        out[:, 3::4], out[:, 4::4], out[:, 5::4], out[:, 6::4] = vmin, vmax, vsum, n
        if len(out) > SMALL_FOLD:
            self.conn.executemany(series_upsert_sql(run_id, rank), out.tolist())
        else:  # a live pass's few buckets: one shared statement (per-rank texts would overflow the statement cache)
            self.conn.executemany(SERIES_UPSERT, [(run_id, rank, *row) for row in out.tolist()])
        if ratios:
            extra = []
            for name, pairs in ratios.items():
                # fromiter over the flattened pairs: several times faster than np.array(list of tuples)
                arr = np.fromiter(chain.from_iterable(pairs), dtype=np.float64, count=2 * len(pairs)).reshape(-1, 2)
                b, lo, hi, vmin, vmax, vsum, n = live.bucket_aggregates(arr[:, 0], arr[:, 1:], width)
                keep = n[:, 0] > 0
                block = np.column_stack((b, lo, hi, vmin[:, 0], vmax[:, 0], vsum[:, 0], n[:, 0]))[keep]
                extra.extend((run_id, rank, "ratio/" + name, *row) for row in block.tolist())
            self.conn.executemany(EXTRA_UPSERT, extra)

    def write_series_many(self, items: list[tuple[int, int, list, dict]]) -> None:
        """Fold many small batches at once: ``items`` are ``(run_id, rank, cols, ratios)`` as
        :meth:`write_series` takes them. Same buckets and values as one :meth:`write_series` per item, but
        one vectorised pass and one statement for all of them (:meth:`write_series_columns`): a live pass that
        read one line from each of a thousand ranks pays numpy's per-call overhead once, not per rank.
        """
        if not items:
            return
        keys: list = []
        merged: list[list] = [[] for _ in range(live.COL_DATA_IN_STEP + 1)]
        ratios: list = []
        for run_id, rank, cols, pairs_of in items:
            key = (run_id, rank)
            keys.extend([key] * len(cols[live.COL_STEP]))
            for c in _SERIES_INPUT_COLS:
                merged[c].extend(cols[c])
            for name, pairs in (pairs_of or {}).items():
                ratios.extend((key, name, step, ratio) for step, ratio in pairs)
        self.write_series_columns(keys, merged, ratios)

    def write_series_columns(self, keys: list, cols: Sequence[Sequence], ratios: list) -> None:
        """Fold rows of many ranks into the series at once: ``keys[i]`` is row ``i``'s ``(run_id, rank, …)``,
        ``cols`` the rows' step-row columns (``zip(*rows)``), ``ratios`` their loss components' ratios as
        ``(key, name, step, ratio)`` (``key`` as in ``keys``). The same buckets and values as
        :meth:`write_series` per rank: the rows are grouped by rank and bucket with numpy, each bucket bound
        once (a bucket of one step by :data:`SINGLE_UPSERT`); the live table's merge folds its whole log of
        waiting rows with one call (daemon/live_table.py)."""
        if not keys:
            return
        # Row -> rank slot: the distinct keys first (a dict per row), then each key's (run, rank).
        key_slot: dict = {}
        slot_of_key = [key_slot.setdefault(k, len(key_slot)) for k in keys]
        rank_slot: dict[tuple[int, int], int] = {}
        key_to_rank = np.array([rank_slot.setdefault((k[0], k[1]), len(rank_slot)) for k in key_slot],
                               dtype=np.int64)
        slots = key_to_rank[np.array(slot_of_key, dtype=np.int64)]
        ranks = list(rank_slot)
        steps, values = live.series_values((), cols)
        top = np.full(len(ranks), -np.inf)
        np.maximum.at(top, slots, steps)
        widths = []
        for (run_id, rank), high in zip(ranks, top.tolist()):  # widths first: a wider bucket merges the stored ones
            current = self._width(run_id, rank)
            width = live.series_width(int(high), current or 1)
            if width != current:
                if current:
                    self.merge_series(run_id, rank, width // current)
                self.conn.execute("INSERT OR REPLACE INTO series_width VALUES (?, ?, ?)", (run_id, rank, width))
                self._widths[(run_id, rank)] = width
            widths.append(width)
        width_of = np.array(widths, dtype=np.int64)
        buckets = (steps.astype(np.int64) - 1) // width_of[slots]
        g_slot, g_bucket, lo, hi, vmin, vmax, vsum, n, size = _grouped(slots, buckets, steps, values)
        m = len(idx.SERIES_METRICS)
        # run_id and rank as floats beside the bucket's figures: the INTEGER columns store them as integers (as
        # they do bucket, steps and counts), and the rows go to SQLite straight from numpy, no tuple per row.
        key_cols = np.array(ranks, dtype=np.float64).reshape(-1, 2)[g_slot]
        one = size == 1
        if one.any():
            # A bucket of one step (a young rank's every bucket): its min, max and sum are its value, its count
            # 1 where the value is there — bound once (SINGLE_UPSERT), the same stored row.
            single = np.empty((int(one.sum()), 4 + m), dtype=np.float64)
            single[:, :2], single[:, 2], single[:, 3], single[:, 4:] = key_cols[one], g_bucket[one], lo[one], vmin[one]
            self.conn.executemany(SINGLE_UPSERT, single.tolist())
        if not one.all():
            many = ~one
            out = np.empty((int(many.sum()), 5 + 4 * m), dtype=np.float64)
            out[:, :2], out[:, 2], out[:, 3], out[:, 4] = key_cols[many], g_bucket[many], lo[many], hi[many]
            vsum[n == 0] = np.nan  # NaN binds as NULL: an empty metric stays NULL after the merge
            out[:, 5::4], out[:, 6::4], out[:, 7::4], out[:, 8::4] = vmin[many], vmax[many], vsum[many], n[many]
            self.conn.executemany(SERIES_UPSERT, out.tolist())
        if ratios:
            extra_slot: dict = {}
            e_slot = [extra_slot.setdefault((k[0], k[1], name), len(extra_slot)) for k, name, _, _ in ratios]
            extra_keys = list(extra_slot)
            e_width = width_of[np.array([rank_slot[(k[0], k[1])] for k in extra_keys], dtype=np.int64)]
            slots = np.array(e_slot, dtype=np.int64)
            steps = np.fromiter((r[2] for r in ratios), dtype=np.float64, count=len(ratios))
            values = np.fromiter((r[3] for r in ratios), dtype=np.float64, count=len(ratios)).reshape(-1, 1)
            buckets = (steps.astype(np.int64) - 1) // e_width[slots]
            g_slot, g_bucket, lo, hi, vmin, vmax, vsum, n, _ = _grouped(slots, buckets, steps, values)
            keep = n[:, 0] > 0
            block = np.column_stack((g_bucket, lo, hi, vmin[:, 0], vmax[:, 0], vsum[:, 0], n[:, 0]))[keep]
            names = [(run_id, rank, "ratio/" + name) for run_id, rank, name in extra_keys]
            self.conn.executemany(EXTRA_UPSERT, [(*names[s_i], *row) for s_i, row
                                                 in zip(g_slot[keep].tolist(), block.tolist())])

    def rebuild_step_series(self, run_id: int, rank: int, chunk: int = 65_536) -> None:
        """Recompute the ``step_ms``, ``input_wait_ms`` and ``gpu_step_ms`` series of one rank from its stored
        step rows (after an upgrade: an index written before they meant the step time held the traced step).

        The buckets keep their width; the other metrics are left as they are.
        Reads the rank's rows ``chunk`` at a time.
        """
        width = self._width(run_id, rank)
        if not width:
            return
        metrics = idx.SERIES_METRICS[:3]  # step_ms, input_wait_ms, gpu_step_ms: live.series_values' first three
        acc: dict[int, list] = {}
        cur = self.conn.execute(
            "SELECT step, step_ms, input_wait_ms, gpu_step_ms, gpu_input_wait_ms FROM steps WHERE run_id = ?"
            " AND rank = ?", (run_id, rank))
        while True:
            rows = cur.fetchmany(chunk)
            if not rows:
                break
            step, traced, wait, gpu, gpu_wait = (np.array(c, dtype=np.float64) for c in zip(*rows))
            values = np.column_stack((live.whole_step_ms(traced, wait), live.gap_ms(wait),
                                      live.whole_step_ms(gpu, gpu_wait)))
            for row in zip(*(a.tolist() for a in live.bucket_aggregates(step, values, width))):
                b, lo, hi, vmin, vmax, vsum, n = row
                have = acc.get(b)
                if have is None:
                    acc[b] = [vmin, vmax, vsum, n]
                    continue
                have[0] = [_nanmin(x, y) for x, y in zip(have[0], vmin)]
                have[1] = [_nanmax(x, y) for x, y in zip(have[1], vmax)]
                have[2] = [x + y for x, y in zip(have[2], vsum)]
                have[3] = [x + y for x, y in zip(have[3], n)]
        sets = ", ".join(f"{m}_min = ?, {m}_max = ?, {m}_sum = ?, {m}_n = ?" for m in metrics)
        out = []
        for b, (vmin, vmax, vsum, n) in acc.items():
            vals = []
            for j in range(len(metrics)):
                vals += [_sql(vmin[j]), _sql(vmax[j]), _sql(vsum[j]) if n[j] else None, int(n[j])]
            out.append((*vals, run_id, rank, int(b)))
        self.conn.executemany(f"UPDATE series SET {sets} WHERE run_id = ? AND rank = ? AND bucket = ?", out)

    def rebuild_rank(self, key: RankKey) -> None:
        """Rebuild one (run, rank, attempt)'s window from the step rows that remain (a file's generation changed:
        its rows were re-supplied, so counts folded in before would be counted twice). The ``rank_end`` facts,
        node and latest ratios (not stored per step) are kept."""
        old = self.windows.pop(key, None) or self.window(key)
        self.windows.pop(key, None)
        self._figures.pop(key, None)
        w = live.RankWindow()
        w.ended, w.exit_code, w.end_ts, w.node, w.ratios = old.ended, old.exit_code, old.end_ts, old.node, old.ratios
        count, first, last = self.conn.execute(
            "SELECT count(*), min(step), max(step) FROM steps WHERE run_id = ? AND rank = ? AND attempt = ?",
            key).fetchone()
        w.records, w.first_step, w.last_step = count, first, last
        if last is not None:
            w.last_ts, w.loss = self.conn.execute(
                "SELECT ts, loss FROM steps WHERE run_id = ? AND rank = ? AND attempt = ? AND step = ?",
                (*key, last)).fetchone()
            self._load_tail(w, key)
        if w.node is None:
            w.node = self.header_node(key)
        self.windows[key] = w

    def rebuild_series(self, run_id: int, rank: int, chunk: int = 65_536) -> None:
        """Refold one rank's wide series from its stored step rows (every attempt), buckets emptied first.

        The ``ratio/<component>`` series (``series_extra``) are not stored per step and are left as they are.
        """
        self.conn.execute("DELETE FROM series WHERE run_id = ? AND rank = ?", (run_id, rank))
        names = ", ".join(idx.STEP_COLUMNS[1:])
        cur = self.conn.execute(f"SELECT {names} FROM steps WHERE run_id = ? AND rank = ?", (run_id, rank))
        while True:
            rows = cur.fetchmany(chunk)
            if not rows:
                break
            self.write_series(run_id, rank, list(zip(*rows)), {})

    def merge_series(self, run_id: int, rank: int, factor: int) -> None:
        """Merge every ``factor`` neighbouring buckets of one rank's series (the bucket width grew)."""
        aggs = ", ".join(f"min({m}_min), max({m}_max), sum({m}_sum), sum({m}_n)" for m in idx.SERIES_METRICS)
        self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS series_tmp AS SELECT * FROM series WHERE 0")
        self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS extra_tmp AS SELECT * FROM series_extra WHERE 0")
        self.conn.execute(
            f"INSERT INTO temp.series_tmp SELECT run_id, rank, bucket / {factor}, min(step_lo), max(step_hi), {aggs}"
            " FROM series WHERE run_id = ? AND rank = ? GROUP BY bucket / ?", (run_id, rank, factor))
        self.conn.execute("DELETE FROM series WHERE run_id = ? AND rank = ?", (run_id, rank))
        self.conn.execute("INSERT INTO series SELECT * FROM temp.series_tmp")
        self.conn.execute("DELETE FROM temp.series_tmp")
        self.conn.execute(
            f"INSERT INTO temp.extra_tmp SELECT run_id, rank, metric, bucket / {factor}, min(step_lo), max(step_hi),"
            " min(vmin), max(vmax), sum(vsum), sum(n) FROM series_extra WHERE run_id = ? AND rank = ?"
            " GROUP BY metric, bucket / ?", (run_id, rank, factor))
        self.conn.execute("DELETE FROM series_extra WHERE run_id = ? AND rank = ?", (run_id, rank))
        self.conn.execute("INSERT INTO series_extra SELECT * FROM temp.extra_tmp")
        self.conn.execute("DELETE FROM temp.extra_tmp")


#: The step-row columns :func:`live.series_values` reads.
_SERIES_INPUT_COLS = (live.COL_STEP, live.COL_STEP_MS, live.COL_INPUT_WAIT, live.COL_GPU_STEP, live.COL_GPU_INPUT_WAIT,
                      *live.SERIES_COLS[3:])


def _grouped(slots: np.ndarray, buckets: np.ndarray, steps: np.ndarray, values: np.ndarray):
    """Per-(slot, bucket) aggregates, as :func:`live.bucket_aggregates` computes them per bucket.

    Returns ``(slot, bucket, step_lo, step_hi, vmin, vmax, vsum, n, rows)``, one entry per group (``rows``: how
    many rows it holds).
    """
    order = np.lexsort((buckets, slots))
    sl, b = slots[order], buckets[order]
    s = steps[order]
    v = values[order]
    starts = np.flatnonzero(np.r_[True, (b[1:] != b[:-1]) | (sl[1:] != sl[:-1])])
    finite = ~np.isnan(v)
    vmin = np.fmin.reduceat(v, starts, axis=0)
    vmax = np.fmax.reduceat(v, starts, axis=0)
    vsum = np.add.reduceat(np.where(finite, v, 0.0), starts, axis=0)
    n = np.add.reduceat(finite.astype(np.int64), starts, axis=0)
    return (sl[starts], b[starts], np.minimum.reduceat(s, starts), np.maximum.reduceat(s, starts), vmin, vmax, vsum, n,
            np.diff(np.r_[starts, len(sl)]))


def _parts_json(parts: Optional[dict]) -> Optional[str]:
    """``rank_live.step_parts``: the window's averages as JSON (None: no step with a traced time)."""
    return json.dumps(parts, separators=(",", ":")) if parts is not None else None


def _sql(v: float) -> Optional[float]:
    return None if v != v else v  # NaN → NULL


def _nanmin(a: float, b: float) -> float:
    return b if a != a else a if b != b else min(a, b)


def _nanmax(a: float, b: float) -> float:
    return b if a != a else a if b != b else max(a, b)


_header_decoder = msgspec.json.Decoder()


def header_node(header: Optional[str]) -> Optional[int]:
    """``node_rank`` of a stored header line (``files.header``); None when absent or unreadable."""
    if not header:
        return None
    try:
        value = _header_decoder.decode(header)
    except msgspec.DecodeError:
        return None
    node = value.get("node_rank") if isinstance(value, dict) else None
    return node if isinstance(node, int) and not isinstance(node, bool) else None


# --------------------------------------------------------------------------- run facts from side files


def write_manifest_facts(conn: sqlite3.Connection, run_id: int, facts: Optional[sidefiles.ManifestFacts],
                         folder_name: str) -> None:
    """The manifest's facts into the run's row; all NULL (and the folder's name) without a readable manifest."""
    f = facts
    conn.execute(
        "UPDATE runs SET manifest_status = ?, training_status = ?, nnodes = ?, nproc_per_node = ?, world_size = ?,"
        " started_at = ?, ended_at = ?, max_attempts = ?, name = ? WHERE run_id = ?",
        (f.status, f.training_status, f.nnodes, f.nproc_per_node, f.world_size, f.started_at, f.ended_at,
         f.max_attempts, f.run_name or folder_name, run_id) if f is not None
        else (None, None, None, None, None, None, None, None, folder_name, run_id),
    )


def write_summary_facts(conn: sqlite3.Connection, run_id: int, facts: Optional[sidefiles.SummaryFacts]) -> None:
    """The final summary's facts into the run's row; NULL without a readable summary."""
    f = facts
    codes = json.dumps(dict(f.launcher_exit_codes), separators=(",", ":")) if f and f.launcher_exit_codes else None
    conn.execute("UPDATE runs SET summary_status = ?, launcher_exit_codes = ? WHERE run_id = ?",
                 (f.status if f is not None else None, codes, run_id))


def write_outcome_rollup(conn: sqlite3.Connection, run_id: int) -> None:
    """``outcomes_total``, ``outcomes_failed`` and ``outcome_nodes`` from the run's stored outcome files."""
    roll = sidefiles.outcome_rollup(
        sidefiles.decode_facts("outcome", content, key) for key, content in conn.execute(
            "SELECT key, content FROM side_files WHERE run_id = ? AND kind = 'outcome' AND content IS NOT NULL",
            (run_id,)).fetchall())
    conn.execute("UPDATE runs SET outcomes_total = ?, outcomes_failed = ?, outcome_nodes = ? WHERE run_id = ?",
                 (roll.total, roll.failed, roll.nodes, run_id))


# --------------------------------------------------------------------------- UPSERT SQL of the series tables


def _combine(col: str, fn: str) -> str:
    return f"{col} = coalesce({fn}({col}, excluded.{col}), {col}, excluded.{col})"


def _series_upsert() -> str:
    cols = ["run_id", "rank", "bucket", "step_lo", "step_hi"]
    sets = [_combine("step_lo", "min"), _combine("step_hi", "max")]
    for m in idx.SERIES_METRICS:
        cols += [f"{m}_min", f"{m}_max", f"{m}_sum", f"{m}_n"]
        sets += [_combine(f"{m}_min", "min"), _combine(f"{m}_max", "max"),
                 f"{m}_sum = coalesce({m}_sum, 0) + coalesce(excluded.{m}_sum, 0)", f"{m}_n = {m}_n + excluded.{m}_n"]
    return (f"INSERT INTO series ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
            f" ON CONFLICT (run_id, rank, bucket) DO UPDATE SET {', '.join(sets)}")


SERIES_UPSERT = _series_upsert()


def _single_upsert() -> str:
    """:data:`SERIES_UPSERT` for a bucket of one step: run_id, rank, bucket, the step, then each metric's value
    once (NULL: not there); min, max and sum are the value, the count 1 or 0 — the row the full statement
    stores for it, with a third of the values to bind."""
    head, _, tail = SERIES_UPSERT.partition(" VALUES (")
    values = ["?1", "?2", "?3", "?4", "?4"]
    for k in range(len(idx.SERIES_METRICS)):
        p = f"?{5 + k}"
        values += [p, p, p, f"({p} IS NOT NULL)"]
    return f"{head} VALUES ({', '.join(values)}){tail[tail.index(')') + 1:]}"


SINGLE_UPSERT = _single_upsert()
SMALL_FOLD = 8  # up to this many buckets a fold binds run and rank instead of inlining them
_series_sql_cache: dict[tuple[int, int], str] = {}


def series_upsert_sql(run_id: int, rank: int) -> str:
    """The series UPSERT with run_id and rank inlined (rows are then plain float lists from numpy)."""
    sql = _series_sql_cache.get((run_id, rank))
    if sql is None:
        if len(_series_sql_cache) > 4096:
            _series_sql_cache.clear()
        head, _, tail = SERIES_UPSERT.partition("VALUES (?, ?, ")
        sql = _series_sql_cache[(run_id, rank)] = f"{head}VALUES ({int(run_id)}, {int(rank)}, {tail}"
    return sql


EXTRA_UPSERT = (
    "INSERT INTO series_extra VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, rank, metric, bucket)"
    f" DO UPDATE SET {_combine('step_lo', 'min')}, {_combine('step_hi', 'max')}, {_combine('vmin', 'min')},"
    f" {_combine('vmax', 'max')}, vsum = vsum + excluded.vsum, n = n + excluded.n"
)
