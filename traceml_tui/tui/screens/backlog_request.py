"""One validation (or heavy QC) request in full (Enter on the Backlog): its state, receipt metrics, every failed attempt's error."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from traceml_tui.tui import textplot
from traceml_tui.tui.glyphs import backlog_label
from traceml_tui.tui.snapshots import BacklogItem
from traceml_tui.tui.widgets.backlog_table import STATE_STYLE


def request_text(item: BacklogItem, now: float) -> Text:
    """The request's detail: nothing cut (the table's Last error cell is one line of a narrow column)."""
    out = Text(f"{item.run} / {item.checkpoint}" + (" (heavy QC)" if item.kind == "qc" else ""), style="bold")
    out.append(f"  step {'–' if item.step is None else item.step}\n")
    out.append(backlog_label(item.state), style=STATE_STYLE.get(item.state, ""))
    out.append(f"  · requested {textplot.duration(item.age_s)} ago")
    if item.owner:
        beat = "–" if item.heartbeat_age_s is None else textplot.duration(item.heartbeat_age_s)
        lease = "" if item.lease_s is None else f" (lease {textplot.duration(item.lease_s)})"
        out.append(f" · claimed by {item.owner}, heartbeat {beat} ago{lease}")
    out.append("\n")
    if item.metrics:
        out.append("\nMetrics (receipt)\n", style="bold")
        for name, value in item.metrics:
            shown = f"{value:.6g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
            out.append(f"  {name} = {shown}\n")
    out.append(f"\nFailed attempts ({len(item.attempts)})\n", style="bold")
    if not item.attempts:
        out.append("  none\n", style="dim")
    for n, when, error in item.attempts:
        ago = "" if when is None else f", {textplot.duration(now - when)} ago"
        out.append(f"  attempt {'?' if n is None else n}{ago}:\n", style="red")
        for line in error.splitlines() or [""]:
            out.append(f"    {line}\n")
    return out


class BacklogRequestScreen(ModalScreen):
    """The request under the Backlog's cursor, as it was when Enter was pressed."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Close"),
        Binding("enter", "app.pop_screen", "Close", show=False),
        Binding("q", "app.pop_screen", "Close", show=False),
    ]
    DEFAULT_CSS = """
    BacklogRequestScreen { align: center middle; }
    #request-body { width: 90%; max-width: 120; height: auto; max-height: 80%; border: thick $primary;
                    background: $surface; padding: 0 1; }
    """

    def __init__(self, item: BacklogItem, now: float) -> None:
        super().__init__()
        self.item = item
        self.now = now

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="request-body"):
            yield Static(request_text(self.item, self.now), id="request-text")

    def on_mount(self) -> None:
        self.query_one("#request-body").focus()
