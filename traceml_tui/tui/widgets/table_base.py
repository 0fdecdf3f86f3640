"""A DataTable fed through a reactive: ``table_rows`` = tuple of (key, cells); the cursor stays on its key."""

from __future__ import annotations

from typing import Any

from textual.reactive import reactive
from textual.widgets import DataTable


class FedTable(DataTable):
    """Subclasses set ``COLUMNS`` (labels); the owner assigns ``table_rows``."""

    COLUMNS: tuple[str, ...] = ()
    #: Fixed widths for columns whose text changes length between refreshes (auto width would cut it meanwhile).
    WIDTHS: dict[str, int] = {}

    table_rows: reactive[tuple] = reactive((), always_update=False)

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cursor_type", "row")
        kwargs.setdefault("zebra_stripes", True)
        super().__init__(**kwargs)

    def on_mount(self) -> None:
        for label in self.COLUMNS:
            self.add_column(label, key=label, width=self.WIDTHS.get(label))
        self._fill(self.table_rows)

    def watch_table_rows(self, rows: tuple) -> None:
        if self.columns:
            self._fill(rows)

    def _fill(self, rows: tuple) -> None:
        current = None
        if self.row_count and 0 <= self.cursor_row < self.row_count:
            try:
                current = self.coordinate_to_cell_key((self.cursor_row, 0)).row_key.value
            except Exception:  # the cursor may point past the old rows
                current = None
        self.clear()
        target = 0
        for i, (key, cells) in enumerate(rows):
            self.add_row(*cells, key=str(key))
            if str(key) == current:
                target = i
        if rows:
            self.move_cursor(row=target, animate=False)

    def selected_key(self) -> str | None:
        """Key of the row under the cursor (None when empty)."""
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key((self.cursor_row, 0)).row_key.value
