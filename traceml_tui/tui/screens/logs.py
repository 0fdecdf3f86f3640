"""Log screen (`l`): a run's training stdout and stderr of every node, merged, labelled by node and rank.

Opens at the first error line (the first failing rank's, when the failure is
known), follows new lines while asked to (`f`), searches (`/`, `n`, `N`),
filters to one rank (`r`, or `L` on a rank of the Run screen). The files are
read by a worker thread through :class:`traceml_tui.tui.logtail.LogTail`
(bounded to the last few MiB of each file); the UI thread only shows lines.
"""

from __future__ import annotations

import threading
from typing import Optional

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Input, Static
from textual.worker import Worker, WorkerState, get_current_worker

from traceml_tui.tui.logtail import LogLine, LogTail
from traceml_tui.tui.messages import LogLinesRead
from traceml_tui.tui.snapshots import LogSources
from traceml_tui.tui.widgets.log_view import LogView
from traceml_tui.tui.widgets.screen_header import ScreenHeader

#: Lines kept in memory; beyond it the oldest go (the files keep everything).
MAX_LINES = 200_000
#: Seconds between two looks at the files (a stat each; reads only what was appended).
POLL_S = 0.25


def first_error(lines: list[LogLine], rank: Optional[int]) -> Optional[int]:
    """Index of the first error line of ``rank`` (the failing rank), else of any rank, else None."""
    if rank is not None:
        found = next((i for i, ln in enumerate(lines) if ln.error and ln.rank == rank), None)
        if found is not None:
            return found
    return next((i for i, ln in enumerate(lines) if ln.error), None)



def empty_log_text(sources: LogSources) -> str:
    """What the Log screen says when a run's logs hold no line: why, for a live, ended or vanished run."""
    if sources.missing:
        return "the run's folder is gone from disk: its training logs cannot be read (the index keeps its records)"
    where = f"{len(sources.files)} log files: nodes/node_<k>/training.stdout.log, training.stderr.log"
    return f"no training output yet ({where})" if sources.live else f"the run wrote no training output ({where})"

