"""Run screen: the summary's verdict, failure panel, per-rank table, a chart of any recorded metric, straggler
heatmap, the summary's diagnosis, early stopping, train vs eval, nodes, outcomes, ingest errors."""

from __future__ import annotations

from typing import Optional

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer

from traceml_tui.core.state import LIVE_RUN_STATES, describe
from traceml_tui.tui import textplot
from traceml_tui.tui.glyphs import run_label
from traceml_tui.tui.messages import OpenBacklog, OpenDescribe, OpenLogs, ViewChanged
from traceml_tui.tui.snapshots import RunDetail
from traceml_tui.tui.widgets.diagnosis_panel import DiagnosisPanel
from traceml_tui.tui.widgets.early_stopping_panel import EarlyStoppingPanel
from traceml_tui.tui.widgets.failure_panel import FailurePanel
from traceml_tui.tui.widgets.heatmap import Heatmap
from traceml_tui.tui.widgets.info_panel import InfoPanel
from traceml_tui.tui.widgets.line_chart import ChartData, Line, LineChart, Marks
from traceml_tui.tui.widgets.rank_table import RankTable, rank_cells
from traceml_tui.tui.widgets.runs_table import STATUS_STYLE
from traceml_tui.tui.widgets.screen_header import ScreenHeader
from traceml_tui.tui.widgets.verdict_line import VerdictLine


def headline(detail: RunDetail) -> list:
    """One-line run status plus facts, as InfoPanel lines."""
    r = detail.run
    # the ranks and lost nodes the Runs table and `traceml status` name beside the word (core/state.py describe)
    status = describe(r.status.upper(), r.explaining_ranks, r.lost_nodes, r.marks)
    facts = [f"step {r.step if r.step is not None else '–'}" + (f"/{r.declared_steps}" if r.declared_steps else ""),
             f"{r.step_statistic.word} {textplot.fmt_num(r.median_step_ms)} ms"]  # named by its statistic
    if r.slowest_rank is not None and r.straggler_pct is not None:  # the rank table's Δ of that rank
        facts.append(f"{'straggler' if r.straggler else 'slowest'} r{r.slowest_rank} {r.straggler_pct:+.0f}%")
    facts += [f"{textplot.fmt_num(r.steps_per_s)} steps/s", f"{textplot.fmt_num(r.examples_per_s)} ex/s"]
    if r.loss_ratio is not None:
        facts.append(f"loss/0 {textplot.fmt_num(r.loss_ratio)}")
    if r.eval_step is not None:
        facts.append(f"eval @{r.eval_step} (lag {r.eval_lag})")
    if r.backlog:
        facts.append(f"backlog {r.backlog}")
    lines = [(run_label(r.status, status), STATUS_STYLE.get(r.status, "")), " · ".join(facts), timing(detail)]
    if r.interrupted_by is not None:  # by what and when, in full (the Runs row says it short: `SIGINT 21:14`)
        lines.append(f"interrupted by {interruption_text(r.interrupted_by)} at {textplot.clock_time(r.interrupted_at)}")
    return lines


def interruption_text(signal_name: str) -> str:
    """``SIGINT (Ctrl-C)``, ``SIGTERM (a stop from outside: scheduler, launcher)``; other signals as named."""
    return {"SIGINT": "SIGINT (Ctrl-C)", "SIGTERM": "SIGTERM (stopped from outside: a scheduler or the launcher)",
            "SIGHUP": "SIGHUP (its terminal closed)"}.get(signal_name, signal_name)


def timing(detail: RunDetail) -> str:
    """Start time, duration and, for a running run with a declared last step, the ETA at the current steps/s."""
    r = detail.run
    if detail.started_at is None:
        return "started – (no manifest yet)"
    parts = [f"started {textplot.clock_time(detail.started_at)}",
             f"duration {textplot.duration(r.duration_s)}"]  # the reader's, as the Runs table shows it
    if detail.eta_s is not None:
        parts.append(f"ETA {textplot.duration(detail.eta_s)} (to step {r.declared_steps} at "
                     f"{textplot.fmt_num(r.steps_per_s)} steps/s)")
    return " · ".join(parts)


