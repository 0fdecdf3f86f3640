"""The index's write-ahead log, kept bounded (docs/daemon.md, "Live path", "The WAL stays bounded").

SQLite appends every committed page to ``<index>-wal`` and copies them back into the index at a checkpoint
(``wal_autocheckpoint`` pages). The file itself never shrinks on its own: it keeps the largest size it reached
until the last connection closes, so a daemon that lived through one large transaction, or through minutes
of checkpoints a reader held back, kept a WAL of tens of MiB for the rest of its life. Two things bound it:

* ``journal_size_limit``: when the writer starts the log again from its first frame (after a complete
  checkpoint), SQLite truncates the file to :data:`WAL_LIMIT_BYTES`;
* :meth:`WalBound.after_commit`: a file past the limit after a commit gets a ``TRUNCATE`` checkpoint, which
  copies every frame back and empties the file. It waits for readers at most :data:`TRUNCATE_WAIT_MS` (a
  polling reader's read ends within it): a reader still reading an older snapshot after that leaves it for a
  later commit, and never blocks the ingester longer.

Neither changes rule 2: a commit is durable in the WAL (``synchronous=FULL``) whether or not it was
checkpointed, and a checkpoint only copies committed pages.
"""

from __future__ import annotations

import os
import sqlite3

WAL_LIMIT_BYTES = 16 << 20  # the WAL file is brought back under this after a commit that left it larger
_BUSY_TIMEOUT_MS = 30_000  # the writer connection's own (daemon/index.py: timeout=30)
#: How long the TRUNCATE checkpoint waits for readers to end their read transactions. A reader that polls
#: without pause (a dashboard, the benchmark's probe) is almost always inside one for a few milliseconds:
#: never waiting (0) lost to it at nearly every commit, and the WAL grew past the bound for good. A reader
#: that holds its snapshot longer costs a commit at most this long, and leaves the WAL for a later commit.
TRUNCATE_WAIT_MS = 50


class WalBound:
    """Keeps the WAL of the writer connection ``conn`` (index file ``path``) under ``limit`` bytes."""

    def __init__(self, conn: sqlite3.Connection, path: str, limit: int = WAL_LIMIT_BYTES) -> None:
        self.conn = conn
        self.wal_path = f"{path}-wal"
        self.limit = limit
        self.truncations = 0  # TRUNCATE checkpoints that emptied the file (read by tests and benchmarks)
        self.set_limit(limit)

    def set_limit(self, limit: int) -> None:
        """Bound the WAL at ``limit`` bytes (both the file SQLite truncates to and the size checked)."""
        self.limit = int(limit)
        self.conn.execute(f"PRAGMA journal_size_limit={self.limit}")

    def size(self) -> int:
        """The WAL file's size now (0 when there is none)."""
        try:
            return os.stat(self.wal_path).st_size
        except OSError:
            return 0

    def after_commit(self) -> bool:
        """After a COMMIT (no transaction open): a WAL past the limit is checkpointed and emptied unless a
        reader holds it; True when it was emptied."""
        if self.size() <= self.limit:
            return False
        conn = self.conn
        conn.execute(f"PRAGMA busy_timeout={TRUNCATE_WAIT_MS}")
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.OperationalError:  # locked by a reader mid-checkpoint: the next commit tries again
            busy = 1
        finally:
            conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        if not busy:
            self.truncations += 1
        return not busy
