"""Two runs side by side: field, reference, candidate, change."""

from __future__ import annotations

from rich.text import Text

from traceml_tui.tui.widgets.table_base import FedTable


def compare_cells(row: tuple[str, str, str, str]) -> tuple:
    field, ref, cand, delta = row
    style = ""
    if delta.startswith("+") and delta != "+0.0%":
        style = "red"
    elif delta.startswith("-"):
        style = "green"
    return (field, ref, cand, Text(delta, style=style))


class CompareTable(FedTable):
    COLUMNS = ("Field", "Reference", "Candidate", "Change")

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("zebra_stripes", True)
        super().__init__(**kwargs)