#: How the chart chooser names the index's metrics (daemon/index.py SERIES_METRICS; others by their own name): (name, unit).
METRIC_LABELS = {"step_ms": ("Step time", "ms"), "input_wait_ms": ("Input wait", "ms"),
                 "gpu_step_ms": ("GPU step time", "ms"), "loss": ("Train loss", ""), "grad_norm": ("Grad norm", ""),
                 "lr": ("Learning rate", "")}


def chart_title(metric: str, rank: Optional[int]) -> str:
    """``Step time per rank (ms)``, ``Train loss rank 1``; ``ratio/<c>`` is the scale-free loss ratio of c."""
    name, unit = METRIC_LABELS.get(metric, (metric, ""))
    if metric.startswith("ratio/"):
        name = f"Loss ratio {metric[len('ratio/'):]}"
    who = "per rank" if rank is None else f"rank {rank}"
    return f"{name} {who}" + (f" ({unit})" if unit else "")


def chosen_chart(detail: RunDetail) -> ChartData:
    """The chooser's chart: the chosen metric for every rank (up to 8, one colour each) or for one rank."""
    choices = len(detail.metrics) or 1
    hint = (f"[c/C metric {_position(detail) + 1}/{choices} · v {'one rank' if detail.chart_rank is None else 'all ranks'}"
            f"{' · y log' if _log_ok(detail.chart_metric) else ''}]")
    unit = METRIC_LABELS.get(detail.chart_metric, ("", ""))[1]
    return ChartData(chart_title(detail.chart_metric, detail.chart_rank),
                     tuple(Line(s.name, s.x, s.y) for s in detail.chart), unit=unit, hint=hint,
                     log_ok=_log_ok(detail.chart_metric),
                     empty=f"(no {detail.chart_metric} recorded" + (f" by rank {detail.chart_rank})"
                                                                    if detail.chart_rank is not None else ")"))


def _log_ok(metric: str) -> bool:
    """Step times (heavy-tailed) and loss ratios (spanning decades) get the log-scale toggle."""
    return METRIC_LABELS.get(metric, ("", ""))[1] == "ms" or metric.startswith("ratio/")


def ratio_chart(detail: RunDetail) -> ChartData:
    """The scale-free loss ratio and its smoothed trend, against 1.0 (what predicting zero scores)."""
    s = detail.loss_ratio
    if s is None:
        return ChartData("Scale-free loss ratio", empty="(no loss components logged: log(components=…))")
    return ChartData(f"Scale-free loss ratio: {detail.ratio_name}",
                     (Line("ratio", s.x, s.y), Line("smoothed", s.x, tuple(textplot.smooth(s.y)))),
                     hline=1.0, hline_label="1.0 = predicting zero (no skill)", hint="[y log]", log_ok=True)


def train_chart(detail: RunDetail) -> ChartData:
    """Train loss on its own axis (eval metrics have other units: they get the chart beside it)."""
    s = detail.train_metric
    lines = () if s is None else (Line("train loss", s.x, s.y),)
    return ChartData("Train loss", lines, empty="(no train loss logged)")


def eval_chart(detail: RunDetail) -> ChartData:
    """Completed evaluations as points on their metric's own axis; pending ▵ and failed ✗ on the bottom edge."""
    done = [e for e in detail.evals if e.status == "completed" and e.value is not None]
    name = detail.eval_metric_name or "metric"
    lines = (Line(f"eval {name} ({len(done)})", tuple(float(e.step) for e in done), tuple(e.value for e in done),
                  style="green", points=True),) if done else ()
    marks = (Marks(tuple(float(e.step) for e in detail.evals if e.status == "pending"), "▵", "pending", "yellow"),
             Marks(tuple(float(e.step) for e in detail.evals if e.status == "failed"), "✗", "failed", "bold red"))
    return ChartData(f"Eval {name}", lines, marks=marks if any(m.x for m in marks) else (),
                     empty="(no evaluations yet)")


def _position(detail: RunDetail) -> int:
    return detail.metrics.index(detail.chart_metric) if detail.chart_metric in detail.metrics else 0


def node_lines(detail: RunDetail) -> list:
    lines = []
    for n in detail.nodes:
        ram = "–"
        if n.ram_used is not None and n.ram_total:
            ram = f"{n.ram_used / 2**30:.1f}/{n.ram_total / 2**30:.1f} GiB"
        text = f"node {n.node}: CPU {textplot.fmt_num(n.cpu_pct)}% · RAM {ram}"
        for idx, util, used, total in n.gpus:
            mem = f"{used / 2**30:.1f}/{total / 2**30:.0f} GiB" if used is not None and total else "–"
            text += f" · GPU{idx} {textplot.fmt_num(util)}% {mem}"
        if not n.gpus:
            text += " · no GPU"
        lines.append(text)
    return lines or [("(no node samples yet)", "dim")]


