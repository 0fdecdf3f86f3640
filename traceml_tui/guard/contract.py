"""The Regression Guard declaration (seed 000, "Configuration fields").

A guard block in ``traceml.yaml`` declares *what* work a run performs (a
workload name plus scalar parameters) and *which* completed steps it intends
to measure. Two runs are comparable only when their normalized declarations
are identical, so this module is strict: anything the seed does not allow is
rejected with one line naming the offending field, never silently fixed.

Normalization keeps Python types exactly as the YAML loader produced them
(``32`` and ``"32"`` are different declarations) and sorts parameters by key
so that key order in the file never matters.

Pure functions only; no I/O.
"""

from __future__ import annotations

import hashlib
import json
import math
import reprlib
import unicodedata
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 1
MAX_NAME_CHARS = 128
MAX_PARAMETERS = 32
MAX_KEY_CHARS = 64
MAX_STRING_VALUE_CHARS = 256
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)

_GUARD_FIELDS = ("schema_version", "workload", "measurement")
_WORKLOAD_FIELDS = ("name", "parameters")
_MEASUREMENT_FIELDS = ("start_step", "completed_steps")


class ContractError(ValueError):
    """An invalid guard declaration.

    ``field`` is the dotted path of the offending value (for example
    ``guard.workload.parameters.model``) and ``rule`` the short rule it broke;
    ``str(err)`` is the single line ``"<field>: <rule>"``.
    """

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}"


#: Longest rendering of a user-supplied value or key in an error message.
MAX_SHOWN_CHARS = 80

# Bounded rendering: a few items, a few levels, short strings — built without ever
# rendering the whole value (a YAML value can be huge; repr() of it is not bounded).
_BOUNDED = reprlib.Repr()
_BOUNDED.maxlevel = 2
_BOUNDED.maxdict = _BOUNDED.maxlist = _BOUNDED.maxtuple = _BOUNDED.maxset = _BOUNDED.maxfrozenset = 4
_BOUNDED.maxstring = _BOUNDED.maxother = MAX_SHOWN_CHARS
_BOUNDED.maxlong = 40


