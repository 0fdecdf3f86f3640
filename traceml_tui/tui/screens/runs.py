"""Runs screen: every run, one row each; filter as you type, sort by any column."""

from __future__ import annotations

from typing import Optional

from textual.app import ComposeResult
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from traceml_tui.tui.snapshots import ATTENTION_WORDS, RunsSnapshot
from traceml_tui.tui.widgets.runs_table import COLUMNS, RunsTable, run_cells


def filter_rows(rows, text: str):
    """Rows whose name, workload or status contain every word of ``text`` (case-insensitive)."""
    words = text.lower().split()
    if not words:
        return list(rows)
    out = []
    for r in rows:
        hay = f"{r.name} {r.workload or ''} {r.status}".lower()
        if all(w in hay for w in words):
            out.append(r)
    return out


class RunsScreen(Screen):
    """All runs in the index."""

    BINDINGS = [
        Binding("enter", "open_run", "Open", show=True),
        Binding("slash", "focus_filter", "Filter"),
        Binding("s", "next_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse", show=False),
        Binding("b", "backlog", "Backlog"),
        Binding("m", "mark", "Mark ref"),
        Binding("c", "compare", "Compare"),
        Binding("escape", "clear_filter", "Clear", show=False),
    ]

    snapshot: reactive[Optional[RunsSnapshot]] = reactive(None)
    sort_column: reactive[int] = reactive(-1)  # -1: newest activity first (the source's order)
    sort_reverse: reactive[bool] = reactive(False)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Input(placeholder="filter runs (name, workload, status) — press / to focus", id="filter")
        yield Static("", id="runs-empty")
        yield RunsTable(id="runs")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "traceml watch"
        self.sub_title = "runs"
        self.query_one(RunsTable).focus()

    def watch_snapshot(self) -> None:
        self._redraw()

    def watch_sort_column(self) -> None:
        self._redraw()

    def watch_sort_reverse(self) -> None:
        self._redraw()

    def on_input_changed(self, event: Input.Changed) -> None:
        self._redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(RunsTable).focus()

    def _redraw(self) -> None:
        if not self.is_mounted:
            return
        snap = self.snapshot
        table = self.query_one(RunsTable)
        empty = self.query_one("#runs-empty", Static)
        rows = filter_rows(snap.rows if snap else (), self.query_one("#filter", Input).value)
        if self.sort_column >= 0:
            key = COLUMNS[self.sort_column][1]
            rows.sort(key=key, reverse=self.sort_reverse)
        table.table_rows = tuple((r.run_id, run_cells(r)) for r in rows)
        if snap is None:
            empty.update("loading…")
        elif not snap.rows:
            empty.update(f"No runs yet — {snap.note or 'start one with `traceml run`'}")
        elif not rows:
            empty.update("No run matches the filter.")
        else:
            n = len(snap.rows)
            failing = sum(1 for r in snap.rows if r.status in ATTENTION_WORDS)
            order = COLUMNS[self.sort_column][0] if self.sort_column >= 0 else "latest activity"
            empty.update(f"{len(rows)}/{n} runs · {failing} need attention · sorted by {order}"
                         f"{' ↓' if self.sort_reverse else ''}")

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        if event.column_index == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column = event.column_index

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_run()

    def action_open_run(self) -> None:
        key = self.query_one(RunsTable).selected_key()
        if key is not None:
            self.app.open_run(int(key))

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_clear_filter(self) -> None:
        self.query_one("#filter", Input).value = ""
        self.query_one(RunsTable).focus()

    def action_next_sort(self) -> None:
        self.sort_column = (self.sort_column + 1) % len(COLUMNS)

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse

    def _selected_name(self) -> Optional[str]:
        key = self.query_one(RunsTable).selected_key()
        if key is None or self.snapshot is None:
            return None
        return next((r.name for r in self.snapshot.rows if str(r.run_id) == key), None)

    def action_mark(self) -> None:
        """Remember the run under the cursor as the reference of the next comparison."""
        self.marked = self._selected_name()
        if self.marked:
            self.notify(f"reference: {self.marked} — move to the candidate and press c", timeout=4)

    def action_compare(self) -> None:
        candidate = self._selected_name()
        if not getattr(self, "marked", None) or candidate is None:
            self.notify("mark a reference run with m first", severity="warning", timeout=4)
            return
        self.app.open_compare(self.marked, candidate)

    def action_backlog(self) -> None:
        self.app.open_backlog(None)
