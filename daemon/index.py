"""The SQLite index: schema, connection settings, migrations and the single writer's SQL.

Exactly-once ingestion rests on three things kept here (docs/daemon.md rules
2 and 3): every batch commits its rows, error rows and the file's new offset
in one transaction; events and error rows are unique on (run, file identity,
generation, byte offset) so that a stale offset can never insert a line
twice; and step rows are unique on (run, rank, attempt, step).

Only the daemon (or the embedded ingester) writes, under the lock held by
:mod:`daemon.lock`; readers open the file read-only (:mod:`daemon.reader`).

An index written by an older version, or by this version before some of its
columns were added, is upgraded in place when the writer opens it
(:func:`connect_writer`): the columns it lacks are created with
``ALTER TABLE … ADD COLUMN`` and the index is flagged so that the ingester
derives their values from what the index already holds
(:func:`needs_rederive`) — the runs whose folders are gone keep their rows
(rule 7), which a rebuild from the run directories could not do.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Iterable, Optional

SCHEMA_VERSION = 2
#: Columns added after schema version 1, in the order they were added: (table, column, declaration).
#: They sit at the end of their tables, in a new index as in an upgraded one. Version 2 is not released
#: yet and gained columns after its first indexes were written, so the writer upgrades an index that
#: lacks any of them whatever its version number says (:func:`missing_columns`).
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("rank_live", "end_ts", "REAL"),
    ("runs", "outcome_nodes", "TEXT"),
    ("runs", "max_attempts", "INTEGER"),
    ("steps", "data_wait_ms", "REAL"),
    ("steps", "data_in_step_ms", "REAL"),
    ("rank_live", "step_parts", "TEXT"),
)

#: Metrics kept as downsampled series in the wide ``series`` table, in column order.
SERIES_METRICS: tuple[str, ...] = ("step_ms", "input_wait_ms", "gpu_step_ms", "loss", "grad_norm", "lr")

#: Column order of the ``steps`` table (run_id comes first). The timings are the record's own fields on the
#: CPU clock (``step_ms`` is ``cpu_ms.step``, the traced envelope; ``input_wait_ms`` the gap before it;
#: ``data_wait_ms`` / ``data_in_step_ms`` the loader waits in the gap / in the envelope) and, ``gpu_``
#: prefixed, on the GPU clock; the step *time* and its parts are derived from them by core.steptime.
STEP_COLUMNS: tuple[str, ...] = (
    "run_id", "rank", "attempt", "step", "ts",
    "step_ms", "input_wait_ms", "h2d_ms", "forward_ms", "backward_ms", "optimizer_ms",
    "gpu_step_ms", "gpu_input_wait_ms", "gpu_h2d_ms", "gpu_forward_ms", "gpu_backward_ms", "gpu_optimizer_ms",
    "loss", "lr", "grad_norm", "examples", "rss", "extra",
    "data_wait_ms", "data_in_step_ms",
)

_series_cols = ",\n".join(
    f"  {m}_min REAL, {m}_max REAL, {m}_sum REAL, {m}_n INTEGER NOT NULL DEFAULT 0" for m in SERIES_METRICS
)

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS version (id INTEGER PRIMARY KEY CHECK (id = 1), v INTEGER NOT NULL);
INSERT OR IGNORE INTO version VALUES (1, 0);

CREATE TABLE IF NOT EXISTS runs (
  run_id INTEGER PRIMARY KEY,
  dir TEXT NOT NULL UNIQUE,
  root TEXT NOT NULL,
  name TEXT NOT NULL,
  missing INTEGER NOT NULL DEFAULT 0,
  first_seen REAL NOT NULL,
  last_change REAL,
  updated_version INTEGER NOT NULL DEFAULT 0,
  manifest_status TEXT,
  training_status TEXT,
  summary_status TEXT,
  nnodes INTEGER, nproc_per_node INTEGER, world_size INTEGER,
  started_at TEXT, ended_at TEXT,
  steps_per_s REAL, examples_per_s REAL,
  slowest_rank INTEGER, straggler_score REAL,
  ranks_total INTEGER NOT NULL DEFAULT 0, ranks_ended INTEGER NOT NULL DEFAULT 0, ranks_failed INTEGER NOT NULL DEFAULT 0,
  last_step INTEGER, last_ts REAL, last_seen REAL, median_interval_s REAL,
  records INTEGER NOT NULL DEFAULT 0,
  errors INTEGER NOT NULL DEFAULT 0,
  outcomes_total INTEGER NOT NULL DEFAULT 0, outcomes_failed INTEGER NOT NULL DEFAULT 0,
  outcome_nodes TEXT,
  max_attempts INTEGER
);

CREATE TABLE IF NOT EXISTS files (
  file_id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL,
  path TEXT NOT NULL,
  stream TEXT NOT NULL,
  rank INTEGER, attempt INTEGER, node INTEGER,
  identity TEXT,
  generation INTEGER NOT NULL DEFAULT 0,
  offset INTEGER NOT NULL DEFAULT 0,
  skipping INTEGER NOT NULL DEFAULT 0,
  tail TEXT,
  size INTEGER, mtime_ns INTEGER, ino INTEGER,
  header TEXT,
  missing INTEGER NOT NULL DEFAULT 0,
  UNIQUE (run_id, path)
);

CREATE TABLE IF NOT EXISTS segments (
  identity TEXT NOT NULL,
  generation INTEGER NOT NULL,
  start INTEGER NOT NULL,
  stop INTEGER NOT NULL,
  PRIMARY KEY (identity, generation, start)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS steps (
  run_id INTEGER NOT NULL, rank INTEGER NOT NULL, attempt INTEGER NOT NULL, step INTEGER NOT NULL,
  ts REAL,
  step_ms REAL, input_wait_ms REAL, h2d_ms REAL, forward_ms REAL, backward_ms REAL, optimizer_ms REAL,
  gpu_step_ms REAL, gpu_input_wait_ms REAL, gpu_h2d_ms REAL, gpu_forward_ms REAL, gpu_backward_ms REAL,
  gpu_optimizer_ms REAL,
  loss REAL, lr REAL, grad_norm REAL, examples INTEGER, rss INTEGER,
  extra TEXT,
  data_wait_ms REAL, data_in_step_ms REAL,
  PRIMARY KEY (run_id, rank, attempt, step)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS events (
  run_id INTEGER NOT NULL, identity TEXT NOT NULL, generation INTEGER NOT NULL, offset INTEGER NOT NULL,
  kind TEXT NOT NULL, rank INTEGER, attempt INTEGER, step INTEGER, ts REAL,
  body TEXT NOT NULL,
  PRIMARY KEY (run_id, identity, generation, offset)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_run ON events (run_id, kind, step);

CREATE TABLE IF NOT EXISTS system (
  run_id INTEGER NOT NULL, node INTEGER NOT NULL, ts REAL NOT NULL,
  cpu_pct REAL, ram_used INTEGER, ram_total INTEGER, gpus TEXT,
  PRIMARY KEY (run_id, node, ts)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS errors (
  error_id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL,
  path TEXT NOT NULL,
  identity TEXT NOT NULL,
  generation INTEGER NOT NULL,
  offset INTEGER NOT NULL,
  length INTEGER,
  message TEXT NOT NULL,
  seen REAL NOT NULL,
  UNIQUE (run_id, identity, generation, offset)
);
CREATE INDEX IF NOT EXISTS errors_run ON errors (run_id, error_id);

CREATE TABLE IF NOT EXISTS side_files (
  run_id INTEGER NOT NULL,
  path TEXT NOT NULL,
  kind TEXT NOT NULL,
  key TEXT,
  size INTEGER, mtime_ns INTEGER,
  content TEXT,
  error TEXT,
  PRIMARY KEY (run_id, path)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS side_kind ON side_files (run_id, kind);

CREATE TABLE IF NOT EXISTS rank_live (
  run_id INTEGER NOT NULL, rank INTEGER NOT NULL, attempt INTEGER NOT NULL,
  node INTEGER,
  records INTEGER NOT NULL DEFAULT 0,
  first_step INTEGER, last_step INTEGER, last_ts REAL, last_seen REAL,
  median_step_ms REAL, median_input_wait_ms REAL, median_interval_s REAL,
  steps_per_s REAL, examples_per_s REAL,
  loss REAL, ratios TEXT,
  ended TEXT, exit_code INTEGER,
  end_ts REAL,
  step_parts TEXT,
  PRIMARY KEY (run_id, rank, attempt)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS series_width (
  run_id INTEGER NOT NULL, rank INTEGER NOT NULL, width INTEGER NOT NULL,
  PRIMARY KEY (run_id, rank)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS series (
  run_id INTEGER NOT NULL, rank INTEGER NOT NULL, bucket INTEGER NOT NULL,
  step_lo INTEGER NOT NULL, step_hi INTEGER NOT NULL,
{_series_cols},
  PRIMARY KEY (run_id, rank, bucket)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS series_extra (
  run_id INTEGER NOT NULL, rank INTEGER NOT NULL, metric TEXT NOT NULL, bucket INTEGER NOT NULL,
  step_lo INTEGER NOT NULL, step_hi INTEGER NOT NULL,
  vmin REAL, vmax REAL, vsum REAL, n INTEGER NOT NULL,
  PRIMARY KEY (run_id, rank, metric, bucket)
) WITHOUT ROWID;
"""


