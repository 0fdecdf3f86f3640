"""The Log screen's line view: labelled log lines, a current line, search highlights, follow (Line API).

Only the lines on screen are rendered (``render_line``), so a log of a
hundred thousand lines scrolls as fast as a short one. Each line shows its
node, rank and stream (``n0 r1 err``) before its text; error lines (a
traceback's first line and its exception) are bold red, the current line
(the first error when the view opens, then the search match) carries ``▶``,
and the search text is shown reversed. Both read without colour.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from traceml_tui.tui.keys import list_bindings
from traceml_tui.tui.logtail import LogLine

#: Width of the label column: "▶n0  r12 err " (the marker, node, rank, stream).
LABEL_CELLS = 13


def line_label(line: LogLine) -> str:
    """``n0  r1  err`` — where a line comes from (``--`` for a line no rank wrote)."""
    rank = "--" if line.rank is None else f"r{line.rank}"
    return f"n{line.node:<3}{rank:<4}{line.stream[3:]} "


class LogView(ScrollView, can_focus=True):
    """Log lines with a current line; fed by the Log screen (:meth:`show`, :meth:`append`)."""

    # j/k move the current line, g/Home and G/End go to the first and last (tui/keys.py).
    BINDINGS = list_bindings()

    class CursorMoved(Message):
        """A key moved the current line (the screen's status line says where it is)."""

    DEFAULT_CSS = """
    LogView { background: $surface; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lines: list[LogLine] = []
        self.cursor: Optional[int] = None
        self.follow = False
        self._pattern: Optional[re.Pattern] = None
        self._width = 0

    # -- feeding
    def show(self, lines: Sequence[LogLine]) -> None:
        """Replace every line (a new filter); the current line is cleared."""
        self.lines = list(lines)
        self.cursor = None
        self._width = max((self._cells(ln.text) for ln in self.lines), default=0)
        self._resize()

    def append(self, lines: Sequence[LogLine]) -> None:
        """Add lines at the end; in follow mode the view moves to the newest line."""
        if not lines:
            return
        self.lines.extend(lines)
        self._width = max(self._width, max(self._cells(ln.text) for ln in lines))
        self._resize()
        if self.follow:
            self.call_after_refresh(self.scroll_end, animate=False)

    def _resize(self) -> None:
        self.virtual_size = Size(LABEL_CELLS + self._width, len(self.lines))
        self.refresh()

    @staticmethod
    def _cells(text: str) -> int:
        return len(text) if text.isascii() else cell_len(text)

    # -- the current line and search
    def move_to(self, index: Optional[int]) -> None:
        """Make ``index`` the current line and scroll it into view (a third down the screen)."""
        self.cursor = index
        if index is not None:
            top = max(0, index - max(0, self.size.height // 3))
            self.scroll_to(y=top, animate=False)
        self.refresh()

    def set_search(self, text: str) -> None:
        self._pattern = re.compile(re.escape(text), re.IGNORECASE) if text else None
        self.refresh()

    def find(self, start: int, forward: bool = True) -> Optional[int]:
        """The index of the next line (from ``start``, wrapping) whose label or text matches the search."""
        if self._pattern is None or not self.lines:
            return None
        n = len(self.lines)
        for k in range(n):
            i = (start + k) % n if forward else (start - k) % n
            if self._pattern.search(self.lines[i].text):
                return i
        return None

    # -- the list keys: they move the current line and stop following
    def _key_move(self, index: int) -> None:
        if not self.lines:
            return
        self.follow = False
        self.cursor = max(0, min(len(self.lines) - 1, index))
        self.scroll_to_region(Region(0, self.cursor, 1, 1), animate=False, immediate=True)
        self.refresh()
        self.post_message(self.CursorMoved())

    def action_cursor_down(self) -> None:
        """``j``: the next line (the first one on screen when none is current)."""
        self._key_move(int(self.scroll_y) if self.cursor is None else self.cursor + 1)

    def action_cursor_up(self) -> None:
        """``k``: the line before."""
        self._key_move(int(self.scroll_y) if self.cursor is None else self.cursor - 1)

    def action_cursor_first(self) -> None:
        """``g`` / Home: the first line."""
        self._key_move(0)

    def action_cursor_last(self) -> None:
        """``G`` / End: the last line."""
        self._key_move(len(self.lines) - 1)

    # -- drawing
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        base = self.rich_style
        if index >= len(self.lines):
            return Strip.blank(width, base)
        line = self.lines[index]
        current = index == self.cursor
        label_style = "bold" if current else ("yellow" if line.stream == "stderr" else "dim")
        text = Text.assemble(("▶" if current else " ", "bold"), (line_label(line), label_style),
                             (line.text, "bold red" if line.error else ""), no_wrap=True, end="")
        if self._pattern is not None:
            text.highlight_regex(self._pattern, style="reverse")
        if current:
            text.stylize("bold")
        segments = list(text.render(self.app.console))
        strip = Strip(segments).crop(scroll_x, scroll_x + width)
        return strip.extend_cell_length(width, base).apply_style(base)

    def render_lines_text(self) -> list[str]:
        """The lines as shown (label and text), for tests and copy-out."""
        return [line_label(ln) + ln.text for ln in self.lines]

