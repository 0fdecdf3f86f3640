"""Files the ingester refuses: one error row and one log line each, never a failed pass (docs/daemon.md,
"Damaged input").

A side file that does not decode, a stream or folder whose name holds a number beyond 64 bits, a file we
may not read, or a side file whose facts could not be stored: each is recorded once per version
(``errors`` row; the side file's ``side_files.error``), said once on the log, and counted in
:class:`Refused` — what ``traceml daemon --once`` reports as "refused K file(s)". Nothing of it stops the
scan of the root: the other files of the run and the other runs are read as usual.

The writer's SQL for these rows lives here (the store of the refusals); the service calls it inside its
open transaction.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import sqlite3
import time
from typing import Iterator

from traceml_tui.core import rundir

log = logging.getLogger("traceml.daemon")


class Refused:
    """The files refused now, by path, with the reason (what ``--once`` counts).

    ``sides`` mirrors ``side_files.error`` (reloaded with the index's state, :meth:`load`); ``names`` and
    ``streams`` (refused names, streams set aside until restart) are found again by every scan.
    """

    def __init__(self) -> None:
        self.sides: dict[str, str] = {}
        self.names: dict[str, str] = {}
        self.streams: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.sides.keys() | self.names.keys() | self.streams.keys())

    def side(self, path: str, message) -> None:
        """Record a side file's state: refused with ``message``, or read (``None``)."""
        if message is None:
            self.sides.pop(path, None)
        else:
            self.sides[path] = message

    def load(self, conn: sqlite3.Connection, run_dirs: dict[int, str]) -> None:
        """The side files the index holds as refused (read again only once they change); the names are
        found again by the next scan (their rows too, if a rolled-back batch held them)."""
        self.sides = {}
        self.names = {}
        for run_id, rel, message in conn.execute("SELECT run_id, path, error FROM side_files WHERE error IS NOT NULL"):
            run_dir = run_dirs.get(run_id)
            if run_dir is not None:
                self.sides[os.path.join(run_dir, rel)] = message


def _identity(kind: str, run_id: int, rel: str) -> str:
    return f"{kind}:" + hashlib.sha256(f"{run_id}:{rel}".encode()).hexdigest()[:24]


def _error_row(conn: sqlite3.Connection, run_id: int, rel: str, ident: str, generation: int, size: int,
               message: str) -> bool:
    cur = conn.execute(
        "INSERT OR IGNORE INTO errors (run_id, path, identity, generation, offset, length, message, seen)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (run_id, rel, ident, generation, size, size, message, time.time()),
    )
    if not cur.rowcount:
        return False
    conn.execute("UPDATE runs SET errors = errors + 1 WHERE run_id = ?", (run_id,))
    log.warning("traceml daemon: %s", message)  # once per file and version: the row is new
    return True


def side_error(conn: sqlite3.Connection, run_id: int, rel: str, mtime_ns: int, size: int, message: str) -> bool:
    """One error row per version (mtime, size) of a bad side file, and one log line; True when new."""
    return _error_row(conn, run_id, rel, _identity("side", run_id, rel), mtime_ns, size, message)


def name_error(conn: sqlite3.Connection, run_id: int, rel: str, problem: str) -> bool:
    """One error row (ever) for a stream or folder whose name traceml refuses, and one log line; True when new.

    A name does not change: a file renamed is another name, so one row per name is one row per version.
    """
    shown = rundir.shown_name(rel)  # a name that is not UTF-8 is stored with its bytes escaped
    return _error_row(conn, run_id, shown, _identity("name", run_id, shown), 0, 0, f"{shown}: {problem}")


def new_names(refused: Refused, run_dir: str, names: list[rundir.RefusedName]) -> bool:
    """Record a run's refused names; True when one of them is new since this process started."""
    new = False
    for name in names:
        path = os.path.join(run_dir, name.rel)
        new = new or path not in refused.names
        refused.names[path] = name.problem
    return new


def name_errors(conn: sqlite3.Connection, run_id: int, names: list[rundir.RefusedName]) -> None:
    """:func:`name_error` of each refused name (rows already stored are not stored or said again)."""
    for name in names:
        name_error(conn, run_id, name.rel, name.problem)


def run_dir_refused(refused: Refused, run_dir: str) -> bool:
    """True (and said once) when a run folder's path cannot be kept as text: the run is not read."""
    problem = rundir.name_not_utf8(run_dir)
    if problem is None:
        return False
    if run_dir not in refused.names:
        refused.names[run_dir] = problem
        log.warning("traceml daemon: %s: %s", rundir.shown_name(run_dir), problem)
    return True


def unreadable_error(conn: sqlite3.Connection, run_id: int, rel: str, path: str, exc: OSError) -> bool:
    """A file we may not read is one error row naming it (per version), never a silent skip; True when new.

    Gone, or a link refused on the way: nothing to report (False).
    """
    if exc.errno not in (errno.EACCES, errno.EPERM):
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return side_error(conn, run_id, rel, st.st_mtime_ns, st.st_size, f"{rel}: cannot be read ({exc.strerror})")


def side_failed(conn: sqlite3.Connection, run_id: int, rel: str, kind: str, key, size: int, mtime_ns: int,
                exc: BaseException) -> str:
    """A side file whose ingestion raised (a bug, or a value no bound caught): kept as refused — its row holds
    the error and no content, so its facts are not applied again — with one error row; returns the message."""
    message = f"{rel}: not ingested ({type(exc).__name__}: {exc})"
    conn.execute("INSERT OR REPLACE INTO side_files VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                 (run_id, rel, kind, key, size, mtime_ns, None, message))
    side_error(conn, run_id, rel, mtime_ns, size, message)
    return message


@contextlib.contextmanager
def savepoint(conn: sqlite3.Connection, name: str = "one_file") -> Iterator[None]:
    """What one file writes inside the open transaction: kept when the block ends, undone when it raises
    (the exception goes on), so that a file that fails leaves no half of its rows behind."""
    conn.execute(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        conn.execute(f"ROLLBACK TO {name}")
        conn.execute(f"RELEASE {name}")
        raise
    conn.execute(f"RELEASE {name}")