class IndexSchemaError(RuntimeError):
    """The index was written by a newer traceml (its schema version is unknown here)."""


class IndexDamagedError(RuntimeError):
    """The index cannot be opened or checked (not a database, truncated, corrupt, unwritable)."""


def damaged_message(path, what: str) -> str:
    """One line naming the index, what is wrong and what to do (never: delete it)."""
    return (f"the index {path} {what}; move it aside (do not delete it: it may be recoverable) "
            f"or give --index another path")


def connect_writer(path: str | Path) -> sqlite3.Connection:
    """Open (creating when missing) the index for the single writer: WAL, ``synchronous=FULL``.

    An index of an older schema version, or one lacking a column of
    :data:`ADDED_COLUMNS`, is upgraded in place (see the module docstring);
    one of a newer version raises :class:`IndexSchemaError`.
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        return _connect_writer(path)
    except sqlite3.DatabaseError as exc:
        raise IndexDamagedError(damaged_message(path, f"cannot be opened for writing ({exc})")) from None


#: Largest index checked page by page (``PRAGMA quick_check``) when the writer opens it.
QUICK_CHECK_MAX_BYTES = 64 << 20


def _connect_writer(path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30)
    try:
        # quick_check reads every page: worth it at open for an index up to QUICK_CHECK_MAX_BYTES; a larger one
        # (a team's log root) would add seconds to every start, and damage there still surfaces as one line on use.
        size = os.path.getsize(path) if os.path.exists(path) else 0
        check = conn.execute("PRAGMA quick_check").fetchall() if size <= QUICK_CHECK_MAX_BYTES else [("ok",)]
        if check != [("ok",)]:
            first = " ".join(" ".join(str(r[0]) for r in check[:3]).split())[:200] if check else "no answer"
            raise IndexDamagedError(damaged_message(path, f"failed its integrity check (PRAGMA quick_check: {first})"))
        # A newer index is refused before anything is written to it.
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone():
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is not None and int(row[0]) > SCHEMA_VERSION:
                raise IndexSchemaError(f"index {path} has schema version {row[0]}, newer than this traceml's "
                                       f"{SCHEMA_VERSION}; use a newer traceml or another --index")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA cache_size=-16000")  # 16 MB: enough for the hot B-tree pages
        conn.execute("PRAGMA temp_store=MEMORY")
        conn.executescript(SCHEMA)  # creates what is missing; existing tables keep their columns
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) > SCHEMA_VERSION:
            raise IndexSchemaError(f"index {path} has schema version {row[0]}, newer than this traceml's "
                                   f"{SCHEMA_VERSION}; use a newer traceml or another --index")
        elif int(row[0]) < SCHEMA_VERSION or missing_columns(conn) or stale_keys(conn):
            upgrade(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def missing_columns(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """The columns of :data:`ADDED_COLUMNS` that the index lacks (an index written before they were added)."""
    have: dict[str, set[str]] = {}
    out = []
    for table, column, decl in ADDED_COLUMNS:
        if table not in have:
            have[table] = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if column not in have[table]:
            out.append((table, column, decl))
    return out


#: Tables whose key gained ``run_id`` after their first indexes were written (a copied run folder has the
#: same stream headers, hence the same file identities, as its original): table → its columns, in order.
REKEYED: dict[str, tuple[str, ...]] = {
    "events": ("run_id", "identity", "generation", "offset", "kind", "rank", "attempt", "step", "ts", "body"),
    "errors": ("error_id", "run_id", "path", "identity", "generation", "offset", "length", "message", "seen"),
}


def _key_columns(conn: sqlite3.Connection, table: str) -> set[frozenset[str]]:
    """The column sets of ``table``'s primary key and UNIQUE constraints."""
    keys = set()
    pk = frozenset(r[1] for r in conn.execute(f"PRAGMA table_info({table})") if r[5])
    if pk:
        keys.add(pk)
    for _, name, unique, origin, *_ in conn.execute(f"PRAGMA index_list({table})"):
        if unique and origin in ("pk", "u"):
            keys.add(frozenset(r[2] for r in conn.execute(f"PRAGMA index_info({name})")))
    return keys


