"""Typed, bounded structs of the hygiene side files, and the one decoder of each (docs/hygiene.md, docs/export.md).

The files are the validation backlog under ``<run>/validation/`` (requests,
claims, receipts, failures), ``early_stopping.json`` and the Trackio export
cursor. Every reader of one of them decodes it here — the file side in
:mod:`traceml_tui.hygiene` and :mod:`traceml_tui.export`, the index side in
``daemon/reader.py`` — so a file is read the same way on every surface.

Bounds (what any writer of ours can produce; anything else is a damaged file):

* numbers are finite (JSON cannot spell infinity; a literal beyond a double,
  such as ``1e400`` or a 400-digit integer, is refused);
* timestamps are unix seconds within ``[0, 9999-12-31]``;
* integers fit SQLite's signed 64-bit range (counts are also ``>= 0``);
* ``metrics`` is an object of finite numbers or null;
* text is valid Unicode (an unpaired UTF-16 surrogate escape is refused);
* the whole file is such JSON, unknown keys included (they are otherwise ignored).

A file that does not decode raises :class:`DamagedFile`, a ``ValueError``
whose text is one line saying what is wrong and where (``- at `$.metrics```).
Unknown keys are ignored, so files of newer writers stay readable.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional, Union

import msgspec

from traceml_tui.core import jsonsafe

#: Signed 64-bit range: what SQLite stores as an integer.
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
#: 9999-12-31T23:59:59Z: the last second a timestamp may name.
MAX_TIMESTAMP = 253402300799.0
#: The longest duration a file may declare (a lease, a backoff): about 31 years.
MAX_SECONDS = 1e9

Timestamp = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TIMESTAMP)]
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_SECONDS)]
#: A metric value: a finite number (msgspec refuses out-of-range literals) or null.
Metric = Optional[float]


class DamagedFile(ValueError):
    """A hygiene side file that does not decode; ``str()`` is one line."""


# --------------------------------------------------------------------------- the backlog


class Request(msgspec.Struct):
    """``requests/<ckpt>.json``: written once by training when it publishes a checkpoint."""

    checkpoint: str
    step: Optional[Int64] = None
    path: Optional[str] = None
    config_digest: Optional[str] = None
    created: Optional[Timestamp] = None


class Owner(msgspec.Struct):
    """Who holds a claim: host, pid and process start time (:func:`traceml_tui.core.owner.current_owner`)."""

    host: Optional[str] = None
    pid: Optional[Int64] = None
    start_time: Optional[Timestamp] = None


class Worker(msgspec.Struct):
    """The validation worker of a claim: its process group and start time."""

    pgid: Optional[Int64] = None
    start_time: Optional[Timestamp] = None


class Claim(msgspec.Struct):
    """``claims/<ckpt>.json``: a drainer holds the request."""

    checkpoint: str
    owner: Optional[Owner] = None
    claimed: Optional[Timestamp] = None
    heartbeat: Optional[Timestamp] = None
    lease_s: Optional[Seconds] = None
    worker: Optional[Worker] = None


class Override(msgspec.Struct):
    """A receipt produced by another validation config than its request's (``--recipe-override``)."""

    config_digest: Optional[str] = None


class Receipt(msgspec.Struct):
    """``receipts/<ckpt>.json``: a completed validation, bound to its checkpoint and config digest."""

    checkpoint: str
    step: Optional[Int64] = None
    config_digest: Optional[str] = None
    metrics: dict[str, Metric] = msgspec.field(default_factory=dict)
    completed: Optional[Timestamp] = None
    override: Optional[Override] = None


class Failure(msgspec.Struct):
    """``failures/<ckpt>-<n>.json``: one failed attempt (never a result)."""

    checkpoint: str
    attempt: Optional[Count] = None
    error: Optional[str] = None
    failed: Optional[Timestamp] = None


BacklogFile = Union[Request, Claim, Receipt, Failure]

#: The struct of each backlog folder (``rundir.BACKLOG_KINDS`` names them).
BACKLOG_TYPES: dict[str, type] = {"requests": Request, "claims": Claim, "receipts": Receipt, "failures": Failure}


# --------------------------------------------------------------------------- early stopping


class Policy(msgspec.Struct):
    """The early-stopping policy frozen into the state on first use."""

    enabled: bool = True
    reason: Optional[str] = None
    metric: Optional[str] = None
    direction: Optional[str] = None
    min_delta: Optional[float] = None
    patience: Optional[Count] = None
    warmup: Optional[Count] = None
    max_budget: Optional[Count] = None


class StopEntry(msgspec.Struct):
    """One checkpoint early stopping consumed without counting (after the stop, skipped, missing its metric)."""

    checkpoint: Optional[str] = None
    step: Optional[Int64] = None
    value: Metric = None
    reason: Optional[str] = None
    metrics: Optional[list[str]] = None


class EarlyStoppingState(msgspec.Struct):
    """``early_stopping.json`` (:mod:`traceml_tui.hygiene.early_stopping`)."""

    version: Count = 1
    policy: Policy = msgspec.field(default_factory=Policy)
    best_metric: Metric = None
    best_checkpoint: Optional[str] = None
    best_step: Optional[Int64] = None
    patience_counter: Count = 0
    evaluations: Count = 0
    last_consumed: Optional[str] = None
    consumed: list[str] = msgspec.field(default_factory=list)
    after_stop: list[StopEntry] = msgspec.field(default_factory=list)
    skipped: list[StopEntry] = msgspec.field(default_factory=list)
    missing_metric: list[StopEntry] = msgspec.field(default_factory=list)
    stopped: bool = False
    reason: Optional[str] = None
    trigger_checkpoint: Optional[str] = None
    trigger_step: Optional[Int64] = None
    updated: Optional[Timestamp] = None


