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
(:func:`connect_writer`): the rows of a ``steps`` table of version 2 or
older move, converted, into the compact table of version 3, the columns it
lacks are created with ``ALTER TABLE … ADD COLUMN`` and, when some were
missing, the index is flagged so that the ingester derives their values from
what the index already holds (:func:`needs_rederive`) — the runs whose
folders are gone keep their rows (rule 7), which a rebuild from the run
directories could not do.

How a step row is stored (integers where a REAL would cost 8 bytes, the
timings a CPU run leaves NULL in one column) is said once, in
:data:`STEP_STORED`, and how each column is read back, in
:data:`STEP_DERIVED`: step rows live in :data:`STEPS_TABLE` and every reader
selects from the view ``steps``, which has the columns of
:data:`STEP_COLUMNS`. :func:`step_values_sql` turns the first into SQL for
any writer of step rows.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Iterable, Mapping, Optional

SCHEMA_VERSION = 3

log = logging.getLogger("traceml.daemon")

#: Metrics kept as downsampled series in the wide ``series`` table, in column order.
SERIES_METRICS: tuple[str, ...] = ("step_ms", "input_wait_ms", "gpu_step_ms", "loss", "grad_norm", "lr")

#: The columns of a step row, in row-tuple order (run_id comes first): what the ingester binds and what every
#: SELECT on ``steps`` names. The timings are the record's own fields on the CPU clock (``step_ms`` is
#: ``cpu_ms.step``, the traced envelope; ``input_wait_ms`` the gap before it; ``data_wait_ms`` /
#: ``data_in_step_ms`` the loader waits in the gap / in the envelope) and, ``gpu_`` prefixed, on the GPU clock;
#: the step *time* and its parts are derived from them by core.steptime. How each is stored:
#: :data:`STEP_STORED` and :data:`STEP_DERIVED` (docs/daemon.md, "How a step row is stored").
STEP_COLUMNS: tuple[str, ...] = (
    "run_id", "rank", "attempt", "step", "ts",
    "step_ms", "input_wait_ms", "h2d_ms", "forward_ms", "backward_ms", "optimizer_ms",
    "gpu_step_ms", "gpu_input_wait_ms", "gpu_h2d_ms", "gpu_forward_ms", "gpu_backward_ms", "gpu_optimizer_ms",
    "loss", "lr", "grad_norm", "examples", "rss", "extra",
    "data_wait_ms", "data_in_step_ms",
)

#: The timings a plain CPU training loop leaves NULL (the host-to-device copy, the loader waits, the GPU
#: clock), folded into one stored column (``more_us``, a JSON array of integer microseconds in this order):
#: one NULL costs a row one byte, so nine of them cost nine on every row of a CPU run.
STEP_FOLDED: tuple[str, ...] = (
    "h2d_ms", "data_wait_ms", "data_in_step_ms",
    "gpu_step_ms", "gpu_input_wait_ms", "gpu_h2d_ms", "gpu_forward_ms", "gpu_backward_ms", "gpu_optimizer_ms",
)


#: The timings a step row stores in columns of their own, as integer microseconds (``step_ms`` → ``step_us``).
STEP_IN_US: tuple[str, ...] = ("step_ms", "input_wait_ms", "forward_ms", "backward_ms", "optimizer_ms")


def _us_name(name: str) -> str:
    return name.removesuffix("_ms") + "_us"


def _us(name: str) -> str:
    return f"round({{{name}}} * 1000)"


#: The table that holds the step rows; ``steps`` is a view over it with every column of :data:`STEP_COLUMNS`.
STEPS_TABLE = "steps_stored"

