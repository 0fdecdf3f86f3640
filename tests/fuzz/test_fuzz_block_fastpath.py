"""The block fast path stores exactly what line-by-line decoding stores, line for line (docs/daemon.md,
"Damaged input"): same records, same byte offsets, same error rows — on blocks of real lines damaged.

``daemon.decode.parse_block`` (one msgspec call for the whole block, trusted when ``daemon.blockcheck``
proves it) against ``daemon.decode._parse_slow`` (each line decoded alone); and the live path's joined
decode of many files' appends (``prepare_blocks``) against each block on its own.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from streams import LINES, big_int_lines, damaged_lines, shifted_lines

from daemon import decode


def _block(lines: list[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n"


def _same_as_line_by_line(block: bytes, base: int) -> decode.Parsed:
    fast = decode.parse_block(block, base)
    slow = decode._parse_slow(block[:-1].split(b"\n"), base)
    assert fast.records == slow.records
    assert fast.offsets == slow.offsets
    assert fast.errors == slow.errors
    return fast


DAMAGED = st.one_of(damaged_lines(), shifted_lines(), big_int_lines())


@given(st.lists(DAMAGED, min_size=1, max_size=5), st.integers(0, 1 << 40))
def test_fast_path_equals_line_by_line(blocks, base):
    for lines in blocks:
        _same_as_line_by_line(_block(lines), base)


@given(st.lists(st.one_of(damaged_lines(max_lines=4), shifted_lines(max_lines=4), big_int_lines(max_lines=3)),
                min_size=2, max_size=6))
def test_joined_live_decode_equals_each_block_alone(blocks):
    """A live pass decodes the appends of many files together; each file gets what it alone would give."""
    pairs = [(_block(lines), 1000 * i) for i, lines in enumerate(blocks)]
    assert decode.prepare_blocks(pairs) == [decode.prepare_block(b, base) for b, base in pairs]


def test_clean_real_lines_take_the_fast_path():
    """The property above is not vacuous: undamaged real lines are decoded by the one-call path."""
    block = _block(LINES)
    assert decode.parse_block(block, 0)._offsets is None  # the fast path: offsets computed only when asked
    assert len(_same_as_line_by_line(block, 0).records) == len(LINES)
