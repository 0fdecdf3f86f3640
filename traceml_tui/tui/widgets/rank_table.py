"""Per-rank table of the Run screen."""

from __future__ import annotations

from rich.text import Text

from traceml_tui.core.state import RankState
from traceml_tui.tui import textplot
from traceml_tui.tui.snapshots import RankRow
from traceml_tui.tui.widgets.table_base import FedTable

STATE_STYLE = {RankState.COMPLETED: "cyan", RankState.FAILED: "bold red", RankState.INTERRUPTED: "yellow"}


def rank_cells(r: RankRow) -> tuple:
    delta = "–" if r.delta_pct is None else f"{r.delta_pct:+.0f}%"
    delta_style = "bold red" if r.delta_pct is not None and r.delta_pct >= 20 else ""
    if r.state == RankState.STALLED:
        silent = Text(f"STALLED {textplot.duration(r.silent_s)}", style="bold yellow")
    elif r.state == RankState.LOST:
        silent = Text(f"LOST {textplot.duration(r.silent_s)}", style="bold red")
    elif r.state in (RankState.COMPLETED, RankState.FAILED, RankState.INTERRUPTED):
        silent = Text(str(r.state), style=STATE_STYLE.get(r.state, ""))
    else:
        silent = Text(textplot.duration(r.silent_s), style="dim")
    return (
        str(r.rank), "–" if r.node is None else str(r.node), "–" if r.step is None else str(r.step),
        textplot.fmt_num(r.step_ms), textplot.fmt_num(r.input_wait_ms), textplot.fmt_num(r.compute_ms),
        Text(delta, style=delta_style), silent,
    )


class RankTable(FedTable):
    COLUMNS = ("Rank", "Node", "Step", "Step ms", "Input ms", "Compute ms", "Δ median", "State")
