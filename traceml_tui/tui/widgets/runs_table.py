"""The Runs table: one row per run; the columns that fit are chosen by width, Status and Run stay pinned."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from rich.text import Text
from textual.binding import Binding

from traceml_tui.core.state import RunStatus, describe
from traceml_tui.tui import textplot
from traceml_tui.tui.glyphs import run_label
from traceml_tui.tui.snapshots import RUN_STATES, RunRow
from traceml_tui.tui.widgets.table_base import PADDING, Col, FedTable, cell_width

#: The severity order (core.state.RUN_ATTENTION) must read without colour too (NO_COLOR turns colours into greys,
#: 16-colour terminals map them to whatever the palette holds): failed is bold bright text on a red block, the
#: loudest; lost and stalled are bold; interrupted is plain, never louder than failed; ranks and glyphs say
#: the rest (docs/watch.md "Glyphs").
STATUS_STYLE = {RunStatus.FAILED: "bold bright_white on red", RunStatus.LOST: "bold bright_red",
                RunStatus.STALLED: "bold yellow", RunStatus.INTERRUPTED: "yellow", RunStatus.RUNNING: "green",
                RunStatus.COMPLETED: "cyan", RunStatus.MISSING: "dim"}
#: The marks after the word: a validation mark needs attention (bold), a quiet rank is news (not yet an alarm).
MARK_STYLES = {"validation": "bold yellow", "quiet": "yellow", "signal": ""}
_ATTENTION = {state: n for n, state in enumerate(RUN_STATES)}

#: Marks the reference run chosen with `m` (a glyph, so it reads without colour too).
MARK = "◆"
MARK_STYLE = "bold reverse"
#: Sort markers in the sorted column's header: ascending, descending.
ASCENDING, DESCENDING = "▲", "▼"

#: (column label, sort key) in display order. Status sorts by the core's attention order (RUN_ATTENTION).
COLUMNS: tuple[tuple[str, object], ...] = (
    ("Status", lambda r: (_ATTENTION.get(r.status, len(_ATTENTION)), r.explaining_ranks)),
    ("Run", lambda r: r.name),
    ("Folder", lambda r: (r.folder, r.name)),
    ("Workload", lambda r: r.workload or ""),
    ("Topo", lambda r: ((r.nodes or 0) * (r.procs_per_node or 0))),
    ("Step", lambda r: r.step or 0),
    ("Step ms", lambda r: r.median_step_ms or 0.0),
    ("Trend", lambda r: r.trend[-1] / r.trend[0] if len(r.trend) > 1 and r.trend[0] else 1.0),
    ("Steps/s", lambda r: r.steps_per_s or 0.0),
    ("Straggler", lambda r: r.straggler_score or 0.0),
    ("Ex/s", lambda r: r.examples_per_s or 0.0),
    ("Loss/0", lambda r: r.loss_ratio if r.loss_ratio is not None else float("inf")),
    ("Eval", lambda r: r.eval_lag if r.eval_lag is not None else 1 << 62),
    ("Backlog", lambda r: r.backlog),
    ("Err", lambda r: r.errors),
    ("Age", lambda r: r.age_s if r.age_s is not None else float("inf")),
    ("Duration", lambda r: r.duration_s if r.duration_s is not None else -1.0),
)
LABELS: tuple[str, ...] = tuple(label for label, _ in COLUMNS)

#: Always shown, whatever the width (the attention columns): fitted first, in this order.
MUST = ("Status", "Run", "Folder", "Step", "Steps/s", "Straggler", "Err")
#: Then, while they fit, these; what does not fit follows to the right (reachable by scrolling).
OPTIONAL = ("Loss/0", "Eval", "Backlog", "Age", "Step ms", "Trend", "Topo", "Duration", "Workload", "Ex/s")
#: Widest a column's content gets (Run and Folder are cut in the middle to fit).
MAX_WIDTH = {"Status": 26, "Folder": 24, "Workload": 16}
#: Run names get at least this many cells, and at most this share of the width.
RUN_MIN, RUN_SHARE = 16, 0.45
#: Columns pinned at the left: scrolling right keeps the state and the name in view.
PINNED = 2


def sort_key(label: str):
    """The sort key of the column ``label``."""
    return COLUMNS[LABELS.index(label)][1]


def status_text(row: RunRow) -> Text:
    """The word with the ranks and lost nodes that explain it and the reader's marks, as `traceml status` prints
    it (core/state.py ``describe``): ``✓ completed ⚠ 2 blocked``, ``▶ running r1 silent 12s``."""
    label = run_label(row.status, describe(row.status, row.explaining_ranks, row.lost_nodes))
    text = Text(label, style=STATUS_STYLE.get(row.status, ""))
    if row.marks:
        style = MARK_STYLES["validation"] if row.validation_mark else (
            MARK_STYLES["quiet"] if row.quiet_ranks else MARK_STYLES["signal"])
        text.append(" ")
        text.append(row.marks, style=style)
    return text


#: A straggler score from which the Straggler cell stands out (the rank table's Δ median does at +20% too) ...
STRAGGLER_ALERT = 1.2
#: ... as a block of its own, bold bright text on red: legible without colour too (NO_COLOR turns red text into
#: dark grey on near-black, the least readable cell of a row), the failed word's recipe (STATUS_STYLE).
STRAGGLER_STYLE = "bold bright_white on red"


def straggler_text(row: RunRow) -> Text:
    """``r3 +16%``: the slowest rank and how much slower its median step time is than the median rank's — the
    Run screen's header and Δ median, and the summary's ``STRAGGLER — Rank 3 is 16% slower``, say the same
    size the same way (– for one rank)."""
    if row.straggler_pct is None or row.slowest_rank is None or (row.procs_per_node or 0) * (row.nodes or 1) < 2:
        return Text("–", style="dim")
    return Text(f"r{row.slowest_rank} {row.straggler_pct:+.0f}%",
                style=STRAGGLER_STYLE if row.straggler_score is not None and row.straggler_score >= STRAGGLER_ALERT
                else "")


def run_cells(row: RunRow, marked: bool = False) -> tuple:
    """The cells of one run, in COLUMNS order; ``marked``: the reference chosen with `m`."""
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
    name = Text(f"{MARK} {row.name}", style=MARK_STYLE) if marked else row.name
    return (
        status_text(row), name, row.folder or "–", row.workload or "–", topo, step,
        textplot.fmt_num(row.median_step_ms), Text(textplot.sparkline(row.trend, 8), style="blue"),
        textplot.fmt_num(row.steps_per_s), straggler_text(row), textplot.fmt_num(row.examples_per_s), ratio, fresh,
        Text(str(row.backlog), style="yellow" if row.backlog else "dim"),
        Text(str(row.errors), style="red" if row.errors else "dim"), row.age, row.duration,
    )


def choose_columns(widths: dict[str, int], available: int, *, folder: bool = False,
                   labels: Optional[dict[str, str]] = None) -> tuple[Col, ...]:
    """Which columns to show and how wide, for content ``widths`` (cells per column) in ``available`` cells.

    The attention columns (``MUST``) always come first in the fit; Run takes what
    they leave (at least ``RUN_MIN``, at most ``RUN_SHARE`` of the width, never
    more than its longest name); then each ``OPTIONAL`` column, in that order,
    that still fits. The fitted columns keep the natural order; the rest follow
    them, reachable by scrolling right (Status and Run stay pinned).
    """
    labels = labels or {}
    want = {k: max(widths.get(k, 0), Text(labels.get(k, k)).cell_len) for k in LABELS}
    for k, cap in MAX_WIDTH.items():
        want[k] = min(want[k], max(cap, Text(labels.get(k, k)).cell_len))
    must = [k for k in MUST if folder or k != "Folder"]
    others = sum(want[k] + PADDING for k in must if k != "Run")
    run_room = max(RUN_MIN, min(int(available * RUN_SHARE), available - others - PADDING))
    want["Run"] = min(want["Run"], max(run_room, Text(labels.get("Run", "Run")).cell_len))
    used = sum(want[k] + PADDING for k in must)
    fitted = set(must)
    for k in OPTIONAL:
        if used + want[k] + PADDING <= available:
            fitted.add(k)
            used += want[k] + PADDING
    shown = [k for k in LABELS if k in fitted]
    shown += [k for k in LABELS if k not in fitted and (folder or k != "Folder")]
    return tuple(Col(k, labels.get(k, k), want[k], cut="middle" if k in ("Run", "Folder") else "") for k in shown)


class RunsTable(FedTable):
    COLUMNS = LABELS
    BINDINGS = [Binding("enter", "select_cursor", "Open")]  # shown in the footer (table_base.py, "Enter")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fixed_columns = PINNED
        self.show_folder = False  # the owner turns it on when two runs share a name
        self.sorted_by: Optional[tuple[str, bool]] = None  # (column label, descending) for the header marker

    def layout(self, rows: Sequence[tuple[Any, tuple]]) -> tuple[Col, ...]:
        widths = {label: 0 for label in LABELS}
        for _, cells in rows:
            for label, cell in zip(LABELS, cells):
                w = cell_width(cell)
                if w > widths[label]:
                    widths[label] = w
        labels = {}
        if self.sorted_by is not None:
            label, descending = self.sorted_by
            labels[label] = f"{label} {DESCENDING if descending else ASCENDING}"
        return choose_columns(widths, self.available_width(len(rows)), folder=self.show_folder, labels=labels)
