"""When the block fast path may be trusted: it must store exactly what line-by-line decoding stores.

The fast path (:func:`daemon.decode.parse_block`) decodes a block of complete lines as one JSON array,
the newlines turned into commas. That is one C call for ~10k records, but it is only line-by-line decoding
if every array element is exactly one line. Counting elements is not enough: a torn line (``{… "x":[0``)
and its continuation (``0]}``) join into one element, and a line holding two records (``{…},{…}``)
gives the element back — the count matches, a valid line is lost and invalid ones are stored
(docs/daemon.md, "Damaged input"). Two checks make the fast result equal to the slow one, line for line:

* :func:`one_record_per_line` — proves every element is one line (the argument is in its docstring);
* :func:`ints_fit` — the same 64-bit rule as :func:`int_out_of_range`, which the slow path applies to
  each line, over every integer field of every record (a field the index never stores too: a line is
  refused or stored the same whatever its neighbours).

``tests/fuzz/test_fuzz_block_fastpath.py`` holds the fast path to the slow one on generated blocks.
"""

from __future__ import annotations

import operator
import re
import typing
from typing import Optional

import msgspec

from traceml_tui.core import bounds, records

INT_MIN, INT_MAX = bounds.INT64_MIN, bounds.INT64_MAX

# `}` and `{` around a comma, with JSON whitespace other than a newline between them: where two records
# of one array meet inside one line.
_TWO_ON_ONE_LINE = re.compile(rb"\}[ \t\r]*,[ \t\r]*\{")


def one_record_per_line(block: bytes) -> bool:
    """True when a block whose fast decode gave one record (a JSON object) per line holds each record
    within its own line; False when that is not proven (the caller decodes line by line).

    Why it is enough: the joined array ``[L1,L2,…,Ln]`` decoded into n objects, so it has n − 1
    separating commas, each with ``}`` before it and ``{`` after it and nothing but whitespace between.
    Whitespace there holds no newline (each one became a comma), so a separating comma that is not one of
    the n − 1 commas made from newlines sits with its ``}``, whitespace and ``{`` inside one line — the
    pattern searched for here. Without it, the n − 1 separators are exactly the n − 1 newlines: element
    i is line i (without surrounding whitespace), decoded by the same typed decoder as the slow path uses.
    A string that holds ``},{`` only costs that block the slow path.
    """
    return _TWO_ON_ONE_LINE.search(block) is None


def _int_field_names(struct: type) -> tuple[tuple[str, ...], tuple[tuple[str, type], ...]]:
    """The fields of ``struct`` that may hold an ``int``, and those that may hold another struct."""
    ints, nested = [], []
    hints = typing.get_type_hints(struct, include_extras=True)
    for name in struct.__struct_fields__:
        args = _flatten(hints[name])
        if int in args:
            ints.append(name)
        nested.extend((name, a) for a in args if isinstance(a, type) and issubclass(a, msgspec.Struct))
    return tuple(ints), tuple(nested)


def _flatten(tp) -> set:
    """Every type a field annotation names (Optional/Union/Annotated unwrapped; containers not entered:
    :func:`int_out_of_range` does not enter them either)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _flatten(typing.get_args(tp)[0])
    if origin is typing.Union:
        out = set()
        for a in typing.get_args(tp):
            out |= _flatten(a)
        return out
    return {tp}


def _getters(struct: type) -> tuple[list, list]:
    """Getters of ``struct``'s integer fields, and of its struct fields that hold integers somewhere."""
    ints, nested = _int_field_names(struct)
    inner = [(operator.attrgetter(n), t) for n, t in nested if any(_getters(t))]
    return [operator.attrgetter(n) for n in ints], inner


# A step record's integer fields, and those of the structs it holds (today: `mem`), read column-wise.
_STEP_INTS, _STEP_NESTED = _getters(records.LeanStep)
_NESTED_INTS = {t: _getters(t) for _, t in _STEP_NESTED}


def _fits(values) -> bool:
    """True when every non-None integer of ``values`` fits in 64 bits (C-level passes)."""
    vals = list(filter(None, values))  # drops None (and 0, which fits)
    return not vals or (max(vals) <= INT_MAX and min(vals) >= INT_MIN)


def _structs_fit(items: list, ints: list, nested: list) -> bool:
    if not all(_fits(map(get, items)) for get in ints):
        return False
    for get, tp in nested:
        inner = [x for x in map(get, items) if type(x) is tp]
        if inner and not _structs_fit(inner, *_NESTED_INTS.get(tp) or _getters(tp)):
            return False
    return True


def ints_fit(recs: list) -> bool:
    """True when no record holds an integer field outside 64 bits: :func:`int_out_of_range` of every record
    is None (step records checked column by column, the others one by one)."""
    LeanStep = records.LeanStep
    steps = recs if set(map(type, recs)) == {LeanStep} else [r for r in recs if type(r) is LeanStep]
    if len(steps) != len(recs) and any(int_out_of_range(r) for r in recs if type(r) is not LeanStep):
        return False
    return not steps or _structs_fit(steps, _STEP_INTS, _STEP_NESTED)


def int_out_of_range(rec, prefix: str = "") -> Optional[str]:
    """The first integer field of ``rec`` (nested structs too) outside 64 bits, or None."""
    for name in rec.__struct_fields__:
        value = getattr(rec, name)
        if type(value) is int:
            if not INT_MIN <= value <= INT_MAX:
                return prefix + name
        elif isinstance(value, msgspec.Struct):
            inner = int_out_of_range(value, f"{prefix}{name}.")
            if inner is not None:
                return inner
    return None