def stale_keys(conn: sqlite3.Connection) -> list[str]:
    """The tables of :data:`REKEYED` still keyed without ``run_id`` (rebuilt by :func:`upgrade`)."""
    want = {"events": frozenset(("run_id", "identity", "generation", "offset")),
            "errors": frozenset(("run_id", "identity", "generation", "offset"))}
    return [t for t in REKEYED if want[t] not in _key_columns(conn, t)]


def _rekey(conn: sqlite3.Connection, table: str) -> None:
    """Rebuild ``table`` with the key of :data:`SCHEMA` (inside the caller's transaction); rows are kept."""
    create = SCHEMA.split(f"CREATE TABLE IF NOT EXISTS {table} (", 1)[1].split(";", 1)[0]
    cols = ", ".join(REKEYED[table])
    conn.execute(f"CREATE TABLE {table}_rekeyed ({create}")
    conn.execute(f"INSERT OR IGNORE INTO {table}_rekeyed ({cols}) SELECT {cols} FROM {table}")
    conn.execute(f"DROP TABLE {table}")
    conn.execute(f"ALTER TABLE {table}_rekeyed RENAME TO {table}")
    for stmt in SCHEMA.split(";"):
        if "INDEX IF NOT EXISTS" in stmt and f" ON {table} (" in stmt:
            conn.execute(stmt)


