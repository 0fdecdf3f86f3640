"""The export cursor: what has already been delivered, so a repeated export sends only what is new.

Per run and project, one small JSON file written atomically after a
successful delivery (never before), so an outage leaves the cursor where it was
and the next export retries the same points:

* ``files`` — per step file, the hash of its header line and the byte offset
  read up to (complete lines only; a replaced file restarts at 0);
* ``train_step`` — the highest training step delivered (a resume that repeats
  steps does not send them twice);
* ``delivered`` — ``key@step`` of evaluation and QC points, so an evaluation
  that arrives late for an earlier checkpoint is sent exactly once;
* ``grids``, ``curve``, ``tables`` — images and tables already sent (by file or digest);
* ``counters``, ``readouts`` — what the information tables were built from, so an
  increment rebuilds them without rereading the whole history;
* ``experiment_dir``, ``run_name`` — whose cursor this is: the run directory and
  the Trackio run it was published as (docs/export.md, "One run, one Trackio run");
* ``registration`` — the description and group last delivered and read back, so a
  changed one is published even when no record is new.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import msgspec

from traceml_tui.core import atomic, hygiene_files, jsonl, jsonsafe
from traceml_tui.core.rundir import RunDir

CURSOR_VERSION = hygiene_files.CURSOR_VERSION


@dataclass
class Cursor:
    files: dict[str, dict] = field(default_factory=dict)
    train_step: int = 0
    delivered: set[str] = field(default_factory=set)
    grids: set[str] = field(default_factory=set)
    curve: Optional[str] = None
    tables: dict[str, str] = field(default_factory=dict)
    counters: dict = field(default_factory=dict)  # examples seen, batch sizes: table rows survive increments
    readouts: dict[str, list] = field(default_factory=dict)  # eval records seen so far, for the readouts table
    experiment_dir: Optional[str] = None  # None: written by an exporter that did not record it
    run_name: Optional[str] = None
    registration: Optional[dict] = None  # {"description", "group"} as delivered and read back

    def copy(self) -> "Cursor":
        return Cursor(files=dict(self.files), train_step=self.train_step, delivered=set(self.delivered),
                      grids=set(self.grids), curve=self.curve, tables=dict(self.tables),
                      counters=dict(self.counters), readouts=dict(self.readouts),
                      experiment_dir=self.experiment_dir, run_name=self.run_name,
                      registration=dict(self.registration) if self.registration is not None else None)

    def to_json(self) -> dict:
        return {"version": CURSOR_VERSION, "files": self.files, "train_step": self.train_step,
                "delivered": sorted(self.delivered), "grids": sorted(self.grids), "curve": self.curve,
                "tables": self.tables, "counters": self.counters, "readouts": self.readouts,
                "experiment_dir": self.experiment_dir, "run_name": self.run_name, "registration": self.registration}


def cursor_path(run_dir: Path, project: str, cursor_dir: Optional[Path] = None,
                run_name: Optional[str] = None) -> Path:
    """Where the cursor of (run, project) lives: ``<run_dir>/export/trackio-<project>.json`` by default.

    Under ``cursor_dir`` it is named after the Trackio run (``run_name``, default the
    folder's name): one cursor per Trackio run, and the cursor says which run
    directory owns it.
    """
    if cursor_dir is not None:
        return Path(cursor_dir) / f"{run_name or Path(run_dir).resolve().name}-trackio-{project}.json"
    return RunDir(run_dir).export_cursor("trackio", project)


def load(path: Path) -> Cursor:
    """Read a cursor; a missing file is a fresh cursor, an unreadable or damaged one is an error (never reset).

    Decoded by :func:`traceml_tui.core.hygiene_files.decode_cursor` (offsets and counts
    within ``[0, 2^63)``, expected shapes): a damaged cursor is refused with one
    line naming it, and nothing is overwritten — a bad offset never silently
    stops the export of a file for good.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return Cursor()
    except OSError as exc:
        raise ValueError(f"export cursor {path.name} is unreadable ({exc.strerror or exc}); "
                         "move it aside to re-export") from None
    try:  # a cursor of another version is not damaged, just not ours to read
        version = jsonsafe.decode_bounded(data, type=_Version).version
    except (msgspec.ValidationError, msgspec.DecodeError, jsonsafe.NestingError):
        version = None  # the full decode below says what is wrong
    if version is not None and version != CURSOR_VERSION:
        raise ValueError(f"export cursor {path.name} has an unknown version")
    try:
        raw = hygiene_files.decode_cursor(data)
    except hygiene_files.DamagedFile as exc:
        raise ValueError(f"export cursor {path.name} is damaged ({exc}); move it aside to re-export") from None
    if raw.version != CURSOR_VERSION:
        raise ValueError(f"export cursor {path.name} has an unknown version")
    return Cursor(files={rel: {"head": mark.head, "offset": mark.offset} for rel, mark in raw.files.items()},
                  train_step=raw.train_step, delivered=set(raw.delivered), grids=set(raw.grids),
                  curve=raw.curve, tables=dict(raw.tables), counters=hygiene_files.as_dict(raw.counters),
                  readouts={k: list(v) for k, v in raw.readouts.items()},
                  experiment_dir=_text(raw.experiment_dir), run_name=_text(raw.run_name),
                  registration=hygiene_files.as_dict(raw.registration) if raw.registration is not None else None)


class _Version(msgspec.Struct):
    version: Any = CURSOR_VERSION


def _text(value: object) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def save(path: Path, cursor: Cursor) -> None:
    """Write the cursor atomically."""
    atomic.atomic_write_json(path, cursor.to_json())


def head_hash(data: bytes) -> Optional[str]:
    end = data.find(b"\n")
    return hashlib.sha256(data[:end]).hexdigest()[:16] if end >= 0 else None


def read_new_lines(path: Path, state: Optional[dict]) -> tuple[list[bytes], Optional[dict]]:
    """Complete lines of ``path`` past the cursor ``state``, and the state to store after delivery.

    A file whose header changed (replaced or truncated) is read from the start.
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(1 << 16)
            identity = head_hash(head)
            if identity is None:
                return [], state
            offset = int(state["offset"]) if state and state.get("head") == identity else 0
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return [], state
    # Complete lines only (core.jsonl): the cursor stops at the last newline, a half-written line is read next time.
    return jsonl.complete_lines(data), {"head": identity, "offset": offset + jsonl.complete_end(data)}


def iter_step_files(run_dir: Path) -> Iterator[tuple[int, Path]]:
    """(rank, path) of every rank step file, ranks and attempts in order."""
    for stream in RunDir(run_dir).step_files():
        yield stream.rank, stream.path
