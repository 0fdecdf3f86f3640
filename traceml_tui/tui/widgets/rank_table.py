"""Per-rank table of the Run screen."""

from __future__ import annotations

from rich.text import Text

from daemon.views import STEP_STATISTIC_LABEL
from traceml_tui.core import steptime
from traceml_tui.core.state import RankState
from traceml_tui.tui import textplot
from traceml_tui.tui.glyphs import rank_label
from traceml_tui.tui.snapshots import RankRow
from traceml_tui.tui.widgets.runs_table import STRAGGLER_STYLE
from traceml_tui.tui.widgets.table_base import Col, FedTable

#: The rank table's step-time column: named by its statistic.
STEP_COLUMN = STEP_STATISTIC_LABEL

STATE_STYLE = {RankState.COMPLETED: "cyan", RankState.FAILED: "bold red", RankState.INTERRUPTED: "yellow",
               RankState.ABORTED: "red"}


#: A quiet rank (still running, but silent): greyed, italic so that it reads without colour too.
QUIET_STYLE = "dim italic"


def rank_cells(r: RankRow) -> tuple:
    delta = "–" if r.delta_pct is None else f"{r.delta_pct:+.0f}%"
    # the Runs screen's Straggler cell's style from +20 % (a block: legible under NO_COLOR too)
    delta_style = STRAGGLER_STYLE if r.delta_pct is not None and r.delta_pct >= 20 else ""
    if r.state == RankState.STALLED:
        silent = Text(rank_label(r.state, f"STALLED {textplot.duration(r.silent_s)}"), style="bold yellow")
    elif r.state == RankState.WAITING:  # silent too, but for a hung peer (core/hang.py): not the one to look at
        silent = Text(rank_label(r.state, f"waiting {textplot.duration(r.silent_s)}"), style="yellow")
    elif r.state == RankState.LOST:
        silent = Text(rank_label(r.state, f"LOST {textplot.duration(r.silent_s)}"), style="bold red")
    elif r.state in (RankState.COMPLETED, RankState.FAILED, RankState.INTERRUPTED, RankState.ABORTED):
        silent = Text(rank_label(r.state), style=STATE_STYLE.get(r.state, ""))
    elif r.quiet:  # running, but silent for several of its own step intervals (core.state.quiet_ranks): greyed
        silent = Text(rank_label(r.state, f"silent {textplot.duration(r.silent_s)}"), style=QUIET_STYLE)
    else:
        silent = Text(rank_label(r.state, f"running {textplot.duration(r.silent_s)}"), style="green")
    step = "–" if r.step is None else str(r.step)
    return (
        str(r.rank), "–" if r.node is None else str(r.node), silent, Text(step, style=QUIET_STYLE) if r.quiet else step,
        textplot.fmt_num(r.step_ms), Text(delta, style=delta_style), *(textplot.fmt_num(v) for v in r.parts),
    )


class RankTable(FedTable):
    # The core's parts with the core's labels, as in the summary card and compare's phase table (ms, window mean).
    # The state comes first: it must stay visible however narrow the terminal; Δ median (the straggler's number)
    # follows the step time so that the parts, not it, are what a narrow terminal scrolls to.
    # The step-time column names its statistic (daemon/views.py StepStatistic: each rank's median over its
    # last 64 steps while the run is live, the final summary's mean over its window once it has one; Help says
    # both in full; the column's key stays STEP_COLUMN, its header is step_label); the parts that follow are the
    # same window's means.
    COLUMNS = ("Rank", "Node", "State", "Step", STEP_COLUMN, "Δ median",
               *(label for _, label in steptime.PARTS))
    WIDTHS = {"State": 13}  # "▶ running 59m", "⚠ STALLED 40s", "■ interrupted"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fixed_columns = 3  # Rank, Node and State stay in view when scrolling right to the parts
        self.step_label = STEP_COLUMN  # the run's statistic (set by the Run screen before it feeds rows)

    def layout(self, rows) -> tuple[Col, ...]:
        """Every column, the step-time one headed by the run's statistic (:attr:`step_label`)."""
        return tuple(Col(label, self.step_label if label == STEP_COLUMN else label, self.WIDTHS.get(label))
                     for label in self.COLUMNS)