#: The stored columns of :data:`STEPS_TABLE`, in order: (column, declaration, SQL expression of the row's values,
#: where ``{name}`` stands for the value of the :data:`STEP_COLUMNS` column ``name``). SQLite stores an integer
#: in 0-6 bytes and a REAL in 8, and a NULL costs one header byte: timings are integer microseconds (``round``:
#: within 0.0005 ms, far below what any surface shows), ``ts`` integer milliseconds, ``rss`` KiB (exact for RSS
#: in pages), a learning rate with at most six decimals (1e-3, 3e-4, 5e-6: constant and step schedules) an
#: integer count of 1e-6 when that gives back the very same double, any other learning rate its REAL (``lr_e6``
#: has no declared type, hence no affinity to convert one into the other: nothing is lost).
STEP_STORED: tuple[tuple[str, str, str], ...] = (
    ("run_id", "INTEGER NOT NULL", "{run_id}"),
    ("rank", "INTEGER NOT NULL", "{rank}"),
    ("attempt", "INTEGER NOT NULL", "{attempt}"),
    ("step", "INTEGER NOT NULL", "{step}"),
    ("ts_ms", "INTEGER", "round({ts} * 1000)"),
    *((_us_name(c), "INTEGER", _us(c)) for c in STEP_IN_US),
    ("loss", "REAL", "{loss}"),
    ("lr_e6", "", "CASE WHEN CAST(round({lr} * 1e6) AS INTEGER) / 1e6 = {lr}"
                  " THEN CAST(round({lr} * 1e6) AS INTEGER) ELSE {lr} END"),
    ("grad_norm", "REAL", "{grad_norm}"),
    ("examples", "INTEGER", "{examples}"),
    ("rss_kib", "INTEGER", "round({rss} / 1024.0)"),
    ("extra", "TEXT", "{extra}"),
    # JSON integers: CAST (a value past 9.2e15 ms, 292,000 years, is clamped); NULL when all nine are NULL.
    ("more_us", "TEXT", "nullif(json_array(" + ", ".join(f"CAST({_us(c)} AS INTEGER)" for c in STEP_FOLDED)
     + "), '[" + ",".join(["null"] * len(STEP_FOLDED)) + "]')"),
)

#: Each column of :data:`STEP_COLUMNS` as the ``steps`` view computes it from the stored columns (a column
#: stored as it is read is itself). A view, not generated columns: SQLite computes a table's generated columns
#: on every INSERT (measured: a third more CPU per inserted row), a view only when it is read; simple views
#: are flattened into the query, so a SELECT on ``steps`` uses the key of :data:`STEPS_TABLE` as before.
STEP_DERIVED: dict[str, str] = {
    **{c: c for c in STEP_COLUMNS},
    "ts": "ts_ms / 1000.0",
    **{c: f"{_us_name(c)} / 1000.0" for c in STEP_IN_US},
    "lr": "CASE typeof(lr_e6) WHEN 'integer' THEN lr_e6 / 1e6 ELSE lr_e6 END",
    "rss": "rss_kib * 1024",
    **{name: f"json_extract(more_us, '$[{i}]') / 1000.0" for i, name in enumerate(STEP_FOLDED)},
}

#: Columns added after schema version 1, in the order they were added: (table, column, declaration).
#: They sit at the end of their tables, in a new index as in an upgraded one. Version 2 gained columns after
#: its first indexes were written, so the writer upgrades an index that lacks any of them whatever its version
#: number says (:func:`missing_columns`); the ``steps`` ones are columns of the view since version 3 (a
#: ``steps`` table of version 2 is rebuilt, never altered: :func:`upgrade`).
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("rank_live", "end_ts", "REAL"),
    ("runs", "outcome_nodes", "TEXT"),
    ("runs", "max_attempts", "INTEGER"),
    ("steps", "data_wait_ms", "REAL"),
    ("steps", "data_in_step_ms", "REAL"),
    ("rank_live", "step_parts", "TEXT"),
    ("runs", "launcher_exit_codes", "TEXT"),  # replaces failure_rank/failure_exit_code (left unused where present)
)


def _steps_table(name: str) -> str:
    stored = ",\n  ".join(f"{col} {decl}".rstrip() for col, decl, _ in STEP_STORED)
    return f"CREATE TABLE IF NOT EXISTS {name} (\n  {stored},\n  PRIMARY KEY (run_id, rank, attempt, step)\n) WITHOUT ROWID"


