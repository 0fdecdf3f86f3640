"""Backlog table: one row per checkpoint request (validation, and heavy QC beside it: docs/qc.md)."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding

from traceml_tui.core.state import BacklogState
from traceml_tui.tui import textplot
from traceml_tui.tui.glyphs import backlog_label
from traceml_tui.tui.snapshots import BacklogItem
from traceml_tui.tui.widgets.table_base import PADDING, Col, FedTable, cell_width

STATE_STYLE = {BacklogState.PENDING: "yellow", BacklogState.CLAIMED: "green", BacklogState.COMPLETED: "cyan",
               BacklogState.FAILED: "red", BacklogState.BLOCKED: "bold red",
               BacklogState.STALE_CLAIM: "bold white on red"}


def metric_names(items) -> tuple[str, ...]:
    """The metric columns: every metric a completed request's receipt reports, by name (at most MAX_METRICS)."""
    return tuple(sorted({name for i in items for name, _ in i.metrics}))[:MAX_METRICS]


def metric_cells(i: BacklogItem, names: tuple[str, ...]) -> tuple:
    """A request's receipt metrics in ``names`` order (– where it reports none: not completed, or not that one)."""
    values = dict(i.metrics)
    out = []
    for name in names:
        v = values.get(name)
        out.append(textplot.fmt_num(v, 4) if isinstance(v, (int, float)) and not isinstance(v, bool)
                   else ("–" if v is None else str(v)))
    return tuple(out)


def backlog_cells(i: BacklogItem, names: tuple[str, ...] = (), kinds: bool = False) -> tuple:
    """A request's cells in ``BacklogTable.COLUMNS`` order (with ``kinds``, its backlog — validation or QC — after
    the checkpoint, :data:`KIND_COLUMN`), then its metrics in ``names`` order."""
    state = Text(backlog_label(i.state), style=STATE_STYLE.get(i.state, ""))
    beat = "–" if i.heartbeat_age_s is None else textplot.duration(i.heartbeat_age_s)
    if i.lease_s is not None and i.heartbeat_age_s is not None:
        beat += f"/{textplot.duration(i.lease_s)}"
    kind = (Text(KIND_LABEL.get(i.kind, i.kind), style="magenta" if i.kind == "qc" else "dim"),) if kinds else ()
    return (
        i.run, i.checkpoint, *kind, "–" if i.step is None else str(i.step), state, textplot.duration(i.age_s),
        i.owner or "–", Text(beat, style="bold red" if i.stuck else ""),
        Text(str(i.retries), style="red" if i.retries else "dim"), i.last_error or "",
        *metric_cells(i, names),
    )


#: The Kind column, shown after Checkpoint when a run's heavy QC backlog is beside its validation (docs/qc.md).
KIND_COLUMN = "Kind"
#: What the Kind column says for each backlog.
KIND_LABEL = {"validation": "val", "qc": "QC"}
#: Widest the Run column gets; a longer name is cut in the middle, so its distinguishing end stays.
RUN_MAX = 28
#: At most this many metric columns (a receipt with more shows them all in the request's detail, Enter).
MAX_METRICS = 4
#: Narrowest the Last error column gets when it is cut to the room left (scrolled to, it shows this much).
ERROR_MIN = 24


class BacklogTable(FedTable):
    """Requests, with one column per receipt metric after State (``metrics``: their names, set by the owner
    before ``table_rows``; the cells carry the values after ``COLUMNS``)."""

    BINDINGS = [Binding("enter", "select_cursor", "Detail")]  # shown in the footer (table_base.py)

    COLUMNS = ("Run", "Checkpoint", "Step", "State", "Age", "Owner", "Heartbeat", "Retries", "Last error")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fixed_columns = 2  # Run and Checkpoint stay in view when scrolling right to the error
        self.metrics: tuple[str, ...] = ()
        self.kinds = False  # the Kind column (set by the owner before ``table_rows``, as ``metrics``)

    def shown_columns(self) -> tuple[str, ...]:
        """The fixed columns shown: :attr:`COLUMNS`, with :data:`KIND_COLUMN` after Checkpoint when ``kinds``."""
        if not self.kinds:
            return self.COLUMNS
        at = self.COLUMNS.index("Checkpoint") + 1
        return (*self.COLUMNS[:at], KIND_COLUMN, *self.COLUMNS[at:])

    def layout(self, rows) -> tuple[Col, ...]:
        keys = [f"metric:{m}" for m in self.metrics]
        columns = self.shown_columns()
        self._index = {k: n for n, k in enumerate((*columns, *keys))}
        cols = [Col(k, k, RUN_MAX if k == "Run" and any(len(str(c[0])) > RUN_MAX for _, c in rows) else None,
                    cut="middle" if k == "Run" else "") for k in columns]
        at = columns.index("State") + 1  # the values next to the state: what a completed request found
        cols[at:at] = [Col(k, m, None) for k, m in zip(keys, self.metrics)]
        return tuple(cols[:-1]) + (self._error_column(cols, rows),)

    def _error_column(self, cols: list[Col], rows) -> Col:
        """Last error, its end cut to the room the other columns leave: the start of the error shows
        without scrolling, where a column running past the edge would be blank (table_base: whole columns only).
        The whole text is in the request's detail (Enter)."""
        last = cols[-1]
        want = max((cell_width(c[self._index[last.key]]) for _, c in rows), default=0)
        if want <= cell_width(last.label):
            return last
        others = 0
        for col in cols[:-1]:
            width = col.width if col.width is not None else max(
                [cell_width(col.label)] + [cell_width(c[self._index[col.key]]) for _, c in rows])
            others += width + PADDING
        room = max(ERROR_MIN, cell_width(last.label), self.available_width(len(rows)) - others - PADDING)
        return last if want <= room else Col(last.key, last.label, room, cut="end")
