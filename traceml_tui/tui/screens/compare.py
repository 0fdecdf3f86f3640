"""Compare screen: two runs side by side, with the same CI result as `traceml compare`."""

from __future__ import annotations

from typing import Optional

from textual.app import ComposeResult
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Input

from traceml_tui.compare.policy import ThresholdError, parse_optional_threshold
from traceml_tui.tui.messages import CompareThreshold
from traceml_tui.tui.snapshots import CompareSnapshot
from traceml_tui.tui.widgets.compare_table import CompareTable, compare_cells
from traceml_tui.tui.widgets.info_panel import InfoPanel
from traceml_tui.tui.widgets.screen_header import ScreenHeader

RESULT_STYLE = {"SLOWER_IN_THIS_PAIR": "bold white on red", "FASTER_IN_THIS_PAIR": "bold green",
                "WITHIN_THRESHOLD_IN_THIS_PAIR": "bold cyan"}


def verdict_lines(snap: CompareSnapshot) -> list:
    if snap.error:
        return [(snap.error, "bold red")]
    threshold = "exploratory (no threshold)" if snap.threshold_pct is None else f"threshold {snap.threshold_pct:g}%"
    result = snap.result or "NO CI RESULT"
    lines = [(f"{result}  (exit {snap.exit_code})", RESULT_STYLE.get(snap.result or "", "bold yellow")),
             f"{snap.reference} → {snap.candidate} · {threshold}"]
    if snap.reason:
        lines.append(f"{snap.reason_code}: {snap.reason}" if snap.reason_code else snap.reason)
    for w in snap.warnings:
        lines.append((f"warning: {w}", "yellow"))
    for name, ref, cand in snap.diagnoses:
        lines.append((f"diagnosis {name}: {ref} → {cand}", "dim"))
    return lines


class CompareScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("q", "app.pop_screen", "Back", show=False),  # typed into the threshold box while it has the focus
        Binding("t", "focus_threshold", "Threshold"),
    ]

    snapshot: reactive[Optional[CompareSnapshot]] = reactive(None, repaint=False)  # the widgets redraw what changed

    def __init__(self, reference: str, candidate: str, threshold_pct: Optional[float]) -> None:
        super().__init__()
        self.reference = reference
        self.candidate = candidate
        self.threshold_pct = threshold_pct

    def compose(self) -> ComposeResult:
        yield ScreenHeader(show_clock=False)
        yield Input(value="" if self.threshold_pct is None else f"{self.threshold_pct:g}",
                    placeholder="max step-time regression % (none or empty = exploratory)", id="threshold")
        yield InfoPanel(id="verdict")
        yield CompareTable(id="compare")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "traceml watch"
        self.sub_title = "compare"
        self.query_one(CompareTable).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            value = parse_optional_threshold(event.value)  # `none` or nothing: exploratory (docs/watch.md)
        except ThresholdError as exc:
            self.notify(str(exc), severity="error")
            return
        self.threshold_pct = value
        self.post_message(CompareThreshold(value))
        self.query_one(CompareTable).focus()

    def action_focus_threshold(self) -> None:
        self.query_one("#threshold", Input).focus()

    def watch_snapshot(self, snap: Optional[CompareSnapshot]) -> None:
        if snap is None or not self.is_mounted or not self.query("#verdict"):
            return  # (no verdict panel: the app is closing, its screens' widgets gone before the last snapshot)
        self.query_one("#verdict", InfoPanel).data = ("", verdict_lines(snap))
        self.query_one(CompareTable).table_rows = tuple((i, compare_cells(r)) for i, r in enumerate(snap.rows))
