"""What the read side's rooms share: one query on the reader's read-only connection (docs/daemon.md, "Reader API").

The reader (:mod:`daemon.reader`) opens the connection and hands each room its :func:`fetch` bound to it; a
room holds the SQL of what it reads and returns frozen dataclasses, never rows.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Callable, Optional

#: A query on the reader's connection: ``rows(sql, params=()) -> list of tuples`` (:func:`fetch`).
Rows = Callable[..., list]


def fetch(conn: sqlite3.Connection, sql: str, params: tuple = ()) -> list:
    """The rows of one query; none while the writer is still creating the schema (a table not there yet)."""
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []  # an index being created right now
        raise


def num(v: Any) -> Optional[float]:
    """A stored number as a float (None for anything else, booleans included)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def loads(text: Optional[str]) -> Any:
    """Stored JSON decoded, or None (empty, or not JSON)."""
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: content stored before nesting was bounded
        return None
