"""Runs screen: every run, one row each; filter as you type, sort by any column, mark a reference to compare."""

from __future__ import annotations

from typing import Optional

from textual.app import ComposeResult
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from traceml_tui.tui.messages import OpenBacklog, OpenCompare, OpenDescribe, OpenLogs, OpenRun
from traceml_tui.tui.screens.sort_picker import SortPicker
from traceml_tui.tui.snapshots import RunRow, RunsSnapshot
from traceml_tui.tui.widgets.runs_table import COLUMNS, RunsTable, run_cells
from traceml_tui.tui.widgets.screen_header import ScreenHeader

#: The default order (the source's): newest activity first; `S` turns it round.
DEFAULT_ORDER = "latest activity"


def repeated_names(rows) -> bool:
    """Whether two runs share a name (then the Folder column tells them apart)."""
    names = [r.name for r in rows]
    return len(set(names)) != len(names)


def filter_rows(rows, text: str):
    """Rows whose name, folder, workload or status contain every word of ``text`` (case-insensitive)."""
    words = text.lower().split()
    if not words:
        return list(rows)
    out = []
    for r in rows:
        hay = f"{r.name} {r.folder} {r.workload or ''} {r.status}".lower()
        if all(w in hay for w in words):
            out.append(r)
    return out


class RunsScreen(Screen):
    """All runs in the index."""

    # The footer shows the main actions first, then Help (at 80 columns it cuts what comes last; Help lists
    # every key; the filter box says "press /" itself). Enter is the table's own binding, shown as "Open"
    # (RunsTable): a screen binding for it would be shadowed by the table's.
    BINDINGS = [
        Binding("l", "logs", "Log"),
        Binding("d", "describe", "Describe"),
        Binding("m", "mark", "Mark ref"),
        Binding("c", "compare", "Compare"),
        Binding("slash", "focus_filter", "Filter", show=False),
        Binding("s", "next_sort", "Sort"),
        Binding("O", "pick_sort", "Sort by… (a picker of every column)", show=False),
        Binding("S", "reverse_sort", "Reverse", show=False),
        Binding("o", "default_order", "Default order", show=False),
        Binding("b", "backlog", "Backlog", show=False),
        Binding("escape", "clear_filter", "Clear", show=False),
    ]

    # repaint=False: a new value repaints nothing itself (a whole-screen repaint rewrites every cell of the
    # terminal); the table and the status line redraw what changed (docs/watch.md "Cheap over SSH").
    snapshot: reactive[Optional[RunsSnapshot]] = reactive(None, repaint=False)
    sort_column: reactive[int] = reactive(-1, repaint=False)  # -1: newest activity first (the source's order)
    sort_reverse: reactive[bool] = reactive(False, repaint=False)
    marked: reactive[Optional[int]] = reactive(None, repaint=False)  # run id of the reference chosen with `m`
    _said = ""

    def compose(self) -> ComposeResult:
        yield ScreenHeader(show_clock=False)
        yield Input(placeholder="filter runs (name, folder, workload, status) — press / to focus", id="filter")
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

    def watch_marked(self) -> None:
        self._redraw()

    def on_input_changed(self, event: Input.Changed) -> None:
        self._redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(RunsTable).focus()

    def _redraw(self) -> None:
        if not self.is_mounted:
            return
        found = self.query(RunsTable)
        if not found:  # the app is closing: its screens' widgets are gone before the last snapshot is handled
            return
        snap = self.snapshot
        table = found.first()
        rows = filter_rows(snap.rows if snap else (), self.query_one("#filter", Input).value)
        if self.sort_column >= 0:
            rows.sort(key=COLUMNS[self.sort_column][1], reverse=self.sort_reverse)
        elif self.sort_reverse:
            rows.reverse()
        table.show_folder = repeated_names(snap.rows if snap else ())
        table.sorted_by = (COLUMNS[self.sort_column][0], self.sort_reverse) if self.sort_column >= 0 else None
        table.show(tuple((r.run_id, run_cells(r, r.run_id == self.marked)) for r in rows))
        self.sub_title = f"runs · {snap.indexing}" if snap is not None and snap.indexing else "runs"
        if snap is None:
            self._say("loading…")
        elif not snap.rows:
            self._say(f"No runs yet — {snap.note or 'start one with `traceml run`'}")
        elif not rows:
            self._say("No run matches the filter.")
        else:
            n = len(snap.rows)
            # an alert word or a validation mark (core.state.needs_attention, decided by the reader)
            failing = sum(1 for r in snap.rows if r.attention)
            if self.sort_column >= 0:
                order = f"{COLUMNS[self.sort_column][0]} {'▼' if self.sort_reverse else '▲'}"
            else:
                order = "oldest activity first (o: default)" if self.sort_reverse else DEFAULT_ORDER
            reference = self._row(self.marked)
            ref = f" · ◆ reference {reference.name}" if reference is not None else ""
            self._say(f"{len(rows)}/{n} runs · {failing} need attention · sorted by {order}{ref}")

    def _say(self, text: str) -> None:
        """Set the status line above the table, only when its text changes (an update lays the screen out again)."""
        if text != self._said:
            self._said = text
            self.query_one("#runs-empty", Static).update(text)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        # The shown columns depend on the width: the header's key (its label in COLUMNS) names the column.
        index = [label for label, _ in COLUMNS].index(str(event.column_key.value))
        if index == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column = index
            self.sort_reverse = False

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_run()

    def action_open_run(self) -> None:
        key = self.query_one(RunsTable).selected_key()
        if key is not None:
            self.post_message(OpenRun(int(key)))

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_clear_filter(self) -> None:
        self.query_one("#filter", Input).value = ""
        self.query_one(RunsTable).focus()

    def action_next_sort(self) -> None:
        """The next column (Folder only when shown); after the last one, the default order again."""
        shown_folder = self.query_one(RunsTable).show_folder
        nxt = self.sort_column + 1
        if nxt < len(COLUMNS) and COLUMNS[nxt][0] == "Folder" and not shown_folder:
            nxt += 1
        self.sort_reverse = False  # a new column starts ascending (`S` turns it round)
        self.sort_column = nxt if nxt < len(COLUMNS) else -1

    def action_pick_sort(self) -> None:
        """``O``: choose the sort column from a list (one step, where ``s`` steps through the columns)."""
        table = self.query_one(RunsTable)
        labels = [label for label, _ in COLUMNS if label != "Folder" or table.show_folder]
        current = COLUMNS[self.sort_column][0] if self.sort_column >= 0 else None
        self.app.push_screen(SortPicker(labels, current, self.sort_reverse), self._sort_picked)

    def _sort_picked(self, label: Optional[str]) -> None:
        if label is None:
            return
        index = [name for name, _ in COLUMNS].index(label)
        if index == self.sort_column:  # the sorted column again: the other direction, as a header click does
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_reverse = False
            self.sort_column = index

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse

    def action_default_order(self) -> None:
        """Back to the default order: latest activity first."""
        self.sort_column = -1
        self.sort_reverse = False

    def _row(self, run_id: Optional[int]) -> Optional[RunRow]:
        if run_id is None or self.snapshot is None:
            return None
        return next((r for r in self.snapshot.rows if r.run_id == run_id), None)

    def _selected(self) -> Optional[RunRow]:
        key = self.query_one(RunsTable).selected_key()
        return None if key is None else self._row(int(key))

    def action_mark(self) -> None:
        """Remember the run under the cursor (by its id) as the reference of the next comparison."""
        row = self._selected()
        if row is None:
            return
        if row.run_id == self.marked:  # `m` on the reference again: no reference
            self.marked = None
            self.notify("no reference", timeout=3)
            return
        self.marked = row.run_id
        where = f" ({row.folder})" if row.folder else ""
        self.notify(f"reference: {row.name}{where} — move to the candidate and press c", timeout=4)

    def action_compare(self) -> None:
        reference, candidate = self._row(self.marked), self._selected()
        if reference is None or candidate is None:
            self.notify("mark a reference run with m first", severity="warning", timeout=4)
            return
        if reference.run_id == candidate.run_id:
            self.notify(f"{reference.name} is the reference itself: move to another run and press c",
                        severity="warning", timeout=4)
            return
        # By directory, not by name: two runs may share a name (the source finds a run by its directory first).
        self.post_message(OpenCompare(reference.dir or reference.name, candidate.dir or candidate.name))

    def action_backlog(self) -> None:
        self.post_message(OpenBacklog(None))

    def action_logs(self) -> None:
        """The selected run's training logs (the Log screen)."""
        row = self._selected()
        if row is not None:
            self.post_message(OpenLogs(row.run_id))

    def action_describe(self) -> None:
        """The selected run's manifest, contract, hygiene block and versions (the Describe screen)."""
        row = self._selected()
        if row is not None:
            self.post_message(OpenDescribe(row.run_id))
