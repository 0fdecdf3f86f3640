"""The launcher lease: one node's heartbeat file, its bytes, its length and its decoding.

Each node's ``traceml run`` keeps ``nodes/node_<k>/launcher.lease`` (path:
:meth:`traceml_tui.core.rundir.RunDir.lease`) from the moment its run folder
is prepared until it has written its final word: every
:func:`beat_interval_s` it atomically replaces the file with a new beat (a
counter and a per-launch token), and when it is done it writes a last beat
with ``state: "done"``. The file is one JSON object on one line::

    {"v":1,"kind":"lease","node":0,"launch":"3f9c01ab","beat":17,"lease_s":30.0,"state":"live"}

No time is in it. Whoever reads it (the daemon) notes, by its own clock, when
it last saw the bytes change; a lease whose bytes were not seen to change for
its ``lease_s`` has **expired**: the launcher (or its whole node) is gone. So
clocks of different nodes never have to agree (docs/run.md, "Launcher lease";
the rule that turns expired leases into words is in :mod:`.state`).

The length is :data:`DEFAULT_LEASE_S` unless ``TRACEML_LAUNCHER_LEASE_S``
says otherwise (tests use a few seconds); the launcher beats
:data:`BEATS_PER_LEASE` times per lease, so several beats must go missing
before a live launcher could look dead.
"""

from __future__ import annotations

import math
import secrets
from typing import Mapping, Optional

import msgspec

#: Environment variable that sets the lease length in seconds (read by ``traceml run``).
LEASE_ENV = "TRACEML_LAUNCHER_LEASE_S"
#: Seconds without a visible beat after which a launcher is taken for gone (the default).
DEFAULT_LEASE_S = 30.0
#: The least lease length a launcher accepts: below it a loaded machine's scheduling alone could miss it.
MIN_LEASE_S = 1.0
#: The greatest (a day): a longer one would leave a dead run `running` for longer than anyone waits.
MAX_LEASE_S = 86400.0
#: Beats per lease: the launcher beats every ``lease_s / BEATS_PER_LEASE`` seconds.
BEATS_PER_LEASE = 6
#: A lease file is a few dozen bytes; anything larger is not one (the reader does not read past this).
MAX_LEASE_BYTES = 4096

LIVE = "live"
DONE = "done"


class Beat(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One beat of a node's launcher lease, as written in ``launcher.lease``."""

    v: int
    kind: str
    node: int
    launch: str
    beat: int
    lease_s: float
    state: str

    @property
    def done(self) -> bool:
        """The launcher wrote its final word and stopped beating: the lease never expires."""
        return self.state == DONE


class LeaseConfigError(ValueError):
    """``TRACEML_LAUNCHER_LEASE_S`` is not a usable number of seconds; ``str()`` is one line."""


def lease_from_env(environ: Mapping[str, str]) -> float:
    """The lease length the environment asks for, else :data:`DEFAULT_LEASE_S`; raises :class:`LeaseConfigError`."""
    text = environ.get(LEASE_ENV)
    if text is None or not text.strip():
        return DEFAULT_LEASE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (MIN_LEASE_S <= value <= MAX_LEASE_S):
        shown = text if len(text) <= 40 and text.isprintable() else ascii(text[:40])
        raise LeaseConfigError(f"{LEASE_ENV}={shown} is not a number of seconds from {MIN_LEASE_S:g} to "
                               f"{MAX_LEASE_S:g}")
    return value


def beat_interval_s(lease_s: float) -> float:
    """Seconds between two beats of a lease of ``lease_s`` seconds."""
    return lease_s / BEATS_PER_LEASE


def new_launch_token() -> str:
    """A token that makes one launcher's beats differ from every other's (a resumed run starts counting anew)."""
    return secrets.token_hex(4)


def encode(*, node: int, launch: str, beat: int, lease_s: float, done: bool = False) -> bytes:
    """The bytes of one beat (one JSON line)."""
    return msgspec.json.encode(Beat(v=1, kind="lease", node=int(node), launch=launch, beat=int(beat),
                                    lease_s=float(lease_s), state=DONE if done else LIVE)) + b"\n"


def decode(data: bytes) -> Optional[Beat]:
    """A lease file's bytes as a :class:`Beat`, or None when they are not one.

    Not one: not a JSON object of that shape, a version other than 1, a
    state other than live/done, a lease length outside
    [:data:`MIN_LEASE_S`, :data:`MAX_LEASE_S`] (NaN and infinities included),
    a negative node or beat, or more than :data:`MAX_LEASE_BYTES` bytes.
    """
    if len(data) > MAX_LEASE_BYTES:
        return None
    try:
        beat = msgspec.json.decode(data, type=Beat)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
        return None
    if beat.v != 1 or beat.kind != "lease" or beat.state not in (LIVE, DONE):
        return None
    if not (MIN_LEASE_S <= beat.lease_s <= MAX_LEASE_S) or beat.node < 0 or beat.beat < 0:
        return None
    if not (0 <= beat.node < 1 << 63 and beat.beat < 1 << 63):
        return None
    return beat


__all__ = ["BEATS_PER_LEASE", "DEFAULT_LEASE_S", "DONE", "LEASE_ENV", "LIVE", "MAX_LEASE_BYTES", "MAX_LEASE_S",
           "MIN_LEASE_S", "Beat", "LeaseConfigError", "beat_interval_s", "decode", "encode", "lease_from_env",
           "new_launch_token"]
