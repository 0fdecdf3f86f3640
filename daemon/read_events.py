"""The read side's events room: a run's non-step records, its ingest errors, dark streams and hang records.

Reached as ``Reader.events`` (:mod:`daemon.reader`); reads the ``events`` and ``errors`` tables
(docs/daemon.md, "Reader API").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from traceml_tui.core import coverage, records
from traceml_tui.core import hang as hangs_mod

from .read_query import Rows, loads


@dataclass(frozen=True)
class IngestError:
    """One error row: a line, a range or a file the ingester could not take, and why."""

    error_id: int
    run_id: int
    path: str
    offset: int
    length: Optional[int]
    message: str
    seen: float


@dataclass(frozen=True)
class Event:
    """A non-step record of a rank stream: eval, checkpoint, field_stats, rank_end."""

    kind: str
    rank: Optional[int]
    attempt: Optional[int]
    step: Optional[int]
    ts: Optional[float]
    body: dict


class EventsReader:
    """Events, ingest errors, dark streams and hang records of the index's runs (``reader.events``)."""

    def __init__(self, rows: Rows):
        self._rows = rows

    def recent(self, run_id: int, kind: Optional[str] = None, limit: int = 200) -> tuple[Event, ...]:
        """The newest ``limit`` events of a run (optionally one kind), in step order."""
        where, params = "run_id = ?", [run_id]
        if kind is not None:
            where += " AND kind = ?"
            params.append(kind)
        rows = self._rows(f"SELECT kind, rank, attempt, step, ts, body FROM events WHERE {where}"
                          " ORDER BY step DESC, ts DESC LIMIT ?", (*params, limit))
        return tuple(Event(k, r, a, st, ts, json.loads(body)) for k, r, a, st, ts, body in reversed(rows))

    def errors(self, run_id: Optional[int] = None, limit: int = 100, after_id: int = 0) -> tuple[IngestError, ...]:
        """Ingest errors (newest ``limit`` after ``after_id``), oldest first."""
        where, params = "error_id > ?", [after_id]
        if run_id is not None:
            where += " AND run_id = ?"
            params.append(run_id)
        rows = self._rows(f"SELECT error_id, run_id, path, offset, length, message, seen FROM errors WHERE {where}"
                          " ORDER BY error_id DESC LIMIT ?", (*params, limit))
        return tuple(IngestError(*r) for r in reversed(rows))

    def unmeasured(self, run_id: int) -> tuple[dict[str, Any], ...]:
        """The run's dark streams as the summary lists them (``integration.unmeasured``: rank, stream, reason).

        From the ``unmeasured`` records in the ``events`` table (looked up by its ``(run_id, kind)`` index);
        folded by :func:`traceml_tui.core.coverage.unmeasured_entries`, the summary's own rule.
        """
        found = []
        for rank, body in self._rows("SELECT rank, body FROM events WHERE run_id = ? AND kind = 'unmeasured'"
                                     " ORDER BY ts, offset", (run_id,)):
            data = loads(body)
            if isinstance(rank, int) and isinstance(data, dict):
                found.append((rank, data.get("stream", ""), data.get("reason", "")))
        return tuple(coverage.unmeasured_entries(found))

    def current_hangs(self, run_id: int, newest: dict[int, tuple[int, Optional[int]]]
                      ) -> dict[int, records.Hang]:
        """Each rank's newest hang record that still speaks for its silence (core.hang.current_hang).

        ``newest`` maps a rank to its newest attempt and last step; a record of an older attempt, or one the
        rank has stepped past, no longer explains it.
        """
        found: dict[int, records.Hang] = {}
        for body, in self._rows("SELECT body FROM events WHERE run_id = ? AND kind = 'hang' ORDER BY step, ts",
                                (run_id,)):
            rec = hangs_mod.decode_hang(loads(body) or {})
            row = newest.get(rec.rank) if rec is not None else None
            if row is not None and hangs_mod.current_hang(rec, row[0], row[1]):
                found[rec.rank] = rec
        return found