# --------------------------------------------------------------------------- the export cursor

CURSOR_VERSION = 1


class FileMark(msgspec.Struct):
    """How far one step file was delivered: the hash of its header line and the byte offset read up to."""

    head: str
    offset: Count


class Counters(msgspec.Struct):
    """What the information tables were built from."""

    updates: Count = 0
    examples: Optional[Count] = None
    batch_sizes: list[Count] = msgspec.field(default_factory=list)
    malformed: Count = 0


class Registration(msgspec.Struct):
    description: Optional[str] = None
    group: Optional[str] = None


class ExportCursor(msgspec.Struct):
    """``export/trackio-<project>.json``: what was already delivered (:mod:`traceml_tui.export.cursor`)."""

    version: Int64
    files: dict[str, FileMark] = msgspec.field(default_factory=dict)
    train_step: Count = 0
    delivered: list[str] = msgspec.field(default_factory=list)
    grids: list[str] = msgspec.field(default_factory=list)
    curve: Optional[str] = None
    tables: dict[str, str] = msgspec.field(default_factory=dict)
    counters: Counters = msgspec.field(default_factory=Counters)
    readouts: dict[str, list[Union[str, Int64, None]]] = msgspec.field(default_factory=dict)
    experiment_dir: Optional[str] = None
    run_name: Optional[str] = None
    registration: Optional[Registration] = None


# --------------------------------------------------------------------------- decoders


def checkpoint_of(folder: str, name: str) -> Optional[str]:
    """The checkpoint a backlog file's name (``<ckpt>.json``, ``<ckpt>-<n>.json`` for failures) says it is of.

    None for a failure file not named ``<ckpt>-<n>.json``. A damaged failure file
    still counts as the failed attempt of this checkpoint (never as none).
    """
    stem = name[: -len(".json")] if name.endswith(".json") else name
    if folder != "failures":
        return stem
    head, _, attempt = stem.rpartition("-")
    return head if head and attempt.isdigit() else None



def _decode(data: Union[bytes, str], kind: type) -> Any:
    """``data`` as a ``kind``, or :class:`DamagedFile` with one line saying why."""
    if not isinstance(data, str):
        try:
            # msgspec skips unknown keys without checking their bytes: the whole file must be UTF-8 text,
            # or the index (which keeps files as text) and the files would disagree about it.
            bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DamagedFile(f"not UTF-8 text (byte {exc.start})") from None
    try:
        # First as plain JSON: an unknown key is skipped by the typed decode below, but its value must still be
        # JSON this reader accepts (a number in range, valid text) — as the index, which keeps the whole
        # file, requires — so both sides agree on every file.
        jsonsafe.decode_bounded(data)
        return jsonsafe.decode_bounded(data, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError, jsonsafe.NestingError) as exc:
        raise DamagedFile(" ".join(str(exc).split())) from None
    except RecursionError:  # a lowered interpreter recursion limit
        raise DamagedFile("nested too deeply") from None


def decode_backlog(folder: str, data: Union[bytes, str]) -> BacklogFile:
    """One backlog file of ``folder`` (``requests``, ``claims``, ``receipts``, ``failures``) from its bytes."""
    return _decode(data, BACKLOG_TYPES[folder])


def decode_named(folder: str, name: str, data: Union[bytes, str]) -> BacklogFile:
    """The backlog file ``name`` of ``folder`` from its bytes; it must be of the checkpoint its name says.

    What both sides read: the files (:func:`traceml_tui.hygiene.backlog.read_backlog_file`)
    and the index (``daemon/reader.py``).
    """
    value = decode_backlog(folder, data)
    expected = checkpoint_of(folder, name)
    if expected is not None and value.checkpoint != expected:
        raise DamagedFile(f"names checkpoint {value.checkpoint!r}, not {expected!r} of its file name")
    return value


#: The backlog folder of each side-file kind (``rundir.BACKLOG_KINDS`` reversed).
FOLDER_OF_KIND = {"request": "requests", "claim": "claims", "receipt": "receipts", "failure": "failures"}


def decode_early_stopping(data: Union[bytes, str]) -> EarlyStoppingState:
    """``early_stopping.json`` from its bytes."""
    return _decode(data, EarlyStoppingState)


def decode_cursor(data: Union[bytes, str]) -> ExportCursor:
    """A Trackio export cursor from its bytes (its ``version`` is checked by the caller)."""
    return _decode(data, ExportCursor)


def as_dict(value: msgspec.Struct) -> dict[str, Any]:
    """A decoded file as plain JSON values (every field, defaults filled in)."""
    return msgspec.to_builtins(value)


__all__ = [
    "BACKLOG_TYPES", "CURSOR_VERSION", "checkpoint_of", "Claim", "DamagedFile", "EarlyStoppingState", "ExportCursor", "Failure",
    "FOLDER_OF_KIND", "INT64_MAX", "INT64_MIN", "MAX_TIMESTAMP", "Receipt", "Request", "as_dict", "decode_backlog",
    "decode_cursor", "decode_early_stopping", "decode_named",
]
