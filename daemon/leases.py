"""The node launchers' leases, as the ingester sees them (docs/daemon.md, "Launcher leases").

Each node's ``traceml run`` replaces ``nodes/node_<k>/launcher.lease`` with a
new beat every few seconds (:mod:`traceml_tui.core.lease`). At every scan of a
run the ingester reads the leases it lists and keeps, per node, in the
``leases`` table: the bytes it read, when — by its own clock — it last saw
them change (``changed_at``) and when it last looked (``checked_at``). The
reader hands these to :class:`traceml_tui.core.state.LeaseFacts`, whose rule
says a lease not seen to change for its length has expired. No clock of the
node that wrote the lease is involved, and a stopped ingester (no checks)
never makes a lease expire.

Cost: a lease that is done (its launcher finished) or already expired is not
read again until its size or mtime changes; the others are read at every scan
(a few dozen bytes). The file name ends in ``.lease``, which the inotify hints
ignore, so a beat never makes the ingester rescan a run between its scans.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from typing import Callable, Iterable, Optional

from traceml_tui.core import lease as core_lease
from traceml_tui.core import rundir
from traceml_tui.core.state import LeaseFacts

#: The side-file kind :meth:`traceml_tui.core.rundir.RunDir.scan` gives a lease file.
KIND = "lease"


def read_lease(root: str, path: str) -> Optional[bytes]:
    """The bytes of one lease file (a regular file reached without links; at most MAX_LEASE_BYTES + 1), or None."""
    try:
        fd = rundir.open_under(root, path)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.pread(fd, core_lease.MAX_LEASE_BYTES + 1, 0)
    except OSError:
        return None
    finally:
        os.close(fd)


def _facts(node: int, row: Optional[tuple]) -> Optional[LeaseFacts]:
    if row is None:
        return None
    _, done, lease_s, changed_at, checked_at = row
    return LeaseFacts(node=node, done=bool(done), changed_at=changed_at, checked_at=checked_at, lease_s=lease_s)


def _word(facts: Optional[LeaseFacts]) -> Optional[str]:
    """What a lease says to the state rules: absent, done, expired or live."""
    if facts is None:
        return None
    return "done" if facts.done else "expired" if facts.expired else "live"


class LeaseTracker:
    """Reads a run's lease files at each scan and keeps the ``leases`` rows (see the module docstring)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        #: (run_id, rel) -> (size, mtime_ns) when its row said done or expired: not read again until they change.
        self._settled: dict[tuple[int, str], tuple[int, int]] = {}

    def observe(self, conn: sqlite3.Connection, begin: Callable[[], object], run_id: int, root: str, run_dir: str,
                sides: Iterable[rundir.SideFile], on_error: Callable[[rundir.SideFile, str], None]) -> bool:
        """Read the lease files ``sides`` of one run and update their rows (calling ``begin()`` before any write).

        Returns True when what a lease says to the state rules changed (a new lease, live ↔ expired, done),
        so that the caller marks the run changed. A file that is not a lease is ``on_error(side, message)``
        (once per version of it) and otherwise ignored.
        """
        changed = False
        for side in sides:
            node = rundir.parse_node_name(side.rel.split("/")[1]) if side.rel.count("/") == 2 else None
            if node is None:
                continue
            key = (run_id, side.rel)
            row = conn.execute("SELECT beat, done, lease_s, changed_at, checked_at FROM leases"
                               " WHERE run_id = ? AND node = ?", (run_id, node)).fetchone()
            before = _facts(node, row)
            if before is not None and _word(before) in ("done", "expired") and \
                    self._settled.get(key) == (side.size, side.mtime_ns):
                continue
            data = read_lease(root, os.path.join(run_dir, side.rel))
            if data is None:
                continue
            beat = core_lease.decode(data)
            if beat is None:
                begin()
                on_error(side, f"{side.rel}: not a launcher lease (core/lease.py)")
                continue
            now = self.clock()
            begin()
            if row is None or bytes(row[0]) != data:
                after = LeaseFacts(node=node, done=beat.done, changed_at=now, checked_at=now, lease_s=beat.lease_s)
                conn.execute("INSERT OR REPLACE INTO leases (run_id, node, beat, done, lease_s, changed_at, checked_at)"
                             " VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (run_id, node, data, int(beat.done), beat.lease_s, now, now))
            else:
                after = LeaseFacts(node=node, done=before.done, changed_at=before.changed_at, checked_at=now,
                                   lease_s=before.lease_s)
                conn.execute("UPDATE leases SET checked_at = ? WHERE run_id = ? AND node = ?", (now, run_id, node))
            word = _word(after)
            if word in ("done", "expired"):
                self._settled[key] = (side.size, side.mtime_ns)
            else:
                self._settled.pop(key, None)
            changed = changed or word != _word(before)
        return changed


def lease_facts(rows: Iterable[tuple]) -> tuple[LeaseFacts, ...]:
    """``leases`` rows ``(node, done, lease_s, changed_at, checked_at)`` as the core's facts, by node."""
    return tuple(LeaseFacts(node=int(node), done=bool(done), changed_at=float(changed), checked_at=float(checked),
                            lease_s=float(lease_s))
                 for node, done, lease_s, changed, checked in sorted(rows, key=lambda r: r[0]))


__all__ = ["KIND", "LeaseTracker", "lease_facts", "read_lease"]
