"""The Runs table: one row per run."""

from __future__ import annotations

from rich.text import Text

from traceml_tui.tui import textplot
from traceml_tui.tui.glyphs import run_label
from traceml_tui.tui.snapshots import RUN_STATES, RunRow
from traceml_tui.tui.widgets.table_base import FedTable

STATUS_STYLE = {"failed": "bold red", "lost": "bold red", "stalled": "bold yellow", "interrupted": "yellow",
                "running": "green", "completed": "cyan", "missing": "dim"}
_ATTENTION = {state: n for n, state in enumerate(RUN_STATES)}

#: (column label, sort key) in display order.
COLUMNS: tuple[tuple[str, object], ...] = (
    ("Status", lambda r: (_ATTENTION.get(r.status, len(_ATTENTION)), r.silent_ranks)),
    ("Run", lambda r: r.name),
    ("Workload", lambda r: r.workload or ""),
    ("Topo", lambda r: ((r.nodes or 0) * (r.procs_per_node or 0))),
    ("Step", lambda r: r.step or 0),
    ("Step ms", lambda r: r.median_step_ms or 0.0),
    ("Trend", lambda r: r.trend[-1] / r.trend[0] if len(r.trend) > 1 and r.trend[0] else 1.0),
    ("Steps/s", lambda r: r.steps_per_s or 0.0),
    ("Ex/s", lambda r: r.examples_per_s or 0.0),
    ("Loss/0", lambda r: r.loss_ratio if r.loss_ratio is not None else float("inf")),
    ("Eval", lambda r: r.eval_lag if r.eval_lag is not None else 1 << 62),
    ("Backlog", lambda r: r.backlog),
    ("Err", lambda r: r.errors),
)


def status_text(row: RunRow) -> Text:
    label = run_label(row.status)
    if row.silent_ranks:
        label += " " + ",".join(f"r{r}" for r in row.silent_ranks)
    return Text(label, style=STATUS_STYLE.get(row.status, ""))


def run_cells(row: RunRow) -> tuple:
    """The cells of one run, in COLUMNS order."""
    topo = f"{row.nodes or 1}×{row.procs_per_node}" if row.procs_per_node else "–"
    step = "–" if row.step is None else str(row.step)
    if row.declared_steps:
        step += f"/{row.declared_steps}"
    if row.eval_step is None:
        fresh = Text("–", style="dim")
    else:
        fresh = Text(f"@{row.eval_step} −{row.eval_lag or 0}", style="yellow" if (row.eval_lag or 0) > 0 else "")
    ratio = Text(textplot.fmt_num(row.loss_ratio),
                 style="red" if row.loss_ratio is not None and row.loss_ratio >= 1.0 else "")
    return (
        status_text(row), row.name, row.workload or "–", topo, step, textplot.fmt_num(row.median_step_ms),
        Text(textplot.sparkline(row.trend, 8), style="blue"), textplot.fmt_num(row.steps_per_s),
        textplot.fmt_num(row.examples_per_s), ratio, fresh,
        Text(str(row.backlog), style="yellow" if row.backlog else "dim"),
        Text(str(row.errors), style="red" if row.errors else "dim"),
    )


class RunsTable(FedTable):
    COLUMNS = tuple(label for label, _ in COLUMNS)
