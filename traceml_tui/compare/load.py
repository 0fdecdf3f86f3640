"""Bounded, strict reading of one ``final_summary.json``.

A CI job feeds this whatever files it finds, so every way a file can be wrong
ends in :class:`SummaryError` whose ``str()`` is one plain sentence; nothing
here prints, exits or raises anything else for bad input.

Limits (documented in ``docs/compare.md``):

* the file must be a regular file of at most :data:`MAX_SUMMARY_BYTES`
  (checked with ``stat`` before a single byte is parsed, so a huge file is
  refused instantly);
* UTF-8, one JSON object, no ``NaN``/``Infinity`` literals (they are not
  JSON and a summary never needs them), nested at most :data:`MAX_SUMMARY_DEPTH`
  levels (checked before parsing, ``core/jsonsafe.py``; summaries are ~6 deep);
* the minimum shape shared with the published traceml-ai reader:
  ``schema_version`` present and the ``system``, ``process``, ``step_time``
  and ``step_memory`` sections present as objects. Keeping the same minimum
  means a pair is accepted here exactly when that package accepts it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from traceml_tui.core.jsonsafe import (  # stdlib only: compare starts without msgspec
    MAX_DEPTH,
    nesting_depth,
    surrogate_message,
    unpaired_surrogate,
)

#: Largest summary accepted. Real summaries are tens of KiB (a few MiB for
#: thousands of ranks); anything bigger is not a summary.
MAX_SUMMARY_BYTES = 32 * 1024 * 1024

#: Deepest nesting accepted (a summary is about 6 levels deep).
MAX_SUMMARY_DEPTH = MAX_DEPTH

REQUIRED_SECTIONS = ("system", "process", "step_time", "step_memory")


class SummaryError(ValueError):
    """A summary file that cannot be compared; ``str()`` is one sentence."""


def _refuse_constant(name: str) -> Any:
    raise SummaryError(f"contains a {name} literal, which is not valid JSON")


def parse_summary_bytes(data: bytes, *, require_shape: bool = True) -> dict[str, Any]:
    """Parse the bytes of a summary file into a dict, or raise SummaryError.

    ``require_shape=False`` skips the section check (``traceml view`` only
    needs the stored text card).
    """
    if len(data) > MAX_SUMMARY_BYTES:
        raise SummaryError(f"is larger than the {MAX_SUMMARY_BYTES // (1024 * 1024)} MiB summary size limit")
    if not data.strip():
        raise SummaryError("is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SummaryError(f"is not UTF-8 text (invalid byte at offset {exc.start})") from None
    if nesting_depth(data, MAX_SUMMARY_DEPTH) > MAX_SUMMARY_DEPTH:  # before the parser recurses into it
        raise SummaryError(f"is nested deeper than {MAX_SUMMARY_DEPTH} levels, so it is not a summary")
    surrogate = unpaired_surrogate(data)
    if surrogate is not None:  # json.loads would return text that cannot be printed or written again
        raise SummaryError(f"is not valid JSON text ({surrogate_message(*surrogate)})")
    try:
        payload = json.loads(text, parse_constant=_refuse_constant)
    except SummaryError:
        raise
    except RecursionError:
        raise SummaryError(f"is nested deeper than {MAX_SUMMARY_DEPTH} levels, so it is not a summary") from None
    except json.JSONDecodeError as exc:
        raise SummaryError(f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise SummaryError(f"is not a usable JSON summary ({exc})") from None
    if not isinstance(payload, dict):
        raise SummaryError(f"holds a JSON {_json_type(payload)}, not an object")
    if require_shape:
        check_summary_shape(payload)
    return payload


def check_summary_shape(payload: dict[str, Any]) -> None:
    """Require the minimum summary shape (see module docstring)."""
    if payload.get("schema_version") is None:
        raise SummaryError("has no 'schema_version' field, so it is not a final summary")
    for section in REQUIRED_SECTIONS:
        if not isinstance(payload.get(section), dict):
            raise SummaryError(f"has no '{section}' section, so it is not a final summary")


def read_summary(path: str | os.PathLike[str], *, require_shape: bool = True) -> dict[str, Any]:
    """Read and parse one summary file; raise SummaryError naming the problem.

    The size limit is enforced from ``stat`` before reading, and again on the
    bytes actually read (a file can grow in between).
    """
    target = Path(path)
    try:
        info = target.stat()
    except FileNotFoundError:
        raise SummaryError("does not exist") from None
    except NotADirectoryError:
        raise SummaryError("does not exist (a parent is not a folder)") from None
    except OSError as exc:
        raise SummaryError(f"cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(info.st_mode):
        raise SummaryError("is a folder, not a summary file")
    if not stat.S_ISREG(info.st_mode):
        # A FIFO or device would block or never end; only plain files count.
        raise SummaryError("is not a regular file")
    if info.st_size > MAX_SUMMARY_BYTES:
        raise SummaryError(
            f"is {info.st_size / (1024 * 1024):.0f} MiB, over the "
            f"{MAX_SUMMARY_BYTES // (1024 * 1024)} MiB summary size limit"
        )
    try:
        with open(target, "rb") as handle:
            data = handle.read(MAX_SUMMARY_BYTES + 1)
    except OSError as exc:
        raise SummaryError(f"cannot be read ({exc.strerror or exc})") from None
    return parse_summary_bytes(data, require_shape=require_shape)


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"
