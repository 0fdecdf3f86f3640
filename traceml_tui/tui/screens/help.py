"""Help screen (`?`): what every column, glyph and state word means, and the keys of each screen.

The words, glyphs, column labels, step-time parts and key bindings are read
from where they are defined (the core's enums and ``steptime.PARTS``, the
widgets' columns, the screens' ``BINDINGS``), so this screen cannot drift from
what the other screens show; only the explanations are written here.
"""

from __future__ import annotations

from rich.console import Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from daemon.rates import RATE_RULE
from daemon.views import STEP_STATISTIC, SUMMARY_STATISTIC, SUMMARY_STATISTIC_LABEL
from traceml_tui.core import steptime
from traceml_tui.core.state import BACKLOG_ORDER, RUN_ATTENTION, BacklogState, RunStatus
from traceml_tui.tui.glyphs import BACKLOG_GLYPHS, RUN_GLYPHS
from traceml_tui.tui.keys import LIST_KEYS_HELP, list_bindings
from traceml_tui.tui.widgets.rank_table import STEP_COLUMN, RankTable
from traceml_tui.tui.widgets.runs_table import COLUMNS as RUNS_COLUMNS
from traceml_tui.tui.widgets.screen_header import ScreenHeader

#: The Runs table's columns (labels from widgets/runs_table.py).
RUNS_COLUMN_HELP: dict[str, str] = {
    "Status": "the run's state word after its glyph, then the ranks that explain it (⚠ stalled r1: the rank that "
              "stopped first), then its marks: a rank still running but silent for 3 of its step intervals "
              "(r1 silent 12s), what interrupted it and when (SIGINT 21:14 UTC), a validation that needs a look "
              "(⚠ 2 blocked, ⚠ validation missing: counted as needing attention)",
    "Run": "run name, cut in the middle when too long (guard-cand…-133543) so its end stays readable; "
           "◆ marks the reference run chosen with m",
    "Folder": "where the run lives, from its root's name (logs/exp1); shown when two runs share a name",
    "Workload": "the guard contract's workload name",
    "Topo": "nodes × processes per node",
    "Step": "newest step / declared steps",
    "Step ms": f"the run's step time (ms): the median rank's {STEP_STATISTIC} while it runs; once its final "
               f"summary is written, the median rank's {SUMMARY_STATISTIC} (the summary's own figures)",
    "Trend": "step time over the recent steps (sparkline; rising = getting slower)",
    "Steps/s": "training steps per second over the last seconds of records (the slowest rank's; falls while "
               "the ranks are silent: see steps/s below)",
    "Straggler": "rN +P%: the rank with the slowest step time (by the Step ms statistic) and how much slower it "
                 "is than the median rank's (the lower median: of two ranks, the faster) — the summary's STRAGGLER "
                 "rule, the Run screen's Δ median; once the summary is written, the summary's verdict's own size; "
                 "a bold red block from +20%; – for a single rank",
    "Ex/s": "examples per second",
    "Loss/0": "latest scale-free loss ratio of the worst loss component: its loss over what predicting zero "
              "scores; 1.0 = no better than predicting zero (red at ≥ 1.0)",
    "Eval": "@S −L: S = newest evaluated checkpoint step, L = steps training is ahead of it (– = none yet)",
    "Backlog": "validation requests without a receipt (pending, claimed, failed, blocked, stale-claim)",
    "Err": "ingest errors: records or files the index could not read (listed on the Run screen)",
    "Age": "time since the run's newest record",
    "Duration": "from the launch's start (or its first step record) to its end (or its newest record), or to now while it runs",
}

