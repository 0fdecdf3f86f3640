"""``NO_COLOR`` without a crash: Textual's monochrome filter, tolerant of segments that carry no style.

Under ``NO_COLOR`` Textual passes every line through its ``Monochrome`` filter, which reads each segment's
style; the margins of textual-plot's chart canvases yield bare segments (no style at all), and the filter
raised on them as soon as the Run screen drew its charts. :func:`tolerant_filters` swaps the app's filter for one
that gives such a segment the null style first (what it means: nothing to convert), so the Run screen draws
under ``NO_COLOR`` as it does in colour (docs/watch.md "Glyphs").
"""

from __future__ import annotations

from typing import Sequence

from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.filter import LineFilter, Monochrome

_NULL = Style.null()


class TolerantMonochrome(Monochrome):
    """:class:`textual.filter.Monochrome` that leaves a segment without a style as plain text."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        return super().apply([Segment(text, style or _NULL, control) for text, style, control in segments],
                             background)


def tolerant_filters(filters: Sequence[LineFilter]) -> list[LineFilter]:
    """The app's line filters with Textual's monochrome filter replaced by :class:`TolerantMonochrome`."""
    return [TolerantMonochrome(enabled=f.enabled) if type(f) is Monochrome else f for f in filters]
