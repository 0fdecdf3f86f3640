"""The `traceml watch` App and its one factory, :func:`create_app` (used by the CLI and the tests).

Data flow: a single background worker polls the injected :class:`Source`
(a cheap ``data_version`` check several times a second), builds frozen
snapshots for what is on screen and posts them as messages; the App hands
them to the screens, whose dumb widgets redraw through reactives. The UI
thread never touches the index or the disk. Worker failures surface in one
place (:meth:`WatchApp.on_worker_state_changed`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Iterable, Optional

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header
from textual.worker import Worker, WorkerState, get_current_worker

from traceml_tui.core.state import RunStatus
from traceml_tui.tui.messages import (
    BacklogUpdated,
    CompareThreshold,
    CompareUpdated,
    OpenBacklog,
    OpenCompare,
    OpenDescribe,
    OpenLogs,
    OpenRun,
    RunsUpdated,
    RunUpdated,
    ViewChanged,
)
from traceml_tui.tui.nocolor import tolerant_filters
from traceml_tui.tui.present import compare_snapshot
from traceml_tui.tui.screens.backlog import BacklogScreen
from traceml_tui.tui.screens.compare import CompareScreen
from traceml_tui.tui.screens.describe import DescribeScreen
from traceml_tui.tui.screens.help import HelpScreen, origin_title
from traceml_tui.tui.screens.logs import LogScreen
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.screens.runs import RunsScreen
from traceml_tui.tui.snapshots import (
    ATTENTION_WORDS,
    WRITER_EMBEDDED,
    WRITER_NONE,
    CompareSnapshot,
    RunsSnapshot,
    SourceHealth,
)
from traceml_tui.tui.source import Source
from traceml_tui.tui.widgets.screen_header import set_screen_title

#: Ages (silent for N s) move even when no data arrives: rebuild at least this often.
AGE_REFRESH_S = 1.0
#: Seconds between two attempts to take over the index when its writer is gone and an attempt failed.
TAKEOVER_RETRY_S = 5.0


def sixteen_colours() -> bool:
    """Whether the terminal shows 16 colours: ``TEXTUAL_COLOR_SYSTEM=standard`` (or ``windows``), else what Rich
    detects for this terminal."""
    wanted = os.environ.get("TEXTUAL_COLOR_SYSTEM", "auto").strip().lower()
    if wanted != "auto":
        return wanted in ("standard", "windows")
    from rich.console import Console

    return Console(file=sys.__stdout__).color_system in ("standard", "windows")


def same_runs(a: RunsSnapshot, b: RunsSnapshot) -> bool:
    """Whether two snapshots show the same Runs screen (the clock and the source line aside: the header has it).

    The worker rebuilds at least every second, for the ages that move with no new data (AGE_REFRESH_S); a
    rebuild that changed nothing the Runs screen shows is not handed to it (docs/watch.md "Cheap over SSH").
    """
    return (a.rows, a.index_ready, a.note, a.indexing) == (b.rows, b.index_ready, b.note, b.indexing)


class WatchApp(App):
    """traceml watch: runs, run detail, validation backlog and compare, over an injected source."""

    CSS_PATH = str(Path(__file__).parent / "styles" / "watch.tcss")
    TITLE = "traceml watch"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        # Help first: at 80 columns the footer cuts what comes last, and Help lists every key.
        Binding("question_mark", "help", "Help"),
        # q quits on the Runs screen and goes back everywhere else (each other screen binds q to Back, this
        # action goes back too for one that does not); Ctrl+C always quits (docs/watch.md "Keys").
        Binding("q", "quit_or_back", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("a", "toggle_alerts", "Alerts", show=False),
        Binding("r", "show_runs", "Runs", show=False),
    ]

    def __init__(self, source: Source, *, poll_interval: float = 0.25, alerts: bool = True,
                 compare: Optional[tuple[str, str]] = None, threshold_pct: Optional[float] = 5.0) -> None:
        # On 16 colours the state colours go to the terminal as its own ANSI colours: converted to the theme's
        # truecolor first, red (#f4005f) would come out magenta and yellow red (docs/watch.md "Glyphs").
        super().__init__(ansi_color=True if sixteen_colours() else None)
        self._filters = tolerant_filters(self._filters)  # NO_COLOR: chart margins carry no style (tui/nocolor.py)
        self.source = source
        self.poll_interval = poll_interval
        self.alerts = alerts
        self.compare_specs = compare
        self.threshold_pct = threshold_pct
        self.runs_snapshot: Optional[RunsSnapshot] = None
        self.refreshes = 0  # snapshots applied (tests wait on this, never on time)
        self._wanted: tuple = ("runs",)
        self._wake = threading.Event()
        self._last_compare_result: Optional[str] = None
        self.health: Optional[SourceHealth] = None  # the data source's health, shown in every header
        self._next_takeover = 0.0  # monotonic time before which no new takeover is tried
        self._missing_said: set[int] = set()  # runs whose folder went missing while this watch showed them

    # -- lifecycle
    def on_mount(self) -> None:
        self.push_screen(RunsScreen())
        if self.compare_specs:
            self.push_screen(CompareScreen(*self.compare_specs, self.threshold_pct))
        self._update_wanted()
        self.poll_source()

    def on_unmount(self) -> None:
        self._wake.set()

    def on_screen_resume(self) -> None:
        self._update_wanted()
        self.call_after_refresh(self._show_health)  # a screen just pushed set its own title on mount

    def _update_wanted(self) -> None:
        screen = self.screen
        if isinstance(screen, RunScreen):
            wanted = ("run", screen.run_id, screen.chart)
        elif isinstance(screen, BacklogScreen):
            wanted = ("backlog", screen.run_id)
        elif isinstance(screen, CompareScreen):
            wanted = ("compare", screen.reference, screen.candidate, self.threshold_pct)
        else:
            wanted = ("runs",)
        if wanted != self._wanted:
            self._wanted = wanted
            self._wake.set()

    # -- what screens ask (typed messages, docs/watch.md "Architecture"); the methods below do it
    @on(ViewChanged)
    def _view_changed(self, _: ViewChanged) -> None:
        self._update_wanted()

    @on(OpenRun)
    def _open_run(self, message: OpenRun) -> None:
        self.open_run(message.run_id)

    @on(OpenBacklog)
    def _open_backlog(self, message: OpenBacklog) -> None:
        self.open_backlog(message.run_id)

    @on(OpenLogs)
    def _open_logs(self, message: OpenLogs) -> None:
        self.open_logs(message.run_id, message.rank)

    @on(OpenDescribe)
    def _open_describe(self, message: OpenDescribe) -> None:
        self.open_describe(message.run_id)

    @on(OpenCompare)
    def _open_compare(self, message: OpenCompare) -> None:
        self.open_compare(message.reference, message.candidate)

    @on(CompareThreshold)
    def _compare_threshold(self, message: CompareThreshold) -> None:
        self.set_compare_threshold(message.value)

    # -- navigation
    def open_run(self, run_id: int) -> None:
        self.push_screen(RunScreen(run_id))
        self._wanted = ("run", run_id, None)
        self._wake.set()

    def open_backlog(self, run_id: Optional[int]) -> None:
        self.push_screen(BacklogScreen(run_id))
        self._wanted = ("backlog", run_id)
        self._wake.set()

    def open_compare(self, reference: str, candidate: str) -> None:
        self.push_screen(CompareScreen(reference, candidate, self.threshold_pct))
        self._wanted = ("compare", reference, candidate, self.threshold_pct)
        self._wake.set()

    def open_logs(self, run_id: int, rank: Optional[int] = None) -> None:
        """The run's training logs (one rank's lines when ``rank`` is given); the screen reads them itself."""
        self.push_screen(LogScreen(run_id, rank, poll_s=max(0.05, self.poll_interval)))

    def open_describe(self, run_id: int) -> None:
        self.push_screen(DescribeScreen(run_id))

    def set_compare_threshold(self, value: Optional[float]) -> None:
        self.threshold_pct = value
        self._update_wanted()

    def pop_screen(self):
        result = super().pop_screen()
        self.call_after_refresh(self._update_wanted)
        return result

    # -- the refresh worker
    @work(thread=True, exclusive=True, group="refresh", exit_on_error=False)
    def poll_source(self) -> None:
        """Poll the source off the UI thread; post snapshots when data or the wanted view changed."""
        worker = get_current_worker()
        source = self.source
        last_version: object = None
        last_wanted: object = None
        last_build = 0.0
        while not worker.is_cancelled:
            wanted = self._wanted
            version = source.data_version()
            mono = time.monotonic()
            if version != last_version or wanted != last_wanted or mono - last_build >= AGE_REFRESH_S:
                runs = source.runs()
                self.post_message(RunsUpdated(runs))
                if wanted[0] == "run":
                    self.post_message(RunUpdated(wanted[1], source.run_detail(wanted[1], runs, wanted[2])))
                elif wanted[0] == "backlog":
                    self.post_message(BacklogUpdated(wanted, source.backlog(wanted[1])))
                elif wanted[0] == "compare" and (wanted != last_wanted or version != last_version):
                    self.post_message(CompareUpdated(wanted, self._build_compare(wanted)))
                last_version, last_wanted, last_build = version, wanted, mono
            self._wake.wait(self.poll_interval)
            self._wake.clear()

    def _build_compare(self, wanted: tuple) -> CompareSnapshot:
        _, ref_spec, cand_spec, threshold = wanted
        try:
            ref, ref_label = self.source.summary(ref_spec)
            cand, cand_label = self.source.summary(cand_spec)
        except (OSError, ValueError) as exc:
            return CompareSnapshot(ref_spec, cand_spec, threshold, None, 1, None, None, (), error=str(exc))
        return compare_snapshot(ref, cand, threshold, (ref_label, cand_label))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place worker failures surface: a notification, then a restart of the poller."""
        if event.state == WorkerState.ERROR and event.worker.group == "writer":
            error = event.worker.error
            self.notify(f"taking over the index failed: {type(error).__name__}: {error}; retrying",
                        severity="error", timeout=10)
        if event.state == WorkerState.ERROR and event.worker.group == "refresh":
            error = event.worker.error
            self.notify(f"refresh failed: {type(error).__name__}: {error}", severity="error", timeout=10)
            self.set_timer(2.0, self.poll_source)

    # -- snapshots → screens
    @on(RunsUpdated)
    def _runs_updated(self, message: RunsUpdated) -> None:
        previous, snap = self.runs_snapshot, message.snapshot
        self.runs_snapshot = snap
        self._alert_runs(previous, snap)
        old_health, self.health = self.health, snap.health
        self._show_health()
        self._health_changed(old_health, snap.health)
        if previous is None or not same_runs(previous, snap):  # the refresh gate: nothing new, nothing redrawn
            for screen in self.screen_stack:
                if isinstance(screen, RunsScreen):
                    screen.snapshot = snap
        self.refreshes += 1

    @on(RunUpdated)
    def _run_updated(self, message: RunUpdated) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, RunScreen) and screen.run_id == message.run_id and message.detail is not None:
                screen.detail = message.detail
        detail = message.detail
        if detail is not None and detail.run.status is RunStatus.MISSING and message.run_id not in self._missing_said:
            self._missing_said.add(message.run_id)
            self.notify(f"run {detail.run.name}: its folder is gone from disk (missing) — showing what was indexed",
                        severity="warning", timeout=10)
        self.refreshes += 1

    @on(BacklogUpdated)
    def _backlog_updated(self, message: BacklogUpdated) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, BacklogScreen) and ("backlog", screen.run_id) == message.key:
                screen.snapshot = message.snapshot
        self.refreshes += 1

    @on(CompareUpdated)
    def _compare_updated(self, message: CompareUpdated) -> None:
        snap = message.snapshot
        for screen in self.screen_stack:
            if isinstance(screen, CompareScreen):
                screen.snapshot = snap
        if snap.result == "SLOWER_IN_THIS_PAIR" and self._last_compare_result != snap.result:
            self._alert(f"compare: {snap.candidate} is SLOWER than {snap.reference}")
        self._last_compare_result = snap.result
        self.refreshes += 1

    # -- the data source's health (header) and the writer takeover
    def _show_health(self, health: Optional[SourceHealth] = None) -> None:
        """Put the source line in every screen's header; a warning colours the header (and starts with ⚠)."""
        health = health or self.health
        if health is None:
            return
        title = f"{self.TITLE} · {health.text()}"
        for screen in self.screen_stack:
            set_screen_title(screen, title)  # repaints the title line only, not the whole screen
            for header in screen.query(Header):
                header.set_class(health.stale, "-source-stale")

    def _health_changed(self, old: Optional[SourceHealth], new: Optional[SourceHealth]) -> None:
        """Say in the app what changed about the writer, and take over when it is gone."""
        if new is None:
            return
        if old is None and new.unwatched:
            self.notify(f"{new.who()} writes this index for other roots; showing its index "
                        f"({', '.join(new.unwatched)} not indexed)", severity="warning", timeout=15)
        if old is not None and (old.writer, old.pid) != (new.writer, new.pid):
            if new.writer == WRITER_NONE:
                self.notify(f"{old.who()} stopped writing the index", severity="warning", timeout=8)
            elif new.writer == WRITER_EMBEDDED:
                self.notify("this watch now indexes its roots", timeout=6)
            else:
                self.notify(f"{new.who()} now writes the index", timeout=6)
        takes_over = getattr(self.source, "can_take_over", None)
        if new.writer == WRITER_NONE and takes_over is not None and takes_over() and \
                time.monotonic() >= self._next_takeover:
            self._next_takeover = time.monotonic() + TAKEOVER_RETRY_S  # a failed attempt is not retried every poll
            self.take_over_writer()

    @work(thread=True, exclusive=True, group="writer", exit_on_error=False)
    def take_over_writer(self) -> None:
        """Start this watch's own ingester (off the UI thread: opening the index takes a while)."""
        self.source.take_over()
        self._wake.set()  # show the new writer at once

    # -- alerts (bell + notification), toggled with `a`
    def _alert_runs(self, previous: Optional[RunsSnapshot], snap: RunsSnapshot) -> None:
        if previous is None:
            return  # what was already broken at startup is on screen, not news
        # Silence is news only while the same writer indexed this watch's roots before and now: across a writer
        # gap (it quit, this watch or another takes over) the states are as of when the old one last did.
        before_h, now_h = previous.health, snap.health
        writer_steady = (before_h is None and now_h is None) or (
            before_h is not None and now_h is not None and (before_h.writer, before_h.pid) == (now_h.writer, now_h.pid)
            and now_h.writer != WRITER_NONE and before_h.stale_since is None and now_h.stale_since is None)
        before = {r.run_id: r for r in previous.rows}
        for row in snap.rows:
            old = before.get(row.run_id)
            if not writer_steady and row.status is RunStatus.STALLED:
                continue
            if row.status in ATTENTION_WORDS and (old is None or old.status != row.status):
                first = f" — rank {row.first_failed} failed first" if row.first_failed is not None else ""
                self._alert(f"run {row.name} {row.status}{first}")
            new_silent = set(row.silent_ranks) - set(old.silent_ranks if old else ())
            if new_silent and row.status not in ATTENTION_WORDS and writer_steady:
                self._alert(f"run {row.name}: rank {', '.join(map(str, sorted(new_silent)))} went silent")

    def _alert(self, text: str) -> None:
        if not self.alerts:
            return
        self.bell()
        self.notify(text, severity="warning", timeout=8)

    def action_toggle_alerts(self) -> None:
        self.alerts = not self.alerts
        self.notify(f"alerts {'on' if self.alerts else 'off'}", timeout=3)

    def action_help(self) -> None:
        """`?` anywhere: open the help screen, the keys of the screen it is opened from first (or close it)."""
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        else:
            self.push_screen(HelpScreen(self.BINDINGS, origin_title(self.screen)))

    async def action_quit_or_back(self) -> None:
        """`q`: quit on the Runs screen (the first one), go back on any other."""
        if isinstance(self.screen, RunsScreen) or len(self.screen_stack) <= 2:
            await self.action_quit()
        else:
            self.pop_screen()

    def action_show_runs(self) -> None:
        while len(self.screen_stack) > 2:
            self.pop_screen()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Toggle alerts", "Bell and notification on failures, silent ranks, SLOWER compares",
                            self.action_toggle_alerts)
        yield SystemCommand("Validation backlog", "All runs' validation requests", lambda: self.open_backlog(None))
        yield SystemCommand("Runs", "Back to the list of runs", self.action_show_runs)
        yield SystemCommand("Help", "What every column, glyph and state means; the keys", self.action_help)



def create_app(source: Source, *, poll_interval: float = 0.25, alerts: bool = True,
               compare: Optional[tuple[str, str]] = None, threshold_pct: Optional[float] = 5.0) -> WatchApp:
    """The one factory for the watch App: the CLI and the tests both build it here."""
    return WatchApp(source, poll_interval=poll_interval, alerts=alerts, compare=compare, threshold_pct=threshold_pct)
