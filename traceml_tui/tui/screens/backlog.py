"""Backlog screen: validation requests by state and the heavy QC requests beside them (docs/qc.md), their receipt
metrics, claims and their heartbeats, eval lag, each run's worker-QC word."""

from __future__ import annotations

from typing import Optional

from textual.app import ComposeResult
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer

from traceml_tui.tui.screens.backlog_request import BacklogRequestScreen
from traceml_tui.tui.snapshots import BACKLOG_STATES, BacklogItem, BacklogSnapshot
from traceml_tui.tui.widgets.backlog_table import BacklogTable, backlog_cells, metric_names
from traceml_tui.tui.widgets.info_panel import InfoPanel
from traceml_tui.tui.widgets.screen_header import ScreenHeader

_ORDER = {state: n for n, state in enumerate(BACKLOG_STATES)}


#: At most this many runs' worker-QC lines on the all-runs Backlog (then "and N more").
MAX_QC_LINES = 3


def worker_qc_lines(snap: BacklogSnapshot) -> list:
    """The heavy QC backlog beside validation (docs/qc.md): one ``heavy QC: <word> (<counts>) — <outstanding>``
    line per run that requires worker QC. The word is the reader's (``reader.backlog.worker_qc``, decided by
    :func:`traceml_tui.core.state.decide_worker_qc`), the one ``traceml status --json`` and the metrics show."""
    out: list = []
    for run, qc in snap.worker_qc[:MAX_QC_LINES]:
        qc_counts = " · ".join(f"{k} {v}" for k, v in (qc.get("counts") or {}).items()) or "no QC requests"
        word = qc.get("state")
        named = ", ".join(f"{r.get('checkpoint')} {r.get('state')}" for r in (qc.get("outstanding") or [])[:3])
        of = "" if snap.run else f" of {run}"
        damaged = f"; {len(qc['errors'])} damaged QC file(s)" if qc.get("errors") else ""
        out.append((f"heavy QC{of}: {word} ({qc_counts})" + (f" — {named}" if named else "") + damaged,
                    "green" if word == "passed" else "bold red" if word in ("failed", "not_requested") else "yellow"))
    if len(snap.worker_qc) > MAX_QC_LINES:
        out.append((f"heavy QC: and {len(snap.worker_qc) - MAX_QC_LINES} more run(s)", "dim"))
    return out


def backlog_summary(snap: BacklogSnapshot) -> list:
    counts = " · ".join(f"{k} {v}" for k, v in snap.counts)
    lines = [counts or "no validation requests"]
    if snap.newest_completed:
        run, ckpt, step = snap.newest_completed
        lag = f", eval lag {snap.eval_lag} steps (training at {snap.train_step})" if snap.eval_lag is not None else ""
        lines.append(f"newest completed: {ckpt} (step {step}) of {run}{lag}")
    else:
        lines.append(("no checkpoint evaluated yet", "yellow"))
    lines += worker_qc_lines(snap)
    stuck = [i for i in (*snap.items, *snap.qc_items) if i.stuck]
    if stuck:
        lines.append((f"stale-claim: {len(stuck)} claim(s) whose owner is gone: " +
                      ", ".join(f"{i.checkpoint} ({i.owner})" for i in stuck), "bold red"))
    return lines


def backlog_kind(snap: Optional[BacklogSnapshot]) -> str:
    """What the screen lists: ``validation backlog``, or ``validation and QC backlog`` once heavy QC requests (or a
    run that requires worker QC) are listed beside validation's (docs/qc.md)."""
    qc = snap is not None and bool(snap.qc_items or snap.worker_qc)
    return "validation and QC backlog" if qc else "validation backlog"


def backlog_title(snap: Optional[BacklogSnapshot]) -> str:
    """The screen's subtitle: :func:`backlog_kind`, ``— run`` for one run's."""
    kind = backlog_kind(snap)
    return f"{kind} — {snap.run}" if snap is not None and snap.run else kind


class BacklogScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("q", "app.pop_screen", "Back", show=False),
        # Enter is the table's own binding, shown as "Detail" (BacklogTable); this one names it in Help.
        Binding("enter", "open_request", "Request detail", show=False),
    ]

    snapshot: reactive[Optional[BacklogSnapshot]] = reactive(None, repaint=False)  # the widgets redraw what changed

    def __init__(self, run_id: Optional[int]) -> None:
        super().__init__()
        self.run_id = run_id
        self._items: dict[str, BacklogItem] = {}  # row key → request, for Enter

    def compose(self) -> ComposeResult:
        yield ScreenHeader(show_clock=False)
        yield InfoPanel(id="backlog-summary")
        yield BacklogTable(id="backlog")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "traceml watch"
        self.sub_title = backlog_title(self.snapshot)
        self.query_one(BacklogTable).focus()

    def watch_snapshot(self, snap: Optional[BacklogSnapshot]) -> None:
        if snap is None or not self.is_mounted or not self.query("#backlog-summary"):
            return  # (no summary panel: the app is closing, its screens' widgets gone before the last snapshot)
        self.sub_title = backlog_title(snap)
        self.query_one("#backlog-summary", InfoPanel).data = ("V" + backlog_kind(snap)[1:], backlog_summary(snap))
        # the heavy QC requests beside validation's, told apart by the Kind column (shown when there are any)
        items = sorted((*snap.items, *snap.qc_items),
                       key=lambda i: (not i.stuck, _ORDER.get(i.state, 9), i.run, i.step or 0, i.kind == "qc"))
        keys: dict[str, int] = {}
        rows = []
        table = self.query_one(BacklogTable)
        table.metrics = metric_names(items)
        table.kinds = bool(snap.qc_items)
        self._items = {}
        for i in items:
            key = f"{i.run}/{i.checkpoint}" if i.kind == "validation" else f"{i.run}/{i.kind}:{i.checkpoint}"
            keys[key] = keys.get(key, 0) + 1  # two runs may share a name: their rows still need their own keys
            key = key if keys[key] == 1 else f"{key}#{keys[key]}"
            self._items[key] = i
            rows.append((key, backlog_cells(i, table.metrics, table.kinds)))
        table.table_rows = tuple(rows)

    def action_open_request(self) -> None:
        item = self._items.get(self.query_one(BacklogTable).selected_key() or "")
        if item is not None and self.snapshot is not None:
            self.app.push_screen(BacklogRequestScreen(item, self.snapshot.now))

    def on_data_table_row_selected(self, event) -> None:
        # DataTable consumes Enter itself (select_cursor) and says so with RowSelected: open the request then.
        event.stop()
        self.action_open_request()