def show_value(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """``repr``-like rendering of a user-supplied value for an error message: one line, at most ``limit`` chars.

    Never renders more of the value than it shows, so a huge (or self-referencing)
    value costs nothing; control and format characters are escaped.
    """
    try:
        text = _BOUNDED.repr(value)
    except (ValueError, RecursionError):  # e.g. an integer beyond Python's digit limit
        text = f"<{type(value).__name__}>"
    text = text.encode("ascii", "backslashreplace").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show(key: Any) -> str:
    """Render a user-supplied key for an error message on one safe line (at most 80 characters)."""
    if isinstance(key, str) and key and key.isprintable() and key == key.strip() and "." not in key:
        return key if len(key) <= MAX_SHOWN_CHARS else key[: MAX_SHOWN_CHARS - 1] + "…"
    # ascii() escapes control/format characters and newlines, so a hostile key
    # cannot break the one-line error or hide itself in a terminal.
    return show_value(key if not isinstance(key, str) else key[: MAX_SHOWN_CHARS + 1])


#: The public name of :func:`_show` (the hygiene block's validator words keys the same way).
show_key = _show


def _has_category_c(text: str) -> bool:
    return any(unicodedata.category(ch).startswith("C") for ch in text)


def _mapping(value: Any, field: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise ContractError(field, f"must be a mapping, not {_type_name(value)}")
    return value


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a Boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _check_fields(value: Mapping[Any, Any], allowed: tuple[str, ...], field: str) -> None:
    """Reject non-string and unknown keys, then missing required ones."""
    for key in value:
        if not isinstance(key, str):
            raise ContractError(field, f"keys must be strings, found {_show(key)}")
    unknown = sorted(key for key in value if key not in allowed)
    if unknown:
        raise ContractError(f"{field}.{_show(unknown[0])}", "unknown field")


def _require(value: Mapping[str, Any], key: str, field: str) -> Any:
    if key not in value:
        raise ContractError(f"{field}.{key}", "is required")
    return value[key]


def _text(value: Any, field: str, *, max_chars: int, what: str = "") -> str:
    """Validate a name, key or string value: the seed's rules for all three."""
    if not isinstance(value, str):
        raise ContractError(field, f"{what}must be a string, not {_type_name(value)}")
    if not value.strip():
        raise ContractError(field, f"{what}must not be empty")
    if value != value.strip():
        raise ContractError(field, f"{what}must not have surrounding whitespace")
    if len(value) > max_chars:
        raise ContractError(field, f"{what}must be at most {max_chars} characters (got {len(value)})")
    if _has_category_c(value):
        raise ContractError(field, f"{what}must not contain control or format characters (Unicode category C)")
    return value


def _parameter_value(value: Any, field: str) -> str | int | float | bool:
    # bool is an int subclass: keep it a bool, never range-check it as a number.
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ContractError(field, "integer must fit in a signed 64-bit value")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ContractError(field, "float must be finite")
        return float(value)
    if isinstance(value, str):
        return _text(value, field, max_chars=MAX_STRING_VALUE_CHARS)
    raise ContractError(
        field,
        f"must be a string, integer, finite float or Boolean, not {_type_name(value)}",
    )


def _parameters(raw: Any) -> dict[str, str | int | float | bool]:
    field = "guard.workload.parameters"
    params = _mapping(raw, field)
    if len(params) > MAX_PARAMETERS:
        raise ContractError(field, f"must contain at most {MAX_PARAMETERS} entries (got {len(params)})")
    out: dict[str, str | int | float | bool] = {}
    for key, value in params.items():
        if not isinstance(key, str):
            raise ContractError(field, f"keys must be strings, found {_show(key)}")
        _text(key, field, max_chars=MAX_KEY_CHARS, what=f"key {_show(key)} ")
        out[key] = _parameter_value(value, f"{field}.{key}")
    return {key: out[key] for key in sorted(out)}


def _step_int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(field, f"must be an integer, not {_type_name(value)}")
    if value < 1:
        raise ContractError(field, f"must be at least 1 (got {show_value(value)})")
    if value > INT64_MAX:
        raise ContractError(field, "must fit in a signed 64-bit value")
    return int(value)


def parse_guard_contract(raw: object) -> dict:
    """Validate and normalize one ``guard`` block from ``traceml.yaml``.

    Returns a fresh dict ``{"schema_version": 1, "workload": {"name",
    "parameters"}, "measurement": {"start_step", "completed_steps"}}`` with
    parameters sorted by key and every value's Python type preserved.
    Idempotent: a normalized contract parses to itself. Raises
    :class:`ContractError` naming the first offending field.
    """
    guard = _mapping(raw, "guard")
    _check_fields(guard, _GUARD_FIELDS, "guard")

    version = _require(guard, "schema_version", "guard")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ContractError("guard.schema_version", f"must be an integer, not {_type_name(version)}")
    if version != SCHEMA_VERSION:
        raise ContractError("guard.schema_version", f"must be {SCHEMA_VERSION} (got {version})")

    workload = _mapping(_require(guard, "workload", "guard"), "guard.workload")
    _check_fields(workload, _WORKLOAD_FIELDS, "guard.workload")
    name = _text(_require(workload, "name", "guard.workload"), "guard.workload.name", max_chars=MAX_NAME_CHARS)
    parameters = _parameters(workload.get("parameters", {}))

    measurement = _mapping(_require(guard, "measurement", "guard"), "guard.measurement")
    _check_fields(measurement, _MEASUREMENT_FIELDS, "guard.measurement")
    start = _step_int(_require(measurement, "start_step", "guard.measurement"), "guard.measurement.start_step")
    count = _step_int(
        _require(measurement, "completed_steps", "guard.measurement"), "guard.measurement.completed_steps"
    )
    if start + count - 1 > INT64_MAX:
        raise ContractError(
            "guard.measurement",
            "inclusive end step (start_step + completed_steps - 1) must fit in a signed 64-bit value",
        )

    return {
        "schema_version": SCHEMA_VERSION,
        "workload": {"name": name, "parameters": parameters},
        "measurement": {"start_step": start, "completed_steps": count},
    }


def canonical_json(contract: dict) -> bytes:
    """The normalized contract as canonical UTF-8 JSON (sorted keys, no spaces)."""
    normalized = parse_guard_contract(contract)
    return json.dumps(
        normalized, ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
    ).encode("utf-8")


def contract_digest(contract: dict) -> str:
    """Stable digest of the normalized contract: ``"sha256:<64 hex digits>"``.

    Built the same way as the published traceml-ai package (sha256 over the
    canonical JSON of the normalized declaration, with the ``sha256:`` prefix),
    so node outcomes written by either tool carry the same digest for the same
    declaration. Type-significant (``32`` vs ``"32"`` differ); key order and
    parameter order are irrelevant. Raises :class:`ContractError` when the
    input is not a valid declaration.
    """
    return "sha256:" + hashlib.sha256(canonical_json(contract)).hexdigest()


def measurement_end(contract: dict) -> int:
    """Inclusive last declared step: ``start_step + completed_steps - 1``."""
    measurement = contract["measurement"]
    return int(measurement["start_step"]) + int(measurement["completed_steps"]) - 1


__all__ = [
    "ContractError",
    "INT64_MAX",
    "INT64_MIN",
    "SCHEMA_VERSION",
    "canonical_json",
    "contract_digest",
    "measurement_end",
    "parse_guard_contract",
]