class LogScreen(Screen):
    """One run's training logs."""

    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("q", "back", "Back", show=False),
        Binding("slash", "search", "Search"),
        Binding("n", "next_match", "Next match"),
        Binding("N", "previous_match", "Previous match", show=False),
        Binding("e", "next_error", "Next error"),
        Binding("f", "toggle_follow", "Follow"),
        Binding("r", "next_rank", "Rank filter"),
    ]

    def __init__(self, run_id: int, rank: Optional[int] = None, *, poll_s: float = POLL_S) -> None:
        super().__init__()
        self.run_id = run_id
        self.rank = rank  # the rank filter (None: every line)
        self.poll_s = poll_s
        self.sources: Optional[LogSources] = None
        self.all_lines: list[LogLine] = []
        self.ranks: set[int] = set()
        self.skipped_bytes = 0
        self.search_text = ""
        self.reads = 0  # batches applied (tests wait on this, never on time)
        self.problem: Optional[str] = None
        self._wake = threading.Event()

    def compose(self) -> ComposeResult:
        yield ScreenHeader(show_clock=False)
        yield Static("reading the logs…", id="log-status")
        yield LogView(id="log")
        yield Input(placeholder="search (Enter: next match, Esc: close)", id="log-search")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "traceml watch"
        self.sub_title = f"log · run #{self.run_id}"
        self.query_one("#log-search", Input).display = False
        self.query_one(LogView).focus()
        self.tail_logs()

    def on_unmount(self) -> None:
        self._wake.set()

    # -- the reader
    @work(thread=True, exclusive=True, group="logs", exit_on_error=False)
    def tail_logs(self) -> None:
        """Read the logs' new lines every ``poll_s`` off the UI thread and post them to the screen."""
        worker = get_current_worker()
        sources = self.app.source.log_sources(self.run_id)
        if sources is None:
            self.post_message(LogLinesRead(None, [], 0, True))
            return
        tail = LogTail(sources.run_dir, sources.files, single_rank=sources.single_rank)
        first = True
        while not worker.is_cancelled:
            lines = tail.read()
            if lines or first:
                self.post_message(LogLinesRead(sources, lines, tail.skipped_bytes, first))
                first = False
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.group == "logs":
            error = event.worker.error
            self.problem = f"reading the logs failed: {type(error).__name__}: {error}"
            self._status()

    def on_log_lines_read(self, message: LogLinesRead) -> None:
        view = self.query_one(LogView)
        self.skipped_bytes = message.skipped_bytes
        if message.first:
            self.sources = message.sources
            if message.sources is None:
                self.problem = "this run is no longer in the index"
            else:
                self.sub_title = f"log · {message.sources.name}"
        new = list(message.lines)
        self.ranks.update(ln.rank for ln in new if ln.rank is not None)
        self.all_lines.extend(new)
        if len(self.all_lines) > MAX_LINES:
            self.all_lines = self.all_lines[-MAX_LINES:]
            self._refilter()
        elif message.first:
            self._refilter()
            self._start_position()
        else:
            view.append([ln for ln in new if self._wanted(ln)])
        self.reads += 1
        self._status()

    # -- what is shown
    def _wanted(self, line: LogLine) -> bool:
        return self.rank is None or line.rank == self.rank

    def _refilter(self) -> None:
        self.query_one(LogView).show([ln for ln in self.all_lines if self._wanted(ln)])

    def _start_position(self) -> None:
        """The first error line (the failing rank's first); without one, the end (followed while live)."""
        view = self.query_one(LogView)
        sources = self.sources
        start = first_error(view.lines, sources.first_failed if sources is not None else None)
        if start is not None:
            view.move_to(start)
        else:
            view.follow = bool(sources is not None and sources.live)
            view.call_after_refresh(view.scroll_end, animate=False)

    def _status(self) -> None:
        view = self.query_one(LogView)
        if self.problem:
            text = self.problem
        elif self.sources is not None and not self.all_lines:
            text = empty_log_text(self.sources)
        else:
            shown = f"{len(view.lines)} of {len(self.all_lines)} lines" if self.rank is not None else \
                f"{len(self.all_lines)} lines"
            parts = [shown, f"rank r{self.rank}" if self.rank is not None else "all ranks",
                     "follow on" if view.follow else "follow off"]
            if view.cursor is not None:
                parts.append(f"at line {view.cursor + 1}")
            if self.search_text:
                parts.append(f"search “{self.search_text}”")
            if self.skipped_bytes:
                parts.append(f"{self.skipped_bytes / 2**20:.1f} MiB earlier not read")
            if self.rank is not None and not self.ranks:  # e.g. logs of an older `traceml run` (docs/watch.md)
                parts.append("no line in these logs names a rank")
            text = " · ".join(parts)
        self.query_one("#log-status", Static).update(text)

    # -- keys
    def action_back(self) -> None:
        search = self.query_one("#log-search", Input)
        if search.display:
            search.display = False
            self.query_one(LogView).focus()
            return
        self.app.pop_screen()

    def action_search(self) -> None:
        search = self.query_one("#log-search", Input)
        search.display = True
        search.focus()

    def on_log_view_cursor_moved(self, event: LogView.CursorMoved) -> None:
        self._status()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.search_text = event.value
        self.query_one(LogView).set_search(event.value)
        self._status()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.display = False
        self.query_one(LogView).focus()
        self.action_next_match()

    def _jump(self, index: Optional[int], what: str) -> None:
        view = self.query_one(LogView)
        if index is None:
            self.notify(f"no {what}", timeout=3)
            return
        view.follow = False
        view.move_to(index)
        self._status()

    def action_next_match(self) -> None:
        view = self.query_one(LogView)
        start = 0 if view.cursor is None else view.cursor + 1
        self._jump(view.find(start), f"line matches “{self.search_text}”" if self.search_text else "search: press /")

    def action_previous_match(self) -> None:
        view = self.query_one(LogView)
        start = len(view.lines) - 1 if view.cursor is None else view.cursor - 1
        self._jump(view.find(start, forward=False), f"line matches “{self.search_text}”")

    def action_next_error(self) -> None:
        view = self.query_one(LogView)
        start = -1 if view.cursor is None else view.cursor
        nxt = next((i for i in range(start + 1, len(view.lines)) if view.lines[i].error), None)
        if nxt is None:
            nxt = next((i for i in range(0, len(view.lines)) if view.lines[i].error), None)
        self._jump(nxt, "error line")

    def action_toggle_follow(self) -> None:
        view = self.query_one(LogView)
        view.follow = not view.follow
        if view.follow:
            view.scroll_end(animate=False)
        self._status()

    def action_next_rank(self) -> None:
        """All ranks → r0 → r1 → … → all ranks."""
        ranks = sorted(self.ranks)
        if not ranks:
            self.notify("no line names a rank", timeout=3)
            return
        if self.rank is None:
            self.rank = ranks[0]
        else:
            later = [r for r in ranks if r > self.rank]
            self.rank = later[0] if later else None
        self._refilter()
        self._start_position()
        self._status()