#: What each run state means (the rules of traceml_tui/core/state.py), in attention order.
RUN_STATUS_HELP: dict[str, str] = {
    RunStatus.FAILED: "a rank raised, exited non-zero or was killed by a signal, or a guard outcome failed",
    RunStatus.LOST: "a rank has no end record and nothing more can come from it (the run or its node is done, "
                    "or every other rank ended long ago), or the launcher died before finalizing the run",
    RunStatus.STALLED: "a rank that has not ended is silent for the stall limit: max(30 s, 10 × median step "
                       "interval) behind the run's newest record, or behind now while nothing new is ingested",
    RunStatus.INTERRUPTED: "stopped by Ctrl-C or SIGTERM (the ranks that did not complete were interrupted)",
    RunStatus.RUNNING: "still writing records, no rank silent",
    RunStatus.COMPLETED: "every rank ended cleanly (and the guard outcomes, if any, completed)",
    RunStatus.MISSING: "its folder is gone from disk; the index keeps its rows",
}

#: What each validation request state means (core/state.py decide_backlog), in backlog order.
BACKLOG_STATE_HELP: dict[str, str] = {
    BacklogState.STALE_CLAIM: "claimed, but the owner is gone (same host: process gone; other host: heartbeat "
                              "older than its lease)",
    BacklogState.BLOCKED: "every allowed attempt failed",
    BacklogState.FAILED: "an attempt failed; a retry is left",
    BacklogState.CLAIMED: "a live evaluator is working on it",
    BacklogState.PENDING: "waiting for an evaluator",
    BacklogState.COMPLETED: "evaluated: a receipt is written",
}

#: The step-time parts (labels from core/steptime.PARTS).
PART_HELP: dict[str, str] = {
    "data_wait": "time in next() of an instrumented loader (0 and unmeasured without one)",
    "between_steps": "the rest of the gap since the previous step: checkpoints, logging, eval, other input",
    "h2d": "host-to-device copies",
    "forward": "forward pass",
    "backward": "backward pass",
    "optimizer": "optimizer step",
    "residual": "traced time no measured phase covers",
}

_KEY_NAMES = {"escape": "Esc", "enter": "Enter", "slash": "/", "question_mark": "?", "ctrl+p": "Ctrl+P",
              "ctrl+c": "Ctrl+C", "home": "Home", "end": "End", "pagedown": "PgDn", "pageup": "PgUp"}


#: Help's longer words for actions whose footer word is short ("Quit") but whose rule is not.
ACTION_HELP = {"quit_or_back": "Quit on the Runs screen; on any other screen, Back",
               "quit": "Quit, from any screen",
               "rank_logs": "Log of the rank under the cursor",
               "next_metric": "Next chart metric",
               "chart_ranks": "Chart every rank / the rank under the cursor"}


def key_name(key: str) -> str:
    return _KEY_NAMES.get(key, key)


