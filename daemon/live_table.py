"""The live table: where a live pass's step rows go, and the merge that moves them (docs/daemon.md, "Live path").

A live daemon reads one or a few lines from each of a thousand streams per pass. Stored straight into
``steps_stored`` (keyed by run, rank, attempt, step: a rank's rows are contiguous) each of them dirties its own
leaf page, and so does its fold into ``series`` and ``series_extra``. Here they go to ``steps_live`` instead
(:data:`daemon.index.LIVE_TABLE`), keyed by arrival, so that one pass's rows of every rank share a few pages; a
**merge**, in its own transaction every :data:`MERGE_EVERY_S` or :data:`MERGE_ROWS` rows and when the
ingester stops (and at open, for rows a killed daemon left), moves them in bulk, sorted by key, into
``steps_stored`` and folds them into the series in the same transaction.

What holds exactly-once (docs/daemon.md rules 2 and 3):

* a row counts as stored the moment it is in either table; it is inserted in the pass's transaction with its
  file's new offset, as before;
* a row is in one table, never both: the insert skips a step ``steps_stored`` holds, the unique index of
  ``steps_live`` skips one it holds, and before any row of a rank is written to ``steps_stored`` another way
  (a cold block, a new generation, a rebuild) that rank's live rows are moved first (:meth:`LiveTable.move`);
* the series hold exactly the rows of ``steps_stored``: live rows are folded when, and only when, they are
  moved, in the transaction that moves them. The live table is the watermark: a daemon killed at any moment
  leaves each row either unmoved and unfolded or moved and folded, and the next one merges what is left.

The ``steps`` view reads both tables, each value as a merge would store it (:data:`daemon.index.LIVE_DERIVED`),
so no reader's query changes meaning and a merge changes no value anyone sees.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Iterable, Optional, Sequence

import msgspec

from . import index as idx
from . import live

RankKey = tuple[int, int, int]  # (run_id, rank, attempt)

MERGE_EVERY_S = 5.0  # a live row waits at most about this long (and one pass) for its merge …
MERGE_ROWS = 50_000  # … or until this many rows wait, whichever comes first
#: A merge moves at most this many ranks' rows per transaction. Each rank it moves rewrites its own last leaf
#: pages of ``steps_stored``, ``series`` and ``series_extra`` (~5 pages, 20 KiB), and one transaction's pages
#: all go to the WAL before any checkpoint may copy them back: 6,400 ranks in one merge made a WAL of
#: 100–200 MiB, past the 16 MiB bound (daemon/wal.py). 256 ranks keep a merge's transaction near 5 MiB.
MERGE_SLICE_KEYS = 256

_ROW_COLUMNS = idx.STEP_COLUMNS[1:]  # a row tuple's columns (live.step_rows), in order
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(dict[str, float]).decode
_KEY_WHERE = "run_id = ? AND rank = ? AND attempt = ?"
_SPAN_WHERE = "(run_id, rank, attempt) BETWEEN (?, ?, ?) AND (?, ?, ?)"  # a slice of the keys (the unique index)
_MOVE_SQL = "INSERT INTO {stored} ({cols}) SELECT {exprs} FROM {live}{where} ORDER BY run_id, rank, attempt, step"


def _move_sql(where: str) -> str:
    pairs = idx.step_values_sql({c: c for c in idx.STEP_COLUMNS})
    return _MOVE_SQL.format(stored=idx.STEPS_TABLE, cols=", ".join(c for c, _ in pairs),
                            exprs=", ".join(e for _, e in pairs), live=idx.LIVE_TABLE, where=where)


_MOVE_ALL = _move_sql("")
_MOVE_KEY = _move_sql(f" WHERE {_KEY_WHERE}")
_MOVE_SPAN = _move_sql(f" WHERE {_SPAN_WHERE}")
_READ = (f"SELECT run_id, {', '.join(_ROW_COLUMNS)}, ratios FROM {idx.LIVE_TABLE}{{where}}"
         " ORDER BY run_id, rank, attempt, step")


def ratio_texts(steps: Sequence[int], ratios: Optional[dict], n: int) -> list[Optional[str]]:
    """Each row's loss-component ratios as the live table keeps them (JSON ``{name: ratio}``, None without any),
    from a group's ``ratios`` (per component, its ``(step, ratio)`` pairs: :func:`live.step_rows`). A step
    repeated in the group gets its first line's ratios, as the first line is the row that is stored."""
    if not ratios:
        return [None] * n
    if n == 1:
        return [_encode({name: pairs[0][1] for name, pairs in ratios.items()}).decode()]
    by_step: dict[int, dict[str, float]] = {}
    for name, pairs in ratios.items():
        for step, ratio in pairs:
            by_step.setdefault(step, {}).setdefault(name, ratio)
    return [_encode(by_step[s]).decode() if s in by_step else None for s in steps]