def upgrade(conn: sqlite3.Connection) -> None:
    """Add the columns of :data:`ADDED_COLUMNS` that are missing and rebuild the tables of :func:`stale_keys`,
    in one transaction, and flag the rederive."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, column, decl in missing_columns(conn):
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        for table in stale_keys(conn):
            _rekey(conn, table)
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('rederive', '1')")
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def needs_rederive(conn: sqlite3.Connection) -> bool:
    """True after :func:`upgrade` until the writer has derived the new columns (:func:`rederive_done`)."""
    return conn.execute("SELECT 1 FROM meta WHERE key = 'rederive'").fetchone() is not None


def rederive_done(conn: sqlite3.Connection) -> None:
    """Clear the rederive flag (inside the transaction that derived the values)."""
    conn.execute("DELETE FROM meta WHERE key = 'rederive'")


def connect_reader(path: str | Path) -> sqlite3.Connection:
    """Open the index read-only (the TUI and ``traceml status`` never write)."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=5)
    conn.execute("PRAGMA query_only=1")
    return conn


def insert_steps_sql(run_id: int, columns: Optional[tuple[int, ...]] = None) -> str:
    """INSERT for step rows; run_id is inlined so that row tuples need not carry it.

    ``columns`` (positions in a row tuple, i.e. in ``STEP_COLUMNS[1:]``) names
    the columns that the rows carry; every other column is stored as NULL. The
    ingester leaves out columns that are NULL in a whole batch: binding None
    costs the sqlite3 module an adapter lookup per value, more than the insert.
    """
    if columns is None:
        holes = ",".join("?" * (len(STEP_COLUMNS) - 1))
        return f"INSERT OR IGNORE INTO steps VALUES ({int(run_id)},{holes})"
    key = (int(run_id), tuple(columns))
    sql = _insert_sql_cache.get(key)
    if sql is None:
        if len(_insert_sql_cache) > 4096:
            _insert_sql_cache.clear()
        names = ", ".join(STEP_COLUMNS[1 + i] for i in columns)
        sql = _insert_sql_cache[key] = (f"INSERT OR IGNORE INTO steps (run_id, {names})"
                                        f" VALUES ({int(run_id)},{','.join('?' * len(columns))})")
    return sql


_insert_sql_cache: dict[tuple[int, tuple[int, ...]], str] = {}


def bump_version(conn: sqlite3.Connection) -> int:
    """Increment and return the data version (inside the caller's transaction)."""
    conn.execute("UPDATE version SET v = v + 1 WHERE id = 1")
    return int(conn.execute("SELECT v FROM version WHERE id = 1").fetchone()[0])


def ensure_run(conn: sqlite3.Connection, run_dir: str, root: str, name: str) -> int:
    """Return the run_id of ``run_dir``, creating its row (present, not missing) when new."""
    row = conn.execute("SELECT run_id, missing FROM runs WHERE dir = ?", (run_dir,)).fetchone()
    if row is not None:
        return int(row[0])
    cur = conn.execute(
        "INSERT INTO runs (dir, root, name, first_seen) VALUES (?, ?, ?, ?)", (run_dir, root, name, time.time())
    )
    return int(cur.lastrowid)


def prune_missing(conn: sqlite3.Connection, run_ids: Optional[Iterable[int]] = None) -> int:
    """Delete every row of runs marked missing (the only way rows ever leave the index)."""
    if run_ids is None:
        run_ids = [r[0] for r in conn.execute("SELECT run_id FROM runs WHERE missing = 1")]
    run_ids = list(run_ids)
    conn.execute("BEGIN IMMEDIATE")
    try:
        for run_id in run_ids:
            idents = [r[0] for r in conn.execute("SELECT identity FROM files WHERE run_id=? AND identity IS NOT NULL", (run_id,))]
            for ident in idents:
                conn.execute("DELETE FROM segments WHERE identity = ?", (ident,))
            for table in ("steps", "events", "system", "errors", "side_files", "rank_live", "series",
                          "series_extra", "series_width", "files", "runs"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        if run_ids:
            bump_version(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(run_ids)
