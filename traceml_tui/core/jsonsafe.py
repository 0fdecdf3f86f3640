"""Bounded JSON nesting for every reader of untrusted JSON.

A file holding ``{"x": [[[ … ]]]}`` a few thousand levels deep makes
``json.loads`` and ``msgspec.json.decode`` raise ``RecursionError`` (or, with
a raised recursion limit, crash the interpreter). Every artifact traceml
writes is at most a dozen levels deep, so readers refuse anything nested
deeper than :data:`MAX_DEPTH` *before* decoding, with one plain
:class:`NestingError` (a ``ValueError``):
``"JSON nested deeper than 64 levels"``.

API (stdlib only at import time; msgspec is imported on first use of
:func:`decode_bounded`, so importing this module keeps start-up cheap):

* :func:`nesting_depth` ``(data, limit=MAX_DEPTH) -> int`` — the deepest
  ``[``/``{`` nesting outside strings; stops early and returns ``limit + 1``
  once the depth is known to exceed ``limit`` (a value ``<= limit`` means
  within the bound).
* :func:`check_depth` ``(data, max_depth=MAX_DEPTH) -> None`` — raise
  :class:`NestingError` when nested deeper than ``max_depth``.
* :func:`loads_bounded` ``(data, *, max_depth=MAX_DEPTH, **json_loads_kwargs)`` —
  ``json.loads`` after the check (other ``ValueError``\\ s of ``json.loads``
  pass through unchanged; a ``RecursionError`` that still happens becomes a
  :class:`NestingError`).
* :func:`decode_bounded` ``(data, *, type=Any, max_depth=MAX_DEPTH, decoder=None)`` —
  ``msgspec.json.decode`` (or ``decoder.decode``) after the check; msgspec's
  own ``DecodeError``/``ValidationError`` pass through.

* :func:`unpaired_surrogate` ``(data) -> (escape, byte) | None`` — the first ``\\uD800``–``\\uDFFF``
  escape that is not half of a pair (JSON text that names no character): ``loads_bounded`` refuses it
  (and bytes that are not strict UTF-8), ``decode_bounded`` names it where msgspec would say
  "Input data was truncated"; :func:`surrogate_message` is the wording.
* :func:`dumps_valid` ``(value, **json_dumps_kwargs) -> str`` — JSON for ``--json`` outputs: a
  non-finite float becomes ``null`` (:func:`finite`), never ``Infinity``/``NaN``.

``data`` may be ``bytes``, ``bytearray``, ``memoryview`` or ``str``.

Cost of the check: a C-level ``translate`` keeping only brackets and quotes,
the strings (and escapes) dropped, then one C-level ``replace`` per nesting
level — about 20 µs for a typical 10–13 KB summary (``json.loads`` of it takes
about 100 µs), ~20 ms for a 24 MB document, ~0.5 s for 32 MiB of nothing but
brackets (``tests/test_jsonsafe.py`` bounds the typical case).
"""

from __future__ import annotations

from itertools import accumulate, chain, repeat
from operator import add, sub
from typing import Any, Optional, Union

#: Deepest nesting any reader accepts (our artifacts are at most about a dozen levels deep).
MAX_DEPTH = 64

Data = Union[bytes, bytearray, memoryview, str]

#: Bytes kept by the skeleton: brackets and quotes (``{}`` become ``[]``).
_KEEP = b'[]{}"'
_DROP = bytes(b for b in range(256) if b not in _KEEP)
_CURLY_TO_SQUARE = bytes.maketrans(b"{}", b"[]")


def _without_escapes(data: bytes) -> bytes:
    """``data`` without its backslash escapes (each backslash and the byte after it)."""
    if data.count(b"\\") > 64:
        import re  # only here: compiling a pattern at import would slow every command's start

        return re.sub(rb"\\.", b"", data, flags=re.DOTALL)
    pieces, start = [], 0
    while True:
        at = data.find(b"\\", start)
        if at < 0:
            pieces.append(data[start:])
            return b"".join(pieces)
        pieces.append(data[start:at])
        start = at + 2


