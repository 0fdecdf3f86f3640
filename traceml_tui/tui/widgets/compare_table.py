"""Two runs side by side: field, reference, candidate, change.

Change carries the verdict, so it is never cut and never scrolled away: when
the four columns do not fit (80 columns: long field labels, run names,
declarations), Field, Reference and Candidate give up cells, the widest first,
their text cut in the middle (``has no gu…eclaration``). A number is never cut:
each column keeps at least the width of the widest number it holds.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from rich.text import Text

from traceml_tui.tui.widgets.table_base import PADDING, Col, FedTable, cell_width

COLUMNS = ("Field", "Reference", "Candidate", "Change")
#: The verdict-bearing column: always whole.
CHANGE = "Change"
#: Fewest cells Field keeps when the table is short of room (a label cut further reads as nothing).
FIELD_MIN = 12

#: A value as the comparison prints it: 4.34, 1.23k, 1e+06, +42.9%, 305.11 MiB, 12.5 ms.
NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?[kMG%]?( [A-Za-z%]+)?")


def compare_cells(row: tuple[str, str, str, str]) -> tuple:
    field, ref, cand, delta = row
    style = ""
    if delta.startswith("+") and delta != "+0.0%":
        style = "red"
    elif delta.startswith("-"):
        style = "green"
    return (field, ref, cand, Text(delta, style=style))


def is_number(cell: Any) -> bool:
    """Whether a cell shows a number (with its unit), which must never be cut."""
    return NUMBER.fullmatch(str(getattr(cell, "plain", cell)).strip()) is not None


def fit_widths(want: dict[str, int], least: dict[str, int], room: int) -> dict[str, int]:
    """Content widths for ``want`` in ``room`` cells: Change whole, the others cut widest first, none below
    ``least`` (then the table scrolls: nothing narrower is readable)."""
    if sum(want.values()) <= room:
        return dict(want)
    shared = [k for k in want if k != CHANGE]
    rest = room - want[CHANGE]

    def capped(cap: int) -> dict[str, int]:
        return {k: min(want[k], max(cap, least[k])) for k in shared}

    cap = max(want[k] for k in shared)
    while cap > 0 and sum(capped(cap).values()) > rest:
        cap -= 1
    return {**capped(cap), CHANGE: want[CHANGE]}


class CompareTable(FedTable):
    COLUMNS = COLUMNS

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("zebra_stripes", True)
        super().__init__(**kwargs)

    def layout(self, rows: Sequence[tuple[Any, tuple]]) -> tuple[Col, ...]:
        want = {label: len(label) for label in COLUMNS}
        least = {label: len(label) for label in COLUMNS}
        least["Field"] = FIELD_MIN
        for _, cells in rows:
            for label, cell in zip(COLUMNS, cells):
                width = cell_width(cell)
                want[label] = max(want[label], width)
                if is_number(cell):
                    least[label] = max(least[label], width)
        least = {k: min(v, want[k]) for k, v in least.items()}
        widths = fit_widths(want, least, self.available_width(len(rows)) - PADDING * len(COLUMNS))
        return tuple(Col(label, label, widths[label], cut="middle" if label != CHANGE else "") for label in COLUMNS)
