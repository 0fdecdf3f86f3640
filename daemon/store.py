"""The store: the writer's SQL for what the ingester reads (docs/daemon.md rule 2, "What the index stores").

Everything the service writes inside a pass's one transaction goes through :class:`Store`: new runs and
streams, a run gone missing, side files and their facts, error rows, the routing of decoded blocks into
``steps``, ``events`` and ``system`` (with the rolling windows and series of ``daemon/aggregates.py``), the
end of a pass (every file's new cursor, ``rank_live``, the run rollups, the progress row), and the
re-derivation of the columns an upgrade added. The service opens and commits the transaction; a
:class:`Batch` says what it touched. The refusals' rows are ``daemon/refusals.py``'s, the leases'
``daemon/leases.py``'s; the schema and its migrations are ``daemon/index.py``'s.
"""

from __future__ import annotations

import errno
import json
import operator
import os
import sqlite3
import time
from itertools import compress, repeat
from typing import Callable, Optional

import msgspec

from traceml_tui.core import records, rundir

from . import aggregates, live, live_table, refusals, sidefiles
from . import index as idx
from .decode import Prepared
from .plan import File, Planner, Run

SMALL_FOLD_ROWS = 64  # a rank's rows up to this many per read join the pass's one series fold (docs/daemon.md, "Live path")
_body_encoder = msgspec.json.Encoder()
_NONES = repeat(None)  # map(operator.is_not, row, _NONES): which values of a row are not NULL
_POSITIONS = range(64)  # column positions of a step row (more than it has)
_STORED_IN_RANGE = "SELECT step FROM steps WHERE run_id = ? AND rank = ? AND attempt = ? AND step BETWEEN ? AND ?"
_FILE_COLUMNS = ("file_id", "run_id", "rel", "stream", "rank", "attempt", "node", "identity", "generation", "offset",
                 "skipping", "tail", "size", "mtime_ns", "ino")


class Batch:
    """What one open transaction has touched; applied to memory after COMMIT."""

    def __init__(self) -> None:
        self.rows = 0
        self.records = 0  # step rows inserted; counted in records_ingested only once committed
        self.file_updates: dict[File, dict] = {}
        self.ranks: set[tuple[int, int, int]] = set()
        self.runs: set[int] = set()
        self.rebuild: set[tuple[int, int, int]] = set()  # ranks whose rows a new generation re-supplied
        self.series: list[tuple[int, int, list, dict]] = []  # small folds, written together at commit


def folder_name(run_dir: str) -> str:
    """A run's name until its manifest names it: its folder's name."""
    return os.path.basename(run_dir.rstrip("/")) or run_dir