def outcome_lines(detail: RunDetail) -> list:
    lines = []
    for o in detail.outcomes:
        style = "red" if o.status != "completed" else "cyan"
        reasons = f" [{', '.join(o.reasons)}]" if o.reasons else ""
        lines.append((f"node {o.node}: {o.status} (exit {o.exit_code if o.exit_code is not None else '–'}){reasons}",
                      style))
    return lines or [("(no guard outcomes: unguarded run, or still training)", "dim")]


def error_lines(detail: RunDetail) -> list:
    lines = [(f"{e.path} @{e.offset}: {e.message}", "red") for e in detail.errors]
    return lines or [("(none)", "dim")]


class RunScreen(Screen):
    """One run in detail."""

    # The footer shows the main actions first (Help lists every key). PageUp/PageDown scroll the screen even
    # while the rank table has the focus (priority: the table would take them for its few rows).
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("q", "app.pop_screen", "Back", show=False),
        Binding("l", "logs", "Log"),
        Binding("d", "describe", "Describe"),
        Binding("L", "rank_logs", "Rank log"),
        Binding("c", "next_metric", "Metric"),
        Binding("C", "previous_metric", "Previous chart metric", show=False),
        Binding("v", "chart_ranks", "All/one rank"),
        Binding("b", "backlog", "Backlog"),
        Binding("pagedown", "page_body(1)", "Scroll the screen down a page", show=False, priority=True),
        Binding("pageup", "page_body(-1)", "Scroll the screen up a page", show=False, priority=True),
        Binding("y", "log_scale", "Log scale"),
    ]

    detail: reactive[Optional[RunDetail]] = reactive(None, repaint=False)  # the widgets redraw what changed

    def __init__(self, run_id: int) -> None:
        super().__init__()
        self.run_id = run_id
        #: The chosen chart, (metric, rank or None for every rank); None: the default (step time, every rank).
        self.chart: Optional[tuple[str, Optional[int]]] = None

    def compose(self) -> ComposeResult:
        yield ScreenHeader(show_clock=False)
        with VerticalScroll(id="run-body"):
            yield InfoPanel(id="headline")
            yield VerdictLine(id="run-verdict")
            yield FailurePanel(id="failure")
            yield RankTable(id="ranks")
            yield LineChart(id="chart-step")
            yield Heatmap(id="heatmap")
            yield DiagnosisPanel(id="diagnosis")
            yield LineChart(id="chart-ratio")
            with Horizontal(id="train-eval"):
                yield LineChart(id="chart-train")
                yield LineChart(id="chart-eval")
            yield EarlyStoppingPanel(id="early-stopping")
            yield InfoPanel(id="nodes")
            yield InfoPanel(id="outcomes")
            yield InfoPanel(id="errors")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "traceml watch"
        self.sub_title = f"run #{self.run_id}"
        self.query_one(RankTable).focus()

    def watch_detail(self, detail: Optional[RunDetail]) -> None:
        if detail is None or not self.is_mounted:
            return
        found = self.query("#headline")
        if not found:  # the app is closing: its screens' widgets are gone before the last snapshot is handled
            return
        self.sub_title = detail.run.name
        found.first(InfoPanel).data = ("", headline(detail))
        # the final summary's words (the reader's Diagnosis); a live run's verdict comes when it ends
        self.query_one(VerdictLine).data = (detail.verdict, detail.run.status in LIVE_RUN_STATES)
        self.query_one(DiagnosisPanel).data = detail.verdict
        self.query_one(FailurePanel).data = detail.failure
        table = self.query_one(RankTable)
        table.step_label = detail.run.step_statistic.label  # the column names the run's statistic
        table.table_rows = tuple((r.rank, rank_cells(r)) for r in detail.ranks)
        table.styles.height = min(10, len(detail.ranks) + 2)
        self.query_one("#chart-step", LineChart).data = chosen_chart(detail)
        labels = tuple(f"r{r.rank}" for r in detail.ranks)
        self.query_one("#heatmap", Heatmap).data = (labels, detail.heatmap, detail.heat_steps)
        self.query_one("#chart-ratio", LineChart).data = ratio_chart(detail)
        self.query_one("#chart-train", LineChart).data = train_chart(detail)
        self.query_one("#chart-eval", LineChart).data = eval_chart(detail)
        self.query_one(EarlyStoppingPanel).data = detail.early_stopping
        if detail.fields:
            self._field_panel().data = ("Field QC (spread vs initialization)", field_lines(detail))
        self.query_one("#nodes", InfoPanel).data = ("Nodes", node_lines(detail))
        self.query_one("#outcomes", InfoPanel).data = ("Guard outcomes", outcome_lines(detail))
        self.query_one("#errors", InfoPanel).data = (f"Ingest errors ({detail.run.errors})", error_lines(detail))

    def _field_panel(self) -> InfoPanel:
        """The field-QC panel, mounted on first use so runs without latent fields look unchanged."""
        found = self.query("#fields")
        if found:
            return found.first(InfoPanel)
        panel = InfoPanel(id="fields")
        self.query_one("#nodes", InfoPanel).parent.mount(panel, before="#nodes")
        return panel

    def action_backlog(self) -> None:
        self.post_message(OpenBacklog(self.run_id))

    def action_page_body(self, direction: int) -> None:
        """PageDown / PageUp: scroll the whole Run screen, whichever widget has the focus."""
        body = self.query_one("#run-body", VerticalScroll)
        if direction > 0:
            body.scroll_page_down(animate=False)
        else:
            body.scroll_page_up(animate=False)

    def action_logs(self) -> None:
        self.post_message(OpenLogs(self.run_id))

    def action_rank_logs(self) -> None:
        key = self.query_one(RankTable).selected_key()
        self.post_message(OpenLogs(self.run_id, None if key is None else int(key)))

    def action_describe(self) -> None:
        self.post_message(OpenDescribe(self.run_id))

    def action_log_scale(self) -> None:
        """Step-time and loss-ratio charts: linear ↔ log y axis."""
        for chart in self.query(LineChart):
            chart.log = not chart.log

    # -- the chart chooser: the wanted chart goes to the refresh worker (ViewChanged), which re-reads
    def _choose(self, metric: str, rank: Optional[int]) -> None:
        self.chart = None if (metric, rank) == ("step_ms", None) else (metric, rank)
        self.post_message(ViewChanged())

    def _current(self) -> tuple[str, Optional[int]]:
        return self.chart or ("step_ms", None)

    def _step_metric(self, by: int) -> None:
        detail = self.detail
        if detail is None or not detail.metrics:
            return
        metric, rank = self._current()
        at = detail.metrics.index(metric) if metric in detail.metrics else -1 if by > 0 else 0
        self._choose(detail.metrics[(at + by) % len(detail.metrics)], rank)

    def action_next_metric(self) -> None:
        self._step_metric(1)

    def action_previous_metric(self) -> None:
        self._step_metric(-1)

    def action_chart_ranks(self) -> None:
        """Every rank ↔ the rank under the rank table's cursor."""
        metric, rank = self._current()
        if rank is not None:
            self._choose(metric, None)
            return
        key = self.query_one(RankTable).selected_key()
        if key is not None:
            self._choose(metric, int(key))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """Charting one rank, the chart follows the rank table's cursor."""
        metric, rank = self._current()
        if rank is not None and event.row_key is not None and event.row_key.value is not None \
                and event.row_key.value != str(rank):
            self._choose(metric, int(event.row_key.value))


def field_lines(detail: RunDetail) -> list:
    """One line per latent field; a collapsed field is a failure and stands out."""
    lines = []
    for field in sorted(detail.fields, key=lambda f: (f.status != "failed", f.name)):
        ratio = "—" if field.latest_spread_ratio is None else f"{field.latest_spread_ratio:.2f}×"
        if field.status == "failed":
            lines.append((f"FAILED  {field.name}: collapsed at step {field.failed_at_step} "
                          f"(spread {ratio} of initial < {field.factor:g})", "bold red"))
        elif field.status == "ok":
            lines.append(f"ok      {field.name}: spread {ratio} of initial ({field.qc_points} QC points)")
        else:
            lines.append((f"?       {field.name}: no initial spread to compare against", "dim"))
    return lines