class LiveTable:
    """The live table of the writer connection ``conn`` and what waits in it (see the module docstring).

    ``enabled`` is set by the live daemon (``Ingester.live_settings``): ``--once`` and the cold path store
    their rows straight into ``steps_stored``, in bulk.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.enabled = False
        self.merge_every = MERGE_EVERY_S
        self.merge_rows = MERGE_ROWS
        self.merge_keys = MERGE_SLICE_KEYS  # ranks moved per merge transaction (:meth:`slices`)
        self.tick = time.monotonic  # the clock of merge_every (injectable for tests)
        self.pending: dict[RankKey, int] = {}  # rows waiting per (run, rank, attempt), this transaction included
        self.rows = 0
        self.since: Optional[float] = None  # when the oldest waiting row was inserted (``tick``)
        self._insert_sql: dict[tuple[int, tuple[int, ...]], str] = {}
        #: New steps of this transaction not inserted yet, per set of columns they carry (:meth:`add`)
        self._buffer: dict[tuple[int, ...], list[tuple]] = {}
        self._buffered = 0
        #: False once a flush found a step it was told is new stored already (a broken assumption, never seen):
        #: every live row is then inserted on its own and counted exactly, from the retried pass on
        self.shared_inserts = True
        #: The waiting rows' row tuples and ratios, logged as they were inserted (one entry per row, in arrival
        #: order: a list append per row rather than a list per rank), so that a merge folds them without reading
        #: them back; ``_remembered`` says whether they are exactly what waits (not after a reload, nor after an
        #: insert that skipped rows): else the merge reads the table. ``_log_ratios`` holds ``(key, name, step,
        #: ratio)`` per component ratio of a logged row; ``_groups`` the log's entries per key, made at a merge.
        self._log_keys: list[RankKey] = []
        self._log_rows: list[tuple] = []
        self._log_ratios: list[tuple] = []
        self._groups: Optional[dict[RankKey, tuple[list[int], list[int]]]] = None
        self._sliced = False  # a merge's slice moved some of the logged keys (their rows stay in the log)
        self._remembered = True

    def load(self) -> None:
        """What waits in the table as committed (at open, and after a rollback: memory may be ahead)."""
        self._buffer.clear()
        self._buffered = 0
        self._forget()
        self.pending = {(r[0], r[1], r[2]): r[3] for r in self.conn.execute(
            f"SELECT run_id, rank, attempt, count(*) FROM {idx.LIVE_TABLE} GROUP BY run_id, rank, attempt")}
        self.rows = sum(self.pending.values())
        self.since = self.tick() if self.rows else None
        self._remembered = not self.rows

    def due(self) -> bool:
        """True when the waiting rows should be merged now (:data:`MERGE_EVERY_S`, :data:`MERGE_ROWS`)."""
        return bool(self.rows) and (self.rows >= self.merge_rows or self.tick() - self.since >= self.merge_every)

    def slices(self) -> list[Optional[tuple[RankKey, RankKey]]]:
        """How a merge of every waiting row is cut into transactions: spans of at most :attr:`merge_keys`
        waiting ranks, first and last key included, in key order (``[None]``: all of them in one), so that no
        merge transaction's pages outgrow the WAL's bound (:data:`MERGE_SLICE_KEYS`)."""
        if len(self.pending) <= self.merge_keys:
            return [None]
        keys = sorted(self.pending)
        step = max(1, self.merge_keys)
        return [(keys[i], keys[min(len(keys), i + step) - 1]) for i in range(0, len(keys), step)]

    def insert_sql(self, run_id: int, keep: tuple[int, ...]) -> str:
        """INSERT of live rows carrying the row-tuple columns ``keep`` (always rank, attempt and step first) and
        their ratios: a step either table holds already is skipped (rule 3 across both tables)."""
        key = (int(run_id), keep)
        sql = self._insert_sql.get(key)
        if sql is None:
            if keep[:3] != (0, 1, 2):
                raise ValueError("a step row always carries rank, attempt and step")
            if len(self._insert_sql) > 4096:
                self._insert_sql.clear()
            cols = ", ".join(_ROW_COLUMNS[i] for i in keep)
            params = ", ".join(f"?{k}" for k in range(1, len(keep) + 2))
            sql = self._insert_sql[key] = (
                f"INSERT OR IGNORE INTO {idx.LIVE_TABLE} (run_id, {cols}, ratios) SELECT {int(run_id)}, {params}"
                f" WHERE NOT EXISTS (SELECT 1 FROM {idx.STEPS_TABLE} WHERE run_id = {int(run_id)} AND rank = ?1"
                " AND attempt = ?2 AND step = ?3)")
        return sql

    def _forget(self) -> None:
        self._log_keys.clear()
        self._log_rows.clear()
        self._log_ratios.clear()
        self._groups = None
        self._sliced = False

    def _remember(self, key: RankKey, rows: Sequence[tuple], ratios: Optional[dict]) -> None:
        self._groups = None
        self._log_keys.extend([key] * len(rows))
        self._log_rows.extend(rows)
        if ratios:
            log = self._log_ratios
            for name, more in ratios.items():
                log.extend((key, name, step, ratio) for step, ratio in more)

    def add_many(self, keep: tuple[int, ...], values: list[tuple], keys: list[RankKey], rows: list[tuple],
                 ratios: list[tuple]) -> None:
        """New steps of many ranks at once (a pass on columns, ``daemon/columns.py``): ``values`` as :meth:`add`
        takes each (run_id, the ``keep`` columns, its ratio text), ``keys`` and ``rows`` each one's rank and row
        tuple, ``ratios`` their ``(key, name, step, ratio)`` component ratios. Each is newer than every step its
        rank has stored, hence stored by this transaction (see :meth:`add`)."""
        if not values:
            return
        rows_of = self._buffer.get(keep)
        if rows_of is None:
            rows_of = self._buffer[keep] = []
        rows_of.extend(values)
        n = len(values)
        self._buffered += n
        self._groups = None
        self._log_keys.extend(keys)
        self._log_rows.extend(rows)
        self._log_ratios.extend(ratios)
        pending = self.pending
        get = pending.get
        for key in keys:
            pending[key] = get(key, 0) + 1
        if not self.rows:
            self.since = self.tick()
        self.rows += n

    def _drop_logged(self, gone: set) -> None:
        """The log without the rows of the keys ``gone`` (moved on their own, before a merge: a cold block or a
        new generation of a rank with waiting rows). A merge's slices leave the log as it is: their keys are
        never asked for again, and the log is emptied once nothing waits."""
        keep = [i for i, k in enumerate(self._log_keys) if k not in gone]
        self._log_rows = [self._log_rows[i] for i in keep]
        self._log_keys = [self._log_keys[i] for i in keep]
        self._log_ratios = [r for r in self._log_ratios if r[0] not in gone]
        self._groups = None

    def _logged(self, moved: Sequence[RankKey]) -> tuple[list[tuple], list[RankKey], list[tuple]]:
        """The logged rows of the keys ``moved`` (their row tuples, keys and component ratios): the whole log in
        arrival order when they are every waiting key, else key by key in ``moved``'s order, each key's in
        arrival order (the fold groups them by rank and bucket either way)."""
        if not self._sliced and len(moved) == len(self.pending):  # every waiting key: the whole log
            return self._log_rows, self._log_keys, self._log_ratios
        groups = self._groups
        if groups is None:
            groups = self._groups = {}
            for i, key in enumerate(self._log_keys):
                got = groups.get(key)
                if got is None:
                    got = groups[key] = ([], [])
                got[0].append(i)
            for i, entry in enumerate(self._log_ratios):
                got = groups.get(entry[0])
                if got is not None:
                    got[1].append(i)
        rows, keys, ratios = [], [], []
        log_rows, log_ratios = self._log_rows, self._log_ratios
        for key in moved:
            got = groups.get(key)
            if got is None:
                continue
            rows.extend(log_rows[i] for i in got[0])
            keys.extend([key] * len(got[0]))
            ratios.extend(log_ratios[i] for i in got[1])
        return rows, keys, ratios

    def add(self, key: RankKey, keep: tuple[int, ...], value: tuple, row: tuple, ratios: Optional[dict]) -> None:
        """One new step of a rank (``value``: run_id, the ``keep`` columns, its ratio text; ``row``: its row
        tuple, ``ratios``: its group's ratio pairs), newer than every step the rank has stored (its window's
        last step), hence stored by this transaction: it waits with the other new steps of the pass for one
        INSERT of them all (:meth:`flush`), not one statement per rank."""
        rows = self._buffer.get(keep)
        if rows is None:
            rows = self._buffer[keep] = []
        rows.append(value)
        self._buffered += 1
        self._remember(key, (row,), ratios)
        self.pending[key] = self.pending.get(key, 0) + 1
        if not self.rows:
            self.since = self.tick()
        self.rows += 1

    def flush(self) -> None:
        """Insert the new steps :meth:`add` kept (before anything reads the live table, and before COMMIT).
        Each is new to both tables; the statement checks it all the same (a step either table holds is
        skipped), and a count that differs is an error: the transaction is rolled back, never half-counted."""
        if not self._buffered:
            return
        conn = self.conn
        before = conn.total_changes
        for keep, rows in self._buffer.items():
            conn.executemany(self._shared_sql(keep), rows)
        inserted, expected = conn.total_changes - before, self._buffered
        self._buffer.clear()
        self._buffered = 0
        if inserted != expected:
            self.shared_inserts = False  # the pass is rolled back and read again, each row counted on its own
            raise RuntimeError(f"live rows: {inserted} of {expected} new steps stored (a step was stored already);"
                               " the pass is read again with one insert per rank")

    def _shared_sql(self, keep: tuple[int, ...]) -> str:
        sql = self._insert_sql.get((-1, keep))
        if sql is None:
            if keep[:3] != (0, 1, 2):
                raise ValueError("a step row always carries rank, attempt and step")
            cols = ", ".join(_ROW_COLUMNS[i] for i in keep)
            params = ", ".join(f"?{k}" for k in range(1, len(keep) + 3))
            sql = self._insert_sql[(-1, keep)] = (
                f"INSERT OR IGNORE INTO {idx.LIVE_TABLE} (run_id, {cols}, ratios) SELECT {params}"
                f" WHERE NOT EXISTS (SELECT 1 FROM {idx.STEPS_TABLE} WHERE run_id = ?1 AND rank = ?2"
                " AND attempt = ?3 AND step = ?4)")
        return sql

    def insert(self, run_id: int, key: RankKey, keep: tuple[int, ...], values: list[tuple], rows: Sequence[tuple],
               ratios: Optional[dict]) -> int:
        """Insert one rank's rows (``values``: the ``keep`` columns of each row, then its ratio text; ``rows``
        and ``ratios``: their row tuples and ratio pairs); returns how many were stored (a step already stored
        in either table is not)."""
        conn = self.conn
        self.flush()
        before = conn.total_changes
        conn.executemany(self.insert_sql(run_id, keep), values)
        inserted = conn.total_changes - before
        if inserted == len(values):
            self._remember(key, rows, ratios)
        elif inserted:
            self._remembered = False  # which rows were skipped is the table's to say: the merge reads it
        if inserted:
            self.pending[key] = self.pending.get(key, 0) + inserted
            if not self.rows:
                self.since = self.tick()
            self.rows += inserted
        return inserted

    def keys_of(self, run_id: int, rank: int) -> list[RankKey]:
        """The waiting keys of one rank of a run, every attempt."""
        return [k for k in self.pending if k[0] == run_id and k[1] == rank]

    def move(self, agg, keys: Optional[Iterable[RankKey]] = None,
             span: Optional[tuple[RankKey, RankKey]] = None) -> set[int]:
        """Move the waiting rows of ``keys`` (None: all; or those of the keys within ``span``, first and last key
        included: a slice of a merge, :meth:`slices`) into ``steps_stored``, sorted by key, and fold them into
        the series with ``agg`` (:class:`daemon.aggregates.Aggregates`), inside the caller's transaction; returns
        the runs whose rows moved. The rows leave the live table in the same statement group, so a row is
        folded exactly once whatever interrupts it (the module docstring)."""
        conn = self.conn
        self.flush()
        if span is not None:
            lo, hi = span
            moved = [k for k in self.pending if lo <= k <= hi]
            bounds = (*lo, *hi)
            targets = [(_READ.format(where=f" WHERE {_SPAN_WHERE}"), bounds, _MOVE_SPAN,
                        f"DELETE FROM {idx.LIVE_TABLE} WHERE {_SPAN_WHERE}", bounds)]
        elif keys is None:
            targets = [(_READ.format(where=""), (), _MOVE_ALL, f"DELETE FROM {idx.LIVE_TABLE}", ())]
            moved = list(self.pending)
        else:
            moved = [k for k in keys if k in self.pending]
            targets = [(_READ.format(where=f" WHERE {_KEY_WHERE}"), k, _MOVE_KEY,
                        f"DELETE FROM {idx.LIVE_TABLE} WHERE {_KEY_WHERE}", k) for k in moved]
        items = []
        remembered = self._remembered
        for read_sql, params, move_sql, delete_sql, delete_params in targets:
            if not remembered:
                items.extend(_fold_items(conn.execute(read_sql, params).fetchall()))
            conn.execute(move_sql, params)
            conn.execute(delete_sql, delete_params)
        if remembered:
            rows, keys_of_rows, ratios = self._logged(moved)
            if rows:
                agg.write_series_columns(keys_of_rows, list(zip(*rows)), ratios)
        else:
            agg.write_series_many(items)
        if keys is None and span is None:
            self._forget()
            self._remembered = True  # nothing waits: what comes next is remembered as it is inserted
            self.pending.clear()
            self.rows = 0
            self.since = None
        else:
            for k in moved:
                self.rows -= self.pending.pop(k)
            if not self.rows:
                self.since = None
                self._forget()
                self._remembered = True  # nothing waits: what comes next is remembered as it is inserted
            elif span is not None:
                self._sliced = True
            elif moved and remembered:
                self._drop_logged(set(moved))
        return {k[0] for k in moved}


def _fold_items(rows: list[tuple]) -> list[tuple[int, int, list, dict]]:
    """Rows read from the live table (run_id, the row-tuple columns, ratios; key order) as the items of
    ``Aggregates.write_series_many``: one per (run, rank, attempt), with its columns and ratio pairs."""
    items = []
    start = 0
    n = len(rows)
    while start < n:
        run_id, rank, attempt = rows[start][0], rows[start][1], rows[start][2]
        end = start + 1
        while end < n and rows[end][0] == run_id and rows[end][1] == rank and rows[end][2] == attempt:
            end += 1
        group = rows[start:end]
        cols = list(zip(*(r[1:-1] for r in group)))
        ratios: dict[str, list] = {}
        step_col = live.COL_STEP
        for r in group:
            if r[-1] is not None:
                for name, ratio in _decode(r[-1]).items():
                    ratios.setdefault(name, []).append((r[1 + step_col], ratio))
        items.append((run_id, rank, cols, ratios))
        start = end
    return items