class Store:
    """The writer's SQL over the writer connection ``conn`` (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.agg = aggregates.Aggregates(conn)
        self.live = live_table.LiveTable(conn)  # the live path's rows until they are merged (daemon/live_table.py)

    # ----------------------------------------------------------------- what the index knows
    def load(self, plan: Planner) -> None:
        """Fill ``plan`` with the runs, streams (and their committed cursors) and side files the index holds."""
        plan.clear()
        self.agg.reset()
        self.live.load()
        by_id = {}
        for run_id, run_dir, root, missing in self.conn.execute("SELECT run_id, dir, root, missing FROM runs"):
            by_id[run_id] = run = Run(run_id, run_dir, root, bool(missing))
            plan.add_run(run)
        for row in self.conn.execute(
            "SELECT file_id, run_id, path, stream, rank, attempt, node, identity, generation, offset, skipping, tail,"
            " size, mtime_ns, ino FROM files"
        ):
            f = File(**dict(zip(_FILE_COLUMNS, row)))
            run = by_id.get(f.run_id)
            if run is not None:
                f.path = os.path.join(run.dir, f.rel)
                plan.add_file(run, f)
        for run_id, rel, size, mtime_ns in self.conn.execute("SELECT run_id, path, size, mtime_ns FROM side_files"):
            run = by_id.get(run_id)
            if run is not None:
                run.sides[rel] = (size, mtime_ns)

    def add_run(self, run_dir: str, root: str, batch: Batch) -> Run:
        """A run folder seen for the first time."""
        run_id = idx.ensure_run(self.conn, run_dir, root, folder_name(run_dir))
        batch.runs.add(run_id)
        return Run(run_id, run_dir, root, False)

    def set_missing(self, run: Run, missing: bool, batch: Batch) -> None:
        """A run's folder gone (rule 7: its rows are kept) or back."""
        self.conn.execute("UPDATE runs SET missing = ? WHERE run_id = ?", (int(missing), run.run_id))
        run.missing = missing
        batch.runs.add(run.run_id)

    def add_stream(self, run: Run, s: rundir.StreamFile) -> File:
        """A stream seen for the first time (or again after a restart: its committed cursor comes back)."""
        # Two statements rather than UPSERT … RETURNING: works with SQLite older than 3.35.
        self.conn.execute(
            "INSERT OR IGNORE INTO files (run_id, path, stream, rank, attempt, node) VALUES (?, ?, ?, ?, ?, ?)",
            (run.run_id, s.rel, s.stream, s.rank, s.attempt, s.node),
        )
        file_id, identity, generation, offset, skipping, tail = self.conn.execute(
            "SELECT file_id, identity, generation, offset, skipping, tail FROM files WHERE run_id = ? AND path = ?",
            (run.run_id, s.rel)).fetchone()
        return File(file_id=file_id, run_id=run.run_id, rel=s.rel, path=os.path.join(run.dir, s.rel),
                    stream=s.stream, rank=s.rank, attempt=s.attempt, node=s.node, identity=identity,
                    generation=generation, offset=offset, skipping=skipping, tail=tail)

    # ----------------------------------------------------------------- side files
    def side_file(self, run: Run, rel: str, kind: str, read: sidefiles.SideRead, size: int, mtime_ns: int,
                  batch: Batch) -> None:
        """One version of a side file as read: its row, its error row (per version) and its facts."""
        self.conn.execute("INSERT OR REPLACE INTO side_files VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          (run.run_id, rel, kind, read.key, size, mtime_ns, read.content, read.error))
        if read.error is not None:
            refusals.side_error(self.conn, run.run_id, rel, mtime_ns, size, read.error)
        batch.runs.add(run.run_id)
        self.side_facts(run, kind, read.facts)

    def drop_side(self, run: Run, rel: str, batch: Batch) -> None:
        """A side file removed from a run folder still there: its row and its facts go."""
        row = self.conn.execute("SELECT kind FROM side_files WHERE run_id = ? AND path = ?",
                                (run.run_id, rel)).fetchone()
        self.conn.execute("DELETE FROM side_files WHERE run_id = ? AND path = ?", (run.run_id, rel))
        batch.runs.add(run.run_id)
        if row is not None:
            self.side_facts(run, row[0], None)

    def side_facts(self, run: Run, kind: str, facts: sidefiles.Facts) -> None:
        """Copy a side file's facts (None: unreadable or removed) into the runs row."""
        if kind == "manifest":
            aggregates.write_manifest_facts(self.conn, run.run_id, facts, folder_name(run.dir))
        elif kind == "summary":
            aggregates.write_summary_facts(self.conn, run.run_id, facts)
        elif kind == "outcome":
            aggregates.write_outcome_rollup(self.conn, run.run_id)

    def unreadable(self, run: Run, rel: str, path: str, exc: OSError, begin: Callable[[], Batch]) -> None:
        """A file we may not read is one error row naming it (per version), never a silent skip; ``begin``
        opens the transaction only when there is a row to write."""
        if exc.errno in (errno.EACCES, errno.EPERM):  # else gone, or a link refused on the way: nothing to say
            batch = begin()
            if refusals.unreadable_error(self.conn, run.run_id, rel, path, exc):
                batch.runs.add(run.run_id)

    # ----------------------------------------------------------------- lines
    def error(self, run: Run, f: File, cur: dict, offset: int, length: int, message: str, batch: Batch) -> None:
        """One bad line of a stream (the cursor ``cur``'s identity and generation): one error row."""
        if cur["generation"] and self.conn.execute(
                "SELECT 1 FROM errors WHERE run_id = ? AND identity = ? AND offset = ? AND length IS ? AND message = ?"
                " AND generation < ?", (run.run_id, cur["identity"], offset, length, message,
                                        cur["generation"])).fetchone():
            return  # the same line of an earlier generation, reported already
        c = self.conn.execute(
            "INSERT OR IGNORE INTO errors (run_id, path, identity, generation, offset, length, message, seen)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run.run_id, f.rel, cur["identity"], cur["generation"], offset, length, message, time.time()),
        )
        if c.rowcount:
            self.conn.execute("UPDATE runs SET errors = errors + 1 WHERE run_id = ?", (run.run_id,))
            batch.runs.add(run.run_id)

    def route(self, run: Run, f: File, cur: dict, prepared: Prepared, batch: Batch, append: bool = False) -> None:
        """A decoded block of ``f`` (read under the cursor ``cur``): its errors, its other records and its
        step rows, with the rank windows and series that follow them. ``append``: a small append of the live
        path, whose step rows go to the live table when the live daemon keeps one (daemon/live_table.py)."""
        for off, length, message in prepared.errors:
            self.error(run, f, cur, off, length, message, batch)
        if prepared.others:
            self._route_other(run, f, cur, prepared.others, batch)
        if prepared.groups:
            if append and self.live.enabled and not cur["generation"]:
                self._route_live(run, prepared.groups, batch)
            else:
                self._route_steps(run, cur, prepared.groups, batch)

    def _route_live(self, run: Run, groups: dict, batch: Batch) -> None:
        """Step rows of a live append into the live table: no series fold here (the merge folds them), the
        rank windows as for any stored row."""
        agg = self.agg
        table = self.live
        run_id = run.run_id
        for (rank, attempt), (rows, ratios, latest) in groups.items():
            n = len(rows)
            key = (run_id, rank, attempt)
            window = agg.window(key)
            before = window.last_step  # the rank's newest stored step, before this append
            texts = live_table.ratio_texts([r[live.COL_STEP] for r in rows] if n > 1 else (), ratios, n)
            if n == 1:
                mask = list(map(operator.is_not, rows[0], _NONES))
                keep = tuple(compress(_POSITIONS, mask))
                if table.shared_inserts and (window.last_step is None or rows[0][live.COL_STEP] > window.last_step):
                    # A new step (the window holds the rank's newest stored one): one INSERT for the pass.
                    table.add(key, keep, (run_id, *compress(rows[0], mask), texts[0]), rows[0], ratios)
                    inserted = 1
                else:
                    inserted = table.insert(run_id, key, keep, [(*compress(rows[0], mask), texts[0])], rows, ratios)
            else:
                cols = list(zip(*rows))
                keep = tuple(i for i, col in enumerate(cols) if col[0] is not None or col.count(None) != n)
                inserted = table.insert(run_id, key, keep,
                                        [(*v, t) for v, t in zip(zip(*[cols[i] for i in keep]), texts)], rows, ratios)
            batch.rows += n
            batch.records += inserted
            if n == 1:
                window.add_row(rows[0], inserted)
            else:
                window.add_columns(cols, inserted)
            window.take_ratios(latest, before)
            batch.ranks.add(key)

    def _route_steps(self, run: Run, cur: dict, groups: dict, batch: Batch) -> None:
        conn = self.conn
        agg = self.agg
        for (rank, attempt), (rows, ratios, latest) in groups.items():
            if (run.run_id, rank, attempt) in self.live.pending:  # rule 3 across both tables: its live rows first
                self.live.move(agg, [(run.run_id, rank, attempt)])
            cols = list(zip(*rows))  # transpose in C: the insert, the window and the series read columns
            n = len(rows)
            # Columns NULL in the whole group are left out of the INSERT (same rows, far fewer None binds).
            if n == 1:  # the live case: one line per rank per pass, masked in C
                mask = list(map(operator.is_not, rows[0], _NONES))
                keep = tuple(compress(_POSITIONS, mask))
                values = [tuple(compress(rows[0], mask))]
            else:
                keep = tuple(i for i, col in enumerate(cols) if col[0] is not None or col.count(None) != n)
                values = list(zip(*[cols[i] for i in keep]))
            key = (run.run_id, rank, attempt)
            if cur["generation"]:
                # A later generation re-supplies rows: its values win (REPLACE), and a row it replaced sends
                # the rank's window and series to be rebuilt from the rows that remain (at commit).
                span = (*key, min(cols[live.COL_STEP]), max(cols[live.COL_STEP]))
                count_sql = ("SELECT count(*) FROM steps WHERE run_id = ? AND rank = ? AND attempt = ?"
                             " AND step BETWEEN ? AND ?")
                had = conn.execute(count_sql, span).fetchone()[0]
                conn.executemany(idx.insert_steps_sql(run.run_id, keep).replace("OR IGNORE", "OR REPLACE", 1),
                                 values)
                inserted = conn.execute(count_sql, span).fetchone()[0] - had
                if had:
                    batch.rebuild.add(key)
            else:
                # Steps of this batch stored before it are ignored by the INSERT, like a step repeated within the
                # batch: the series must fold only the rows it stores. Only steps up to the rank's newest stored
                # one can be there (its window's last step), so an append past it costs no look-up.
                stored = ()
                if n > 1:
                    lo, newest = min(cols[live.COL_STEP]), agg.window(key).last_step
                    if newest is not None and lo <= newest:
                        stored = conn.execute(_STORED_IN_RANGE, (*key, lo, max(cols[live.COL_STEP]))).fetchall()
                before = conn.total_changes
                conn.executemany(idx.insert_steps_sql(run.run_id, keep), values)
                inserted = conn.total_changes - before
                if 0 < inserted < n:
                    cols, ratios = _stored_only(cols, ratios, {r[0] for r in stored})
            batch.rows += n
            batch.records += inserted
            window = agg.window(key)
            # A new generation's values win, its ratios too; else only ratios of a step past the rank's newest
            # stored one are the kept row's (docs/daemon.md, "Exactly once").
            before = None if cur["generation"] else window.last_step
            if n == 1:
                window.add_row(rows[0], inserted)
            else:
                window.add_columns(cols, inserted)
            window.take_ratios(latest, before)
            batch.ranks.add(key)
            if inserted:
                if n <= SMALL_FOLD_ROWS:  # a live append: folded at commit with every other rank of the pass
                    batch.series.append((run.run_id, rank, cols, ratios))
                else:
                    agg.write_series(run.run_id, rank, cols, ratios)

    def _route_other(self, run: Run, f: File, cur: dict, others: list, batch: Batch) -> None:
        """Records that are not steps (``(record, line offset)`` pairs): headers, events, system samples."""
        events, samples = [], []
        for rec, off in others:
            kind = type(rec)
            if kind is records.Header:
                if off == 0:
                    self.conn.execute("UPDATE files SET header = ? WHERE file_id = ?",
                                      (_body_encoder.encode(rec).decode(), f.file_id))
                    if f.stream == "steps":  # the rank's node; a window not made yet reads it from files.header
                        w = self.agg.windows.get((run.run_id, rec.rank, rec.attempt))
                        if w is not None:
                            w.node = rec.node_rank
                continue
            if kind is records.SystemSample:
                samples.append((run.run_id, rec.node_rank, rec.ts, rec.cpu_pct, rec.ram_used, rec.ram_total,
                                _body_encoder.encode(rec.gpus).decode() if rec.gpus else None))
                continue
            body = _body_encoder.encode(rec).decode()
            tag = kind.__struct_config__.tag
            # getattr: a kind added to records.py later need not carry every field.
            events.append((run.run_id, cur["identity"], cur["generation"], off, str(tag), getattr(rec, "rank", None),
                           getattr(rec, "attempt", None), getattr(rec, "step", None), getattr(rec, "ts", None), body))
            if kind is records.RankEnd:
                key = (run.run_id, rec.rank, rec.attempt)
                w = self.agg.window(key)
                w.ended = rec.status
                w.exit_code = rec.exit_code
                w.end_ts = rec.ts
                w.took_records()
                batch.ranks.add(key)
        if events and cur["generation"]:
            # Unique per (run, file identity, offset) across generations when the content is the same: a file
            # that shrank and came back (a transient truncation) re-supplies the very same lines.
            same = "SELECT 1 FROM events WHERE run_id = ? AND identity = ? AND offset = ? AND body = ? AND generation < ?"
            events = [e for e in events
                      if self.conn.execute(same, (e[0], e[1], e[3], e[9], e[2])).fetchone() is None]
        if samples:
            self.conn.executemany("INSERT OR IGNORE INTO system VALUES (?, ?, ?, ?, ?, ?, ?)", samples)
            batch.rows += len(samples)
            batch.runs.add(run.run_id)
        if events:
            self.conn.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", events)
            batch.rows += len(events)
            batch.runs.add(run.run_id)

    # ----------------------------------------------------------------- the end of a pass
    def finish(self, batch: Batch, now: float, progress: Optional[dict]) -> None:
        """Everything a pass writes before its COMMIT: the pending series folds, rebuilt ranks, ``rank_live``,
        every file's new cursor (in the transaction that holds its rows: rule 2), the version, the run
        rollups and the progress row (committed with the rows it counts)."""
        agg = self.agg
        self.live.flush()  # the pass's new live steps, in one INSERT (daemon/live_table.py)
        # Pending folds first: a rank rebuilt below refolds its series from the stored rows (these included).
        agg.write_series_many(batch.series)
        for key in batch.rebuild:  # re-supplied rows: recount from the rows that remain, never fold twice
            agg.rebuild_rank(key)
            batch.ranks.add(key)
        for run_id, rank in {(k[0], k[1]) for k in batch.rebuild}:
            self.live.move(agg, self.live.keys_of(run_id, rank))  # folded once: moved before the refold
            agg.rebuild_series(run_id, rank)
        if agg.stale:  # ranks that went quiet with figures older than their last rows
            batch.ranks.update(agg.due_stale())
        agg.write_rank_live_many(batch.ranks, now)
        batch.runs.update(key[0] for key in batch.ranks)
        if batch.file_updates:
            self.conn.executemany(
                "UPDATE files SET identity=?, generation=?, offset=?, skipping=?, tail=?, size=?, mtime_ns=?, ino=?,"
                " missing=0 WHERE file_id=?",
                [(c["identity"], c["generation"], c["offset"], c["skipping"], c["tail"], c["size"], c["mtime_ns"],
                  c["ino"], f.file_id) for f, c in batch.file_updates.items()])
        version = idx.bump_version(self.conn)
        for run_id in batch.runs:
            agg.write_run_rollup(run_id, version, now)
        if progress is not None:
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('ingest_progress', ?)", (json.dumps(progress),))

    # ----------------------------------------------------------------- an upgraded index
    def rederive(self, runs: dict[int, Run], batch: Batch) -> None:
        """Fill the columns an upgrade added from what the index holds (docs/daemon.md, "An index of an older
        version"; nothing is re-read from the run folders)."""
        conn = self.conn
        conn.execute(
            "UPDATE rank_live SET end_ts = (SELECT e.ts FROM events e WHERE e.run_id = rank_live.run_id"
            " AND e.kind = 'rank_end' AND e.rank = rank_live.rank AND e.attempt = rank_live.attempt"
            " ORDER BY e.generation DESC, e.offset DESC LIMIT 1) WHERE ended IS NOT NULL AND end_ts IS NULL")
        for run_id, rank, attempt, header in conn.execute(
                "SELECT run_id, rank, attempt, header FROM files WHERE stream = 'steps' AND header IS NOT NULL"
                " ORDER BY file_id").fetchall():
            node = aggregates.header_node(header)
            if node is not None:
                conn.execute("UPDATE rank_live SET node = ? WHERE run_id = ? AND rank = ? AND attempt = ?"
                             " AND node IS NULL", (node, run_id, rank, attempt))
        for run_id, rel, kind, key, size, mtime_ns, content in conn.execute(
                "SELECT run_id, path, kind, key, size, mtime_ns, content FROM side_files"
                " WHERE kind IN ('manifest', 'summary', 'outcome') ORDER BY run_id, path").fetchall():
            run = runs.get(run_id)
            if run is None:
                continue
            read = (sidefiles.parse(kind, rel, key, content.encode("utf-8")) if content is not None
                    else sidefiles.SideRead(None, None, key))
            if read.error is not None:
                conn.execute("UPDATE side_files SET error = ? WHERE run_id = ? AND path = ?", (read.error, run_id, rel))
                refusals.side_error(conn, run_id, rel, mtime_ns, size, read.error)
            self.side_facts(run, kind, read.facts)
        # The step time is gap + traced step (core.steptime): rank figures and the step series of an index
        # written before they meant that are recomputed from the stored step rows.
        for key in conn.execute("SELECT run_id, rank, attempt FROM rank_live").fetchall():
            self.agg.refresh_step_figures(tuple(key))
        for run_id, rank in conn.execute("SELECT run_id, rank FROM series_width").fetchall():
            self.agg.rebuild_step_series(run_id, rank)
        batch.runs.update(runs)
        idx.rederive_done(conn)


def _stored_only(cols: list, ratios: dict, stored_before: set) -> tuple[list, dict]:
    """The columns (and component ratios) of the rows an ``INSERT OR IGNORE`` of ``cols`` stored.

    Ignored were the steps in ``stored_before`` and every repeat of a step within the batch (the first
    line wins, as in the index): the series and ratios then count each stored step once, as a rebuild
    from the index would (docs/daemon.md rule 2).
    """
    steps = cols[live.COL_STEP]
    first: dict[int, int] = {}
    for i, step in enumerate(steps):
        if step not in stored_before:
            first.setdefault(step, i)
    keep = sorted(first.values())
    cols = [tuple(c[i] for i in keep) for c in cols]
    out = {}
    for name, pairs in (ratios or {}).items():
        seen: set = set()
        kept = []
        for step, value in pairs:
            if step in first and step not in seen:
                seen.add(step)
                kept.append((step, value))
        if kept:
            out[name] = kept
    return cols, out