def binding_lines(bindings, extra: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    """(key, description) of each binding (first key of a comma list), then ``extra``."""
    out = []
    for b in bindings:
        if isinstance(b, Binding):
            key, desc, action = b.key, b.description, b.action
        else:
            key, action, desc = (tuple(b) + ("",))[:3]
        desc = ACTION_HELP.get(action, desc)
        out.append((" ".join(key_name(k.strip()) for k in key.split(",")), desc or action.replace("_", " ")))
    return out + list(extra)


def screen_keys(app_bindings=()) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each screen's keys, from its BINDINGS; ``app_bindings`` are the app's own (the "Everywhere" keys).

    The app passes its bindings in (:class:`HelpScreen`), so this screen never imports the app: a screen
    sits below the app that pushes it (the import-linter contract in pyproject.toml).
    """
    return [("Everywhere", binding_lines(app_bindings, (("Ctrl+P", "command palette"), *LIST_KEYS_HELP)))] + [
        (title, binding_lines(cls.BINDINGS, extra)) for title, cls, extra in _screens()]


def _screens() -> list[tuple[str, type, tuple[tuple[str, str], ...]]]:
    """(title, screen class, keys beyond its BINDINGS) of each screen, in the order Help lists them."""
    from traceml_tui.tui.screens.backlog import BacklogScreen
    from traceml_tui.tui.screens.compare import CompareScreen
    from traceml_tui.tui.screens.describe import DescribeScreen
    from traceml_tui.tui.screens.logs import LogScreen
    from traceml_tui.tui.screens.run_detail import RunScreen
    from traceml_tui.tui.screens.runs import RunsScreen

    return [
        ("Runs", RunsScreen, (("Enter", "open the run under the cursor"), ("click", "a header sorts by that column"))),
        ("Run", RunScreen, ()),
        ("Log", LogScreen, ()),
        ("Describe", DescribeScreen, ()),
        ("Backlog", BacklogScreen, ()),
        ("Compare", CompareScreen, ()),
        ("Help", HelpScreen, ()),
    ]


def origin_title(screen: object) -> str | None:
    """Help's name for ``screen`` (the screen Help was opened from), or None for a screen it does not list."""
    return next((title for title, cls, _ in _screens() if type(screen) is cls), None)


class _Doc:
    """Titled sections of (name, explanation) rows; explanations wrap under themselves."""

    def __init__(self) -> None:
        self.parts: list = []
        self.grid: Table | None = None

    def section(self, title: str) -> None:
        if self.parts:
            self.parts.append(Text(""))
        self.parts.append(Text(title, style="bold underline"))
        self.grid = None

    def rows(self, rows) -> None:
        if self.grid is None:
            self.grid = Table.grid(padding=(0, 1))
            self.grid.add_column(style="bold", no_wrap=True, min_width=15)
            self.grid.add_column(ratio=1)
            self.parts.append(Padding(self.grid, (0, 0, 0, 2)))
        for name, text in rows:
            self.grid.add_row(name, text)

    def note(self, text: str) -> None:
        self.parts.append(Padding(Text(text, style="dim"), (0, 0, 0, 2)))
        self.grid = None


def help_renderable(app_bindings=(), origin: str | None = None) -> Group:
    """Every column, glyph, state and key explained; ``app_bindings``: the app's own keys (see :func:`screen_keys`).

    ``origin``: the title of the screen Help was opened from; its keys come first, before everything else.
    """
    doc = _Doc()
    keys = screen_keys(app_bindings)
    if origin is not None:
        doc.section(f"Keys of this screen ({origin})")
        doc.rows(dict(keys)[origin])
        doc.rows(dict(keys)["Everywhere"])
    doc.section("Runs screen: columns")
    doc.rows((label, RUNS_COLUMN_HELP[label]) for label, _ in RUNS_COLUMNS)
    doc.note("Status and Run stay in view when scrolling right. The columns that fit the width come first "
             "(the attention columns always: Status, Run, Step, Steps/s, Straggler, Err); the others follow to "
             "the right. The sorted column's header shows ▲ (ascending) or ▼ (descending); sorting by Status "
             "puts the most urgent states first.")
    doc.section("Run states (Runs status, Run headline, rank State), most urgent first")
    doc.rows((f"{RUN_GLYPHS[s]} {s}", RUN_STATUS_HELP[s]) for s in RUN_ATTENTION)
    doc.note("A rank's State adds how long it has been silent: ▶ running 3s, ⚠ STALLED 40s, ? LOST 2m; a rank "
             "still running but silent for 3 of its own step intervals (at least 5 s) is greyed: ▶ silent 12s. "
             "↯ aborted: the rank failed after another rank failed first (a victim); the first is ✗ failed or ? LOST.")
    doc.section("Run screen: rank table")
    doc.rows([("State", "the rank's state (above) and the time since its newest record"),
              ("Step", "the rank's newest step"),
              (STEP_COLUMN, f"the rank's step time while the run is live: {STEP_STATISTIC} (the header's step "
                            "time is the median rank's); Δ median and the straggler come from it"),
              (SUMMARY_STATISTIC_LABEL, f"instead, once the run's final summary is written: {SUMMARY_STATISTIC}, "
                                        "the summary's own per-rank figures, so Δ median, the header, the Runs "
                                        "screen and the verdict line say the same size")])
    doc.rows((label, PART_HELP[name]) for name, label in steptime.PARTS)
    doc.note("The parts are means over the same steps (the last 64, or the summary's window) and sum to their "
             "mean step time, which one slow step lifts above a median.")
    doc.rows((col, "this rank's step time vs the median rank") for col in RankTable.COLUMNS if col == "Δ median")
    doc.section("Run screen: straggler heatmap")
    doc.rows([("rows", "one per rank; columns are stretches of steps, oldest left"),
              ("░▒▓█", "≥1.1×, ≥1.2×, ≥1.35×, ≥1.5× the median rank's step time there (· no steps)"),
              ("dark row", "a rank slow again and again: a recurring straggler")])
    doc.section("Run screen: charts and panels")
    doc.rows([("chart", "the metric chosen with c / C (step time, input wait, train loss, grad norm, learning "
                        "rate, each loss ratio, custom metrics: what the index holds) for every rank, or with v "
                        "for the rank under the cursor"),
              ("lines", "braille, one colour per rank (legend on the title line); ▲ points above the 95th "
                        "percentile when one outlier would flatten the rest; y: log scale (step time, loss ratio); "
                        "Tab to a chart, then + / - zoom, arrows pan, r reset (or the mouse wheel and drag)"),
              ("Train loss, Eval", "two charts, each on its own axis: the train loss, and the eval metric (●) from "
                                   "eval records and validation receipts alike; ▵ an evaluation still pending (or "
                                   "claimed) at its checkpoint's step, ✗ one that failed or is blocked"),
              ("Early stopping", "its metric, the best checkpoint, patience used / left and why it stopped, from "
                                 "the final summary; while a run is live, the declared policy and the best receipt "
                                 "so far"),
              ("header", "start time (UTC), duration, and for a running run with a declared last step the ETA "
                         "at the current steps/s"),
              ("steps/s, ex/s", f"the rate rule, over seconds, not steps: {RATE_RULE}; the ETA, the Runs table "
                                "and traceml status show the same figure"),
              ("Verdict", "the final summary's verdict and what to do next (its step-time diagnosis), under the "
                          "header; every issue it found in the Diagnosis panel. A live run's verdict comes when "
                          "it ends")])
    doc.section("Backlog states (validation requests), first shown first")
    doc.rows((f"{BACKLOG_GLYPHS[s]} {s}", BACKLOG_STATE_HELP[s]) for s in BACKLOG_ORDER)
    doc.note("After State, one column per metric a receipt reports (– until it completes). Enter on a request "
             "shows it in full: its receipt metrics and every failed attempt with its whole error.")
    for title, rows in keys:
        if title != origin:
            doc.section(f"Keys: {title}")
            doc.rows(rows)
    return Group(*doc.parts)


class HelpBody(VerticalScroll):
    """The help text; j/k scroll a line, g/Home and G/End go to the top and the end (tui/keys.py)."""

    BINDINGS = list_bindings("scroll_down", "scroll_up", "scroll_home", "scroll_end")


class HelpScreen(Screen):
    """What every column, glyph and state means, and the keys of each screen."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Close"),
        Binding("question_mark", "app.pop_screen", "Close", show=False),
        Binding("q", "app.pop_screen", "Close", show=False),
    ]

    def __init__(self, app_bindings=(), origin: str | None = None) -> None:
        super().__init__()
        self.app_bindings = tuple(app_bindings)  # the pushing app's keys: passed in, never imported
        self.origin = origin  # the title of the screen Help was opened from (its keys come first)

    def compose(self) -> ComposeResult:
        yield ScreenHeader(show_clock=False)
        with HelpBody(id="help-body"):
            yield Static(help_renderable(self.app_bindings, self.origin), id="help-text")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "traceml watch"
        self.sub_title = "help"
        self.query_one("#help-body").focus()