class NestingError(ValueError):
    """JSON nested deeper than a reader accepts; ``str()`` is one plain sentence."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        super().__init__(f"JSON nested deeper than {max_depth} levels")


def nesting_depth(data: Data, limit: int = MAX_DEPTH) -> int:
    """The deepest ``[``/``{`` nesting of ``data`` outside strings, capped at ``limit + 1``.

    ``limit + 1`` means deeper than ``limit`` (the count stops there). A value
    ``<= limit`` means within the bound; it is the exact depth of well-formed
    JSON, except that input with at most ``limit`` openers returns their count
    without looking further. Malformed input gets an upper bound (an unclosed
    opener counts as open; brackets after an unterminated string count).
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    elif not isinstance(data, bytes):
        data = bytes(data)
    if b"\\" in data:  # escapes: drop each backslash with the byte it escapes
        data = _without_escapes(data)
    # The skeleton: brackets and quotes only (one C-level translate).
    skeleton = data.translate(_CURLY_TO_SQUARE, _DROP)
    openers = skeleton.count(b"[")
    if openers <= limit:
        return openers  # cannot be deeper than it has openers
    if b'"' in skeleton:
        # Drop the strings. Most hold no bracket: they are adjacent quote pairs, and when
        # removing those leaves no quote, no string held one. Otherwise split on quotes.
        unquoted = skeleton.replace(b'""', b"")
        skeleton = unquoted if b'"' not in unquoted else b"".join(skeleton.split(b'"')[::2])
    return _depth(skeleton, limit)


def _depth(skeleton: bytes, limit: int) -> int:
    """Deepest nesting of a skeleton of ``[``/``]`` only, capped at ``limit + 1``."""
    deep = b"[" * (limit + 1)
    # Each pass removes every innermost pair: a well-formed document empties after exactly
    # as many passes as it is deep (C-level, and fast while the passes shrink it a lot).
    depth = 0
    while skeleton:
        if deep in skeleton:
            return limit + 1
        reduced = skeleton.replace(b"[]", b"")
        removed = len(skeleton) - len(reduced)
        if removed == 0:
            return min(limit + 1, depth + reduced.count(b"["))  # unbalanced: an upper bound
        depth += 1
        if depth > limit:
            return limit + 1
        skeleton = reduced
        if removed * 4 < len(skeleton) and len(skeleton) > 4096:
            # A wide document of deep runs ("[[[…]]][[[…]]]…") shrinks slowly: walk its runs
            # instead. Split at each "][": every piece is openers then closers, so the depth
            # peaks after each piece's openers; all of it runs in C-level iterators.
            pieces = skeleton.split(b"][")
            opens = list(map(bytes.count, pieces, repeat(b"[")))
            level = chain((0,), accumulate(map(sub, opens, map(bytes.count, pieces, repeat(b"]")))))
            return min(limit + 1, depth + max(map(add, level, opens)))
    return depth


def unpaired_surrogate(data: Data) -> Optional[tuple[str, int]]:
    """The first ``\\uD800``–``\\uDFFF`` escape of ``data`` that is not half of a pair, and its byte offset.

    JSON text is Unicode; an unpaired surrogate escape names no character. msgspec refuses one
    with "Input data was truncated" (a high one) and ``json.loads`` returns a ``str`` that cannot
    be encoded again, so readers look for one to say what is wrong. None when there is none.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    elif not isinstance(data, bytes):
        data = bytes(data)
    if b"\\u" not in data and b"\\U" not in data:
        return None
    import re  # only here: compiling a pattern at import would slow every command's start

    pending: Optional[tuple[str, int, int]] = None  # a high surrogate waiting for its low half: text, at, end
    for match in re.finditer(rb"\\(?:u([0-9a-fA-F]{4})|.)", data, flags=re.DOTALL):
        code = int(match.group(1), 16) if match.group(1) else None
        if pending is not None:
            if code is not None and 0xDC00 <= code <= 0xDFFF and match.start() == pending[2]:
                pending = None
                continue
            return pending[0], pending[1]
        if code is not None and 0xD800 <= code <= 0xDBFF:
            pending = (match.group(0).decode("ascii"), match.start(), match.end())
        elif code is not None and 0xDC00 <= code <= 0xDFFF:
            return match.group(0).decode("ascii"), match.start()
    return (pending[0], pending[1]) if pending is not None else None


def surrogate_message(escape: str, at: int) -> str:
    """What a reader says of an unpaired surrogate escape (one home for the wording)."""
    return f"invalid JSON text: unpaired UTF-16 surrogate escape {escape} at byte {at} (not a Unicode character)"


def check_depth(data: Data, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`NestingError` when ``data`` is nested deeper than ``max_depth``."""
    if nesting_depth(data, max_depth) > max_depth:
        raise NestingError(max_depth)


def loads_bounded(data: Data, *, max_depth: int = MAX_DEPTH, **kwargs: Any) -> Any:
    """``json.loads(data, **kwargs)``, refusing nesting deeper than ``max_depth`` first.

    Raises :class:`NestingError` (a ``ValueError``) for deep input and whatever
    ``json.loads`` raises otherwise (``json.JSONDecodeError``, ``UnicodeDecodeError``
    — both ``ValueError``\\ s).
    """
    import json

    if isinstance(data, memoryview):
        data = bytes(data)
    check_depth(data, max_depth)
    if isinstance(data, (bytes, bytearray)):
        # Strict UTF-8: json.loads would decode bytes with "surrogatepass" and hand back text
        # that cannot be printed or stored (UnicodeDecodeError is a ValueError).
        data = bytes(data).decode("utf-8")
    found = unpaired_surrogate(data)
    if found is not None:
        raise ValueError(surrogate_message(*found))
    try:
        return json.loads(data, **kwargs)
    except RecursionError:  # a lowered interpreter recursion limit
        raise NestingError(max_depth) from None


def decode_bounded(data: Data, *, type: Any = Any, max_depth: int = MAX_DEPTH, decoder: Any = None) -> Any:  # noqa: A002
    """``msgspec.json.decode(data, type=type)`` (or ``decoder.decode(data)``), refusing deep nesting first.

    Raises :class:`NestingError` for deep input; msgspec's ``DecodeError`` and
    ``ValidationError`` pass through. msgspec is imported here, not at module import.
    """
    check_depth(data, max_depth)
    import msgspec

    try:
        if decoder is not None:
            return decoder.decode(data)
        return msgspec.json.decode(data, type=type)
    except RecursionError:
        raise NestingError(max_depth) from None
    except msgspec.DecodeError as exc:
        # msgspec says "Input data was truncated" of an unpaired high surrogate: say what it is.
        found = unpaired_surrogate(data)
        if found is None:
            raise
        raise msgspec.DecodeError(surrogate_message(*found)) from exc


def finite_number(value: Any) -> Optional[float]:
    """A decoded JSON value as a finite float; None for a bool, a non-number, NaN, ±inf, or an integer beyond a
    float's range (JSON has no bound: a 400-digit integer made ``math.isfinite`` raise and one summary stop
    every listing of the index, found by fuzzing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if number - number == 0.0 else None  # inf - inf and nan - nan are nan


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (``inf``, ``-inf``, ``nan``) in it replaced by None (JSON null).

    For ``--json`` outputs: ``json.dumps`` writes ``Infinity``/``NaN``, which no JSON parser accepts. A
    figure that overflowed (steps timed at 1e308 ms) is shown as unknown. Dicts, lists and tuples are
    copied; everything else is returned as it is.
    """
    if isinstance(value, float):
        return value if value - value == 0.0 else None  # inf - inf and nan - nan are nan
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps_valid(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` that always writes valid JSON: a non-finite float becomes null, never ``Infinity``/``NaN``.

    Every ``--json`` output goes through here (or an equivalent rule): a reader of
    that output must be able to parse it with any strict JSON parser.
    """
    import json

    return json.dumps(finite(value), allow_nan=False, **kwargs)


__all__ = ["MAX_DEPTH", "NestingError", "check_depth", "decode_bounded", "loads_bounded", "nesting_depth",
           "surrogate_message", "unpaired_surrogate", "finite", "dumps_valid"]
