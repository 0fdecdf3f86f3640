"""Validation backlog table: one row per checkpoint request."""

from __future__ import annotations

from rich.text import Text

from traceml_tui.tui import textplot
from traceml_tui.tui.glyphs import backlog_label
from traceml_tui.tui.snapshots import BacklogItem
from traceml_tui.tui.widgets.table_base import Col, FedTable

STATE_STYLE = {"pending": "yellow", "claimed": "green", "completed": "cyan", "failed": "red",
               "blocked": "bold red", "stale-claim": "bold white on red"}


def backlog_cells(i: BacklogItem) -> tuple:
    state = Text(backlog_label(i.state), style=STATE_STYLE.get(i.state, ""))
    beat = "–" if i.heartbeat_age_s is None else textplot.duration(i.heartbeat_age_s)
    if i.lease_s is not None and i.heartbeat_age_s is not None:
        beat += f"/{textplot.duration(i.lease_s)}"
    return (
        i.run, i.checkpoint, "–" if i.step is None else str(i.step), state, textplot.duration(i.age_s),
        i.owner or "–", Text(beat, style="bold red" if i.stuck else ""),
        Text(str(i.retries), style="red" if i.retries else "dim"), i.last_error or "",
    )


#: Widest the Run column gets; a longer name is cut in the middle, so its distinguishing end stays.
RUN_MAX = 28


class BacklogTable(FedTable):
    COLUMNS = ("Run", "Checkpoint", "Step", "State", "Age", "Owner", "Heartbeat", "Retries", "Last error")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fixed_columns = 2  # Run and Checkpoint stay in view when scrolling right to the error

    def layout(self, rows) -> tuple[Col, ...]:
        return tuple(Col(k, k, RUN_MAX if k == "Run" and any(len(str(c[0])) > RUN_MAX for _, c in rows) else None,
                         cut=k == "Run") for k in self.COLUMNS)
