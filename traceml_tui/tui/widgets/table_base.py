"""A DataTable fed through a reactive: ``table_rows`` = tuple of (key, cells), updated in place.

A refresh never clears the table: rows are matched by key, changed cells are
rewritten, gone rows removed, new rows added and the order re-applied, so the
cursor (on its key), the vertical and the horizontal scroll survive a live
run's refreshes (docs/watch.md "Tables"). The columns shown are chosen by the
subclass from the width it has (:meth:`FedTable.layout`); only a change of
that choice rebuilds the columns, and the view is restored afterwards.

Scrolled sideways, a column that is only partly in view is drawn blank, header
and cells: a clipped number reads as another number (``3.89`` cut to ``89``),
so only whole columns are shown. The arrow keys scroll by whole columns.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from rich.cells import cell_len as rich_cell_len
from rich.segment import Segment
from rich.text import Text
from textual import events
from textual.coordinate import Coordinate
from textual.reactive import reactive
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from traceml_tui.core.rundir import middle_cut, tail_cut
from traceml_tui.tui.keys import list_bindings

#: Columns a vertical scrollbar may take from the table's width.
SCROLLBAR = 2
#: A DataTable cell's padding, both sides together (cells a column takes beyond its width).
PADDING = 2


class Col(NamedTuple):
    """One shown column: its key (the label in ``COLUMNS``), the header text, its width (None: fit content).

    ``cut``: how text longer than the width is cut: ``"middle"`` (:func:`middle_cut`: a name, both ends read),
    ``"end"`` (:func:`tail_cut`: a message, its start reads); ``""``: never (the column's width fits it).
    """

    key: str
    label: str
    width: int | None
    cut: str = ""


def cell_width(cell: Any) -> int:
    """Cells a cell's text takes (str or rich Text; one line)."""
    text = cell if isinstance(cell, str) else getattr(cell, "plain", None)
    if text is None:
        text = str(cell)
    return len(text) if text.isascii() else rich_cell_len(text)  # ASCII: one cell a character (most cells)


def partial_spans(widths: Sequence[int], scroll_x: int, view: int) -> list[tuple[int, int]]:
    """Where the columns only partly in view are, in view cells [start, end), scrolled ``scroll_x`` cells.

    ``widths``: the scrolling columns' widths, left to right; ``view``: the cells they are shown in. A column
    wider than the view is left out: it can never be shown whole, and clipped beats never.
    """
    spans = []
    left = -scroll_x
    for width in widths:
        right = left + width
        if left < view and right > 0 and (left < 0 or right > view) and width <= view:
            spans.append((max(left, 0), min(right, view)))
        left = right
    return spans


def blank_span(strip: Strip, start: int, end: int) -> Strip:
    """``strip`` with cells [start, end) turned to spaces in their own style (a cursor row stays highlighted)."""
    blank = [Segment(" " * seg.cell_length, seg.style) for seg in strip.crop(start, end) if not seg.control]
    return Strip.join([strip.crop(0, start), Strip(blank), strip.crop(end)])


def same_cell(a: Any, b: Any) -> bool:
    """Whether two cells show the same: text and style (rich Text's ``==`` compares the text and spans only)."""
    return a == b and getattr(a, "style", None) == getattr(b, "style", None)


class FedTable(DataTable):
    """Subclasses set ``COLUMNS`` (labels, also the column keys); the owner assigns ``table_rows``.

    ``table_rows`` cells are in ``COLUMNS`` order; :meth:`layout` picks which
    columns are shown, in which order and how wide.
    """

    # j/k/g/G and Home/End move the row cursor in every table (tui/keys.py). Enter stays DataTable's own
    # (select_cursor: the owner handles RowSelected); a table whose Enter opens something binds it again with a
    # footer word (RunsTable: "Open"), else DataTable's hidden binding shadows the screen's and hides it.
    BINDINGS = list_bindings()

    COLUMNS: tuple[str, ...] = ()
    #: Fixed widths for columns whose text changes length between refreshes (auto width would cut it meanwhile).
    WIDTHS: dict[str, int] = {}

    # Always: rich Text compares equal when only its style differs, and a new style must still be shown.
    # repaint=False: the in-place update repaints only the cells that changed (:meth:`_set_cell`).
    table_rows: reactive[tuple] = reactive((), always_update=True, repaint=False)

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cursor_type", "row")
        kwargs.setdefault("zebra_stripes", True)
        super().__init__(**kwargs)
        self._layout: tuple[Col, ...] = ()
        self._index = {label: i for i, label in enumerate(self.COLUMNS)}

    # -- the list keys (tui/keys.py)
    def action_cursor_first(self) -> None:
        """``g`` / Home: the first row (the view scrolls to it)."""
        if self.row_count:
            self.move_cursor(row=0, animate=False)

    def action_cursor_last(self) -> None:
        """``G`` / End: the last row."""
        if self.row_count:
            self.move_cursor(row=self.row_count - 1, animate=False)

    # -- what to show (subclasses override layout)
    def available_width(self, rows: int = 0) -> int:
        """Cells the table may fill (its own width once laid out, else the screen's).

        Less a vertical scrollbar when ``rows`` (and the header) are more than its height.
        """
        width = self.size.width or (self.parent.size.width if self.parent is not None else 0) or self.app.size.width
        height = self.size.height
        bar = SCROLLBAR if not height or rows + 1 > height else 0
        return max(20, width - bar)

    def layout(self, rows: Sequence[tuple[Any, tuple]]) -> tuple[Col, ...]:
        """The columns to show for ``rows`` at :meth:`available_width`: by default all, with ``WIDTHS``."""
        return tuple(Col(label, label, self.WIDTHS.get(label)) for label in self.COLUMNS)

    # -- lifecycle
    def on_mount(self) -> None:
        self._fill(self.table_rows)

    def watch_table_rows(self, rows: tuple) -> None:
        if self.is_mounted:
            self._fill(rows)

    def on_resize(self, event: events.Resize) -> None:
        # A new width may change which columns fit.
        self._fill(self.table_rows)

    # -- whole columns only (see the module's docstring)
    def _scroll_widths(self) -> list[int]:
        return [column.get_render_width(self) for column in self.ordered_columns[self.fixed_columns:]]

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        pinned = self._get_fixed_offset().left  # cells of the pinned columns, where the scrolling ones start
        view = self.size.width - pinned
        if view <= 0:
            return strip
        for start, end in partial_spans(self._scroll_widths(), self.scroll_offset.x, view):
            strip = blank_span(strip, pinned + start, pinned + end)
        return strip

    def column_stops(self) -> list[int]:
        """The horizontal scroll positions where a scrolling column starts at the left edge, and the last one."""
        stops, x = [], 0
        for width in self._scroll_widths():
            if x >= self.max_scroll_x:
                break
            stops.append(x)
            x += width
        return stops + [self.max_scroll_x]

    def action_cursor_right(self) -> None:
        if self.cursor_type in ("cell", "column"):
            super().action_cursor_right()
            return
        # A row cursor scrolls: by a whole column, so the one beside the pinned columns is never cut.
        x = self.scroll_offset.x
        self.scroll_to(x=next((s for s in self.column_stops() if s > x), self.max_scroll_x), animate=False)

    def action_cursor_left(self) -> None:
        if self.cursor_type in ("cell", "column"):
            super().action_cursor_left()
            return
        x = self.scroll_offset.x
        self.scroll_to(x=max((s for s in self.column_stops() if s < x), default=0), animate=False)

    # -- the in-place update
    def _fill(self, rows: tuple) -> None:
        layout = self.layout(rows)
        if tuple(c.key for c in layout) != tuple(c.key for c in self._layout):
            self._rebuild(layout, rows)
            return
        if layout != self._layout:
            self._relabel(layout)
        self._update_rows(rows)

    def _cells(self, cells: tuple) -> tuple:
        out = []
        for col in self._layout:
            cell = cells[self._index[col.key]]
            if col.cut and col.width is not None and cell_width(cell) > col.width:
                plain = getattr(cell, "plain", None)
                cut = tail_cut if col.cut == "end" else middle_cut
                cell = cut(str(cell), col.width) if plain is None else Text(cut(plain, col.width), style=cell.style)
            out.append(cell)
        return tuple(out)

    def show(self, rows: tuple) -> None:
        """Show ``rows`` (laid out again even when unchanged: the owner may have changed an option)."""
        self.table_rows = rows

    def _rebuild(self, layout: tuple[Col, ...], rows: tuple) -> None:
        """New columns: rebuild the table, then put the cursor and the scroll back."""
        key = self.selected_key()
        scroll = (self.scroll_x, self.scroll_y)
        self.clear(columns=True)
        self._layout = layout
        for col in layout:
            self.add_column(col.label, key=col.key, width=col.width)
        target = 0
        for i, (row_key, cells) in enumerate(rows):
            self.add_row(*self._cells(cells), key=str(row_key))
            if str(row_key) == key:
                target = i
        if rows:
            self.move_cursor(row=target, animate=False, scroll=False)
        self.call_after_refresh(self.scroll_to, *scroll, animate=False)

    def _relabel(self, layout: tuple[Col, ...]) -> None:
        """Same columns, new header text or width (a sort marker, a longer name): change them where they are."""
        for col in layout:
            column = self.columns[col.key]  # type: ignore[index]
            column.label = Text(col.label)
            if col.width is None:
                column.auto_width = True
                column.content_width = max(column.content_width, column.label.cell_len)
            else:
                column.auto_width = False
                column.width = col.width
        self._layout = layout
        self._require_update_dimensions = True
        self._clear_caches()
        self.refresh(layout=True)

    def _update_rows(self, rows: tuple) -> None:
        """Rewrite changed cells, remove gone rows, add new ones, apply the order; the cursor stays on its key."""
        key = self.selected_key()
        # Where the cursor's row is on screen: it stays there when rows come, go or move above it.
        on_screen = self.cursor_row - int(self.scroll_y) if key is not None else None
        keys = [str(k) for k, _ in rows]
        wanted = set(keys)
        for old in [k.value for k in self.rows if k.value not in wanted]:
            self.remove_row(old)
        order_changed = False
        column_keys = [c.key for c in self._layout]
        for row_key, cells in rows:
            row_key = str(row_key)
            shown = self._cells(cells)
            if RowKey(row_key) not in self.rows:
                self.add_row(*shown, key=row_key)
                order_changed = True
                continue
            current = self._data[RowKey(row_key)]
            for column_key, value in zip(column_keys, shown):
                if not same_cell(current.get(column_key), value):  # type: ignore[call-overload]
                    self._set_cell(row_key, column_key, value)
                    column = self.columns[column_key]  # type: ignore[index]
                    if column.auto_width and cell_width(value) > column.content_width:
                        # A longer text widens its column (as a new row does); measuring only what changed
                        # keeps a refresh linear (update_cell(update_width=True) re-measures whole columns).
                        column.content_width = cell_width(value)
                        self._require_update_dimensions = True
                        self.refresh()  # the columns move: every row is drawn again
        if order_changed or [k.value for k in self._ordered_keys()] != keys:
            self._reorder(keys)
        if keys:
            target = keys.index(key) if key in wanted else min(self.cursor_row, len(keys) - 1)
            if target != self.cursor_row:
                if on_screen is not None and 0 <= on_screen < self.scrollable_content_region.height:
                    self.scroll_to(y=max(0, target - on_screen), animate=False, immediate=True)
                self.move_cursor(row=target, animate=False, scroll=False)

    def _set_cell(self, row_key: str, column_key: str, value: Any) -> None:
        """Change one cell and repaint only it (DataTable.update_cell repaints the whole table).

        Over SSH every repainted cell is bytes on the wire: a live run changes a few cells a second, and a
        whole-table repaint would send the entire table each time (docs/watch.md "Cheap over SSH").
        """
        key, column = RowKey(row_key), ColumnKey(column_key)
        self._data[key][column] = value
        self._update_count += 1  # the render caches are keyed by it: the changed cell is rendered anew
        row, col = self._row_locations.get(key), self._column_locations.get(column)
        if row is None or col is None:
            self.refresh()
        elif col < self.fixed_columns and self.scroll_offset.x:
            # A pinned column's cell is not where DataTable's region maths puts it once scrolled sideways.
            self.refresh_row(row)
        else:
            self.refresh_coordinate(Coordinate(row, col))

    def _ordered_keys(self) -> list[RowKey]:
        return [row.key for row in self.ordered_rows]

    def _reorder(self, keys: list[str]) -> None:
        # DataTable.sort() sorts by cell values only; rows here are ordered by their owner (by key), so set the
        # row positions as sort() itself does.
        position = {k: i for i, k in enumerate(keys)}
        locations = type(self._row_locations)({RowKey(k): position[k] for k in keys})
        self._row_locations = locations
        self._update_count += 1
        self._clear_caches()
        self.refresh()

    def selected_key(self) -> str | None:
        """Key of the row under the cursor (None when empty)."""
        if not self.row_count or not 0 <= self.cursor_row < self.row_count:
            return None
        return self.coordinate_to_cell_key((self.cursor_row, 0)).row_key.value