#: The append-ordered table of the live path (daemon/live_table.py; docs/daemon.md, "Live path"): a live pass's
#: step rows, keyed by arrival (``seq``) so that the rows of every rank of one pass fill a few shared pages, their
#: values as read (the :data:`STEP_COLUMNS`, converted to the stored form when a merge moves them into
#: :data:`STEPS_TABLE`) and, per row, its loss components' ratios (JSON ``{name: ratio}``: what the merge folds into
#: the ``ratio/<name>`` series). A row is in one of the two tables, never both; the unique index holds rule 3's
#: step key inside this table (the live path checks :data:`STEPS_TABLE` before it inserts).
LIVE_TABLE = "steps_live"


#: Each :data:`STEP_COLUMNS` column of a :data:`LIVE_TABLE` row (values as read) as the ``steps`` view reads it:
#: the value a merge stores, read back (:data:`STEP_STORED` then :data:`STEP_DERIVED`), so that a merge changes no
#: value any reader sees (``tests/test_live_table.py`` holds the two equal). A learning rate reads back as itself
#: either way (an integer count of 1e-6 only when that gives back the very same double).
LIVE_DERIVED: dict[str, str] = {
    **{c: c for c in STEP_COLUMNS},
    "ts": "round(ts * 1000) / 1000.0",
    **{c: f"round({c} * 1000) / 1000.0" for c in STEP_IN_US},
    **{c: f"CAST(round({c} * 1000) AS INTEGER) / 1000.0" for c in STEP_FOLDED},
    "rss": "CAST(round(rss / 1024.0) AS INTEGER) * 1024",
}

_LIVE_TYPES = {"run_id": "INTEGER NOT NULL", "rank": "INTEGER NOT NULL", "attempt": "INTEGER NOT NULL",
               "step": "INTEGER NOT NULL", "examples": "INTEGER", "rss": "INTEGER", "extra": "TEXT"}


def _live_table() -> str:
    cols = ", ".join(f"{c} {_LIVE_TYPES.get(c, 'REAL')}" for c in STEP_COLUMNS)
    return (f"CREATE TABLE IF NOT EXISTS {LIVE_TABLE} (seq INTEGER PRIMARY KEY, {cols}, ratios TEXT);\n"
            f"CREATE UNIQUE INDEX IF NOT EXISTS {LIVE_TABLE}_key ON {LIVE_TABLE} (run_id, rank, attempt, step)")


def _steps_view() -> str:
    """``steps``: every step row, stored (:data:`STEPS_TABLE`) or not yet merged (:data:`LIVE_TABLE`), each column
    read back the same from both (:data:`STEP_DERIVED`, :data:`LIVE_DERIVED`)."""
    def select(derived: Mapping[str, str]) -> str:
        return ",\n  ".join(derived[c] if derived[c] == c else f"{derived[c]} AS {c}" for c in STEP_COLUMNS)
    return (f"CREATE VIEW IF NOT EXISTS steps AS SELECT\n  {select(STEP_DERIVED)}\nFROM {STEPS_TABLE}\n"
            f"UNION ALL SELECT\n  {select(LIVE_DERIVED)}\nFROM {LIVE_TABLE}")


def steps_newest_sql(columns: Iterable[str]) -> str:
    """The newest step rows of one (run, rank, attempt) (``?1, ?2, ?3``), newest first, at most ``?4``: the
    ``steps`` view's columns ``columns`` written as one compound over both tables, which SQLite merges in key order
    and stops at the limit (``… FROM steps ORDER BY step DESC LIMIT ?`` sorts every row of the rank first)."""
    cols = list(columns)
    where = "WHERE run_id = ?1 AND rank = ?2 AND attempt = ?3"

    def arm(derived: Mapping[str, str], table: str) -> str:
        return f"SELECT {', '.join(derived[c] for c in cols)} FROM {table} {where}"
    return (f"{arm(STEP_DERIVED, STEPS_TABLE)} UNION ALL {arm(LIVE_DERIVED, LIVE_TABLE)}"
            f" ORDER BY {cols.index('step') + 1} DESC LIMIT ?4")


