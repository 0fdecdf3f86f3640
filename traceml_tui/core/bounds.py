"""Bounds on the numbers a run's files carry: what a reader accepts before it stores or shows one.

A run directory is written by other processes, other machines and, after a crash or a copy, by nobody
in particular: any number in it may be out of every range. A reader that handed such a number on would
stop far from the file that held it — SQLite raises for an integer beyond 64 bits, ``time.gmtime`` for
a time beyond ``time_t`` — and a whole pass of the daemon would fail on one file (docs/daemon.md,
"Damaged input"). So the typed structs of :mod:`traceml_tui.core.artifacts` use the bounded types
below, msgspec checks them while it decodes (a file out of bounds does not decode: one error, naming the
field), and the names the daemon parses go through :func:`parse_number`.

* :data:`Int64` — an integer SQLite can store (signed 64-bit).
* :data:`Count` — a rank, node, attempt or count: 0 … 2^63 − 1.
* :data:`Epoch` — wall-clock seconds from 1970 to the end of year 9999 (what ``time.gmtime`` and an
  ISO-8601 text can hold on every platform).

JSON floats are finite already: msgspec refuses a number that overflows a double (``1e400``), and JSON
has no ``NaN``/``Infinity``.
"""

from __future__ import annotations

import re
from typing import Annotated, Optional

import msgspec

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
#: 9999-12-31T23:59:59Z: the last second an ISO-8601 year of four digits can name.
EPOCH_MAX = 253402300799.0

Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Epoch = Annotated[float, msgspec.Meta(ge=0.0, le=EPOCH_MAX)]
#: A JSON object key naming an integer (a rank as text: ``"0"``, ``"17"``), at most 18 digits so that it
#: always fits in 64 bits; ASCII digits only (``"²"`` is a digit to ``str.isdigit``, not to ``int``).
IntKey = Annotated[str, msgspec.Meta(pattern=r"^-?[0-9]{1,18}$")]

_NUMBER = re.compile(r"[0-9]+", re.ASCII)
_INT_KEY = re.compile(r"-?[0-9]{1,18}", re.ASCII)


def parse_number(text: str) -> Optional[int]:
    """The non-negative integer ``text`` spells in ASCII digits, if it fits in 64 bits; else None.

    ``"12"`` → 12, ``"99999999999999999999"`` → None (beyond 2^63 − 1), ``"٣"`` or ``"²"`` → None
    (digits to Unicode, but never a name traceml writes).
    """
    if not _NUMBER.fullmatch(text) or len(text) > 19:
        return None
    value = int(text)
    return value if value <= INT64_MAX else None


def parse_int_key(text: object) -> Optional[int]:
    """The integer an :data:`IntKey` spells (``"-3"`` → -3); None for any other text or value."""
    return int(text) if isinstance(text, str) and _INT_KEY.fullmatch(text) else None


def fits_int64(value: object) -> bool:
    """True for an ``int`` (not a bool) SQLite can store."""
    return type(value) is int and INT64_MIN <= value <= INT64_MAX


def epoch_or_none(value: object) -> Optional[float]:
    """``value`` as epoch seconds when it is a number within :data:`Epoch`'s range, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0.0 <= value <= EPOCH_MAX else None


__all__ = ["Count", "EPOCH_MAX", "Epoch", "INT64_MAX", "INT64_MIN", "Int64", "IntKey", "epoch_or_none",
           "fits_int64", "parse_int_key",
           "parse_number"]
