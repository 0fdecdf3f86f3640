"""The Runs screen's sort picker (`O`): every column in a list, Enter sorts by it, Esc leaves the order as it is.

``s`` steps through the columns one press at a time (fourteen presses to the
last); the picker reaches any column in one step (docs/watch.md "Keys").
"""

from __future__ import annotations

from typing import Optional, Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from traceml_tui.tui.keys import list_bindings


class SortList(OptionList):
    """The columns; j/k/g/G and Home/End move as in every list."""

    BINDINGS = list_bindings(first="first", last="last")


class SortPicker(ModalScreen[Optional[str]]):
    """Dismissed with the chosen column's label, or None (Esc, q)."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("q", "cancel", "Cancel", show=False),
    ]

    def __init__(self, labels: Sequence[str], current: Optional[str], descending: bool) -> None:
        super().__init__()
        self.labels = tuple(labels)
        self.current = current
        self.descending = descending

    def compose(self) -> ComposeResult:
        with Vertical(id="sort-picker"):
            now = "latest activity (the default)" if self.current is None else \
                f"{self.current} {'▼' if self.descending else '▲'}"
            yield Static(f"Sort runs by (now: {now}) — Enter sorts, the sorted column again reverses, Esc cancels")
            yield SortList(*(Option(label, id=label) for label in self.labels), id="sort-options")

    def on_mount(self) -> None:
        options = self.query_one(SortList)
        options.highlighted = self.labels.index(self.current) if self.current in self.labels else 0
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