def _replace_steps_view(conn: sqlite3.Connection) -> None:
    """Put this version's ``steps`` view in place of an older one (an index written before the live table read
    :data:`STEPS_TABLE` alone). Nothing is stored in a view: no row moves, no version changes."""
    row = conn.execute("SELECT type, sql FROM sqlite_master WHERE name = 'steps'").fetchone()
    if row is not None and row[0] == "view" and row[1] != _steps_view().replace(" IF NOT EXISTS", ""):
        conn.execute("DROP VIEW steps")
        conn.execute(_steps_view())


_SOURCE = re.compile(r"\{(\w+)\}")


def step_values_sql(source: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(stored column, SQL expression)`` for the columns of :data:`STEPS_TABLE` that ``source`` feeds.

    ``source`` maps a :data:`STEP_COLUMNS` name to the SQL text of its value:
    a bound parameter (``?3``), a literal, or a column of another table
    (``s.step_ms``, for an ``INSERT … SELECT``). A name that is not in it is
    NULL; a stored column none of whose values it gives is left out (stored
    NULL). The one place that says how a step row is stored: every writer of
    step rows goes through it (``INSERT INTO steps_stored (cols) VALUES
    (exprs)`` or ``… SELECT exprs FROM staging``).
    """
    out = []
    for column, _, template in STEP_STORED:
        names = _SOURCE.findall(template)
        if any(n in source for n in names):
            out.append((column, _SOURCE.sub(lambda m: source.get(m.group(1), "NULL"), template)))
    return out


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
  launcher_exit_codes TEXT,
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

{_steps_table(STEPS_TABLE)};
{_live_table()};
{_steps_view()};

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

-- One row per node launcher lease (nodes/node_<k>/launcher.lease, daemon/leases.py): the bytes last read and,
-- by the ingester's own clock, when they last changed and when they were last looked at.
CREATE TABLE IF NOT EXISTS leases (
  run_id INTEGER NOT NULL, node INTEGER NOT NULL,
  beat BLOB NOT NULL,
  done INTEGER NOT NULL DEFAULT 0,
  lease_s REAL NOT NULL,
  changed_at REAL NOT NULL,
  checked_at REAL NOT NULL,
  PRIMARY KEY (run_id, node)
) WITHOUT ROWID;

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
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            # Not damage: moving the index aside would lose nothing but would not help either. An upgrade from
            # an older version rewrites every step row, so it needs about the index's size free again.
            raise IndexDamagedError(f"the disk holding the index {path} is full ({exc}); free some space (an "
                                    f"upgrade of an index written by an older traceml needs about its size "
                                    f"free) and start again") from None
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
        _replace_steps_view(conn)  # an index of an earlier layout: the view reads the live table too
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) > SCHEMA_VERSION:
            raise IndexSchemaError(f"index {path} has schema version {row[0]}, newer than this traceml's "
                                   f"{SCHEMA_VERSION}; use a newer traceml or another --index")
        elif int(row[0]) < SCHEMA_VERSION or missing_columns(conn) or stale_keys(conn):
            started = time.monotonic()
            upgrade(conn)
            # Said once, where the daemon's operator sees it: the index changed shape and an older traceml
            # can no longer read it.
            took = time.monotonic() - started
            if int(row[0]) < SCHEMA_VERSION:
                log.warning("traceml daemon: upgraded the index %s from schema version %s to %s in %.1f s; every "
                            "row kept (an older traceml can no longer read it)", path, row[0], SCHEMA_VERSION, took)
            else:
                log.warning("traceml daemon: completed the index %s (columns of this version added) in %.1f s; "
                            "every row kept", path, took)
    except BaseException:
        conn.close()
        raise
    return conn


def table_columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The columns of ``table`` (or view), hidden and generated ones included (``table_info`` leaves them out)."""
    return {r[1] for r in conn.execute(f"PRAGMA table_xinfo({table})")}


def missing_columns(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """The columns of :data:`ADDED_COLUMNS` that the index lacks (an index written before they were added)."""
    have: dict[str, set[str]] = {}
    out = []
    for table, column, decl in ADDED_COLUMNS:
        if table not in have:
            have[table] = table_columns(conn, table)
        if column not in have[table]:
            out.append((table, column, decl))
    return out


def stored_as_written(conn: sqlite3.Connection) -> bool:
    """True when ``steps`` is a table storing every column as written (schema version 2 or older)."""
    row = conn.execute("SELECT type FROM sqlite_master WHERE name = 'steps'").fetchone()
    return row is not None and row[0] == "table"


def _restore_steps(conn: sqlite3.Connection) -> None:
    """Move the rows of a ``steps`` table of version 2 or older into :data:`STEPS_TABLE` and put the view in its
    place (inside the caller's transaction): every row converted by the same expressions as a new row
    (:func:`step_values_sql`) and kept, in key order; a column the old table lacks is NULL."""
    have = table_columns(conn, "steps")
    pairs = step_values_sql({c: c for c in STEP_COLUMNS if c in have})
    conn.execute(_steps_table(STEPS_TABLE))
    conn.execute(f"INSERT INTO {STEPS_TABLE} ({', '.join(c for c, _ in pairs)})"
                 f" SELECT {', '.join(e for _, e in pairs)} FROM steps ORDER BY run_id, rank, attempt, step")
    conn.execute("DROP TABLE steps")
    conn.execute(_steps_view())


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
    """Bring an index of an older version (or one lacking columns) to this one, in one transaction.

    A ``steps`` table of version 2 or older is rebuilt with its rows converted (:func:`_restore_steps`), the
    columns of :data:`ADDED_COLUMNS` that are missing are added, the tables of :func:`stale_keys` rebuilt, and,
    when columns were missing (or the index is of version 1), the rederive flagged: the figures those columns
    feed are derived by the writer from what the index holds. A complete version-2 index needs no rederive: its
    aggregates were computed from the same records as a new index's.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        rederive = (row is not None and int(row[0]) < 2) or bool(missing_columns(conn)) or bool(stale_keys(conn))
        if stored_as_written(conn):
            _restore_steps(conn)
        for table, column, decl in missing_columns(conn):
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        for table in stale_keys(conn):
            _rekey(conn, table)
        if rederive:
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
    the columns that the rows carry, bound in that order; every other column is
    stored as NULL. The ingester leaves out columns that are NULL in a whole
    batch: binding None costs the sqlite3 module an adapter lookup per value,
    more than the insert. The values are converted to their stored form in the
    statement (:func:`step_values_sql`), so building a row costs nothing more;
    the parameters are numbered (``?3``) because an expression may read a value
    twice.
    """
    if columns is None:
        columns = tuple(range(len(STEP_COLUMNS) - 1))
    key = (int(run_id), tuple(columns))
    sql = _insert_sql_cache.get(key)
    if sql is None:
        if len(_insert_sql_cache) > 4096:
            _insert_sql_cache.clear()
        source = {"run_id": str(int(run_id))}
        source.update((STEP_COLUMNS[1 + i], f"?{k}") for k, i in enumerate(columns, 1))
        pairs = step_values_sql(source)
        sql = _insert_sql_cache[key] = (f"INSERT OR IGNORE INTO {STEPS_TABLE} ({', '.join(c for c, _ in pairs)})"
                                        f" VALUES ({', '.join(e for _, e in pairs)})")
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
            for table in (STEPS_TABLE, LIVE_TABLE, "events", "system", "errors", "side_files", "leases", "rank_live", "series",
                          "series_extra", "series_width", "files", "runs"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        if run_ids:
            bump_version(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(run_ids)
