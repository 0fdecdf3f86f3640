"""Hypothesis strategies that damage real files the way disks, editors and bugs do (docs/security.md, "Fuzzing").

Structured mutations start from a real file (parsed JSON or YAML text) and replace one value anywhere in it
with a nasty token — a number beyond a double or SQLite's 64-bit range, ``NaN``/``Infinity``, a lone
surrogate escape, deep nesting, a wrong type — or drop a key; byte mutations truncate, insert or flip bytes.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

BIG = "1" + "0" * 400
#: Raw JSON tokens no writer of ours produces, each found to break a reader at least once.
NASTY_JSON_TOKENS: tuple[bytes, ...] = (
    b"1e400", b"-1e400", BIG.encode(), b"-" + BIG.encode(), b"NaN", b"Infinity", b"-Infinity",
    b"9223372036854775808", b"-9223372036854775809", b"18446744073709551616", b"1e-400", b"-0.0",
    b'"\\ud800"', b'"\\udc00x"', b'"\\ud800\\u0041"', b'"\xed\xa0\x80"', b'"\xff"',
    b"[" * 200 + b"]" * 200, b'{"a":' * 100 + b"1" + b"}" * 100, b"true", b"null", b'""', b"[]", b"{}", b"-5",
    b'"1796051704.5"', b"[1, 2]", b'{"host": 5}',
)

json_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
raw_tokens = st.one_of(st.sampled_from(NASTY_JSON_TOKENS),
                       json_values.map(lambda v: json.dumps(v).encode()))

_MARK = "@@fuzz-token@@"


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a parsed JSON document (dict keys and list indexes), the root excluded."""
    out = []
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return out
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


def _set(doc: Any, path: tuple, new: Any, *, delete: bool = False) -> None:
    for key in path[:-1]:
        doc = doc[key]
    if delete and isinstance(doc, dict):
        del doc[path[-1]]
    else:
        doc[path[-1]] = new


@st.composite
def json_mutation(draw, original: bytes) -> bytes:
    """``original`` (a JSON object's bytes) with one value replaced by a raw token, one key dropped or renamed,
    or a raw token added under a new key."""
    doc = json.loads(original)
    paths = _paths(doc)
    how = draw(st.sampled_from(("replace", "replace", "replace", "delete", "add", "whole")))
    if how == "whole":
        return draw(raw_tokens)
    if how == "add" or not paths:
        doc[draw(st.text(max_size=8))] = _MARK
    else:
        path = draw(st.sampled_from(paths))
        _set(doc, path, _MARK, delete=how == "delete")
    text = json.dumps(doc).encode()
    return text.replace(json.dumps(_MARK).encode(), draw(raw_tokens), 1)


@st.composite
def byte_mutation(draw, original: bytes) -> bytes:
    """``original`` truncated, with bytes inserted, or with one byte changed."""
    how = draw(st.sampled_from(("truncate", "insert", "flip")))
    at = draw(st.integers(min_value=0, max_value=len(original)))
    if how == "truncate":
        return original[:at]
    if how == "insert":
        return original[:at] + draw(st.binary(min_size=1, max_size=8)) + original[at:]
    if at == len(original):
        at = max(0, at - 1)
    return original[:at] + bytes([draw(st.integers(0, 255))]) + original[at + 1:]


def damaged(original: bytes) -> st.SearchStrategy[bytes]:
    """Any damage to a JSON file: structured most of the time, byte-level otherwise."""
    return st.one_of(json_mutation(original), json_mutation(original), byte_mutation(original))


def strict_json(text: str) -> Any:
    """Parse as a strict JSON parser would (``Infinity``/``NaN`` are not JSON)."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"invalid JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


#: YAML scalars no setting can take (or that once raised a Python error instead of a config error).
NASTY_YAML_SCALARS: tuple[str, ...] = (
    "!!timestamp nope", "!!timestamp 2024-01-01", "2024-01-01", "2024-01-01 10:00:00", "!!binary aGVsbG8=",
    "!!set {a, b}", "!!omap [a: 1]", "!!pairs [a: 1]", "!!python/object:os.system ls", "!custom x", BIG,
    "-" + BIG, "1.0e+400", "-1.0e+400", ".nan", ".inf", "-.inf", "9223372036854775808", "0x7fffffffffffffffff",
    "0o777777777777777777777777", "1_000", "~", "null", "yes", "no", "on", "[" * 300 + "]" * 300,
    "{1: 2}", "{[a]: 1}", "{null: 1}", "&a 1", "*a", "<<: {}", "'\\ud800'", '"\\ud800"', '"\\x00"', "|\n  text",
    "[1, 2]", "{}", "''", "-1", "0", "1e3", "3.5",
)


@st.composite
def yaml_mutation(draw, original: str) -> str:
    """``original`` YAML text with one ``key: value`` line's value replaced by a nasty scalar, a key renamed
    to a non-string, a line dropped, or bytes of noise inserted."""
    lines = original.splitlines()
    candidates = [i for i, line in enumerate(lines) if ":" in line and not line.lstrip().startswith("#")]
    how = draw(st.sampled_from(("value", "value", "value", "key", "drop", "noise")))
    i = draw(st.sampled_from(candidates))
    key, _, _ = lines[i].partition(":")
    if how == "value":
        scalar = draw(st.one_of(st.sampled_from(NASTY_YAML_SCALARS), st.text(max_size=12)))
        lines[i] = f"{key}: {scalar}"
    elif how == "key":
        indent = key[: len(key) - len(key.lstrip())]
        lines[i] = f"{indent}{draw(st.sampled_from(('1', 'null', '[a]', '? [a, b]', '2024-01-01', '!!binary aGk=')))}:"\
                   f"{lines[i].partition(':')[2]}"
    elif how == "drop":
        del lines[i]
    else:
        text = "\n".join(lines)
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.text(max_size=6)) + text[at:]
    return "\n".join(lines) + "\n"
