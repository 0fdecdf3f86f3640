"""Describe screen (`d`): the run's manifest, guard contract, hygiene block, telemetry and versions as a tree.

The facts come from the index (the manifest and final summary the daemon
ingested, through the source), read on a worker thread; nothing here reads a
file.
"""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from traceml_tui.tui.messages import DescribeLoaded
from traceml_tui.tui.widgets.describe_tree import DescribeTree
from traceml_tui.tui.widgets.screen_header import ScreenHeader


class DescribeScreen(Screen):
    """What a run is: how it was launched, what it declared, what it ran on."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("q", "app.pop_screen", "Back", show=False),
    ]

    def __init__(self, run_id: int) -> None:
        super().__init__()
        self.run_id = run_id
        self.loaded = False  # tests wait on this, never on time

    def compose(self) -> ComposeResult:
        yield ScreenHeader(show_clock=False)
        yield DescribeTree(id="describe")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "traceml watch"
        self.sub_title = f"describe · run #{self.run_id}"
        self.query_one(DescribeTree).focus()
        self.load()

    @work(thread=True, exclusive=True, group="describe", exit_on_error=False)
    def load(self) -> None:
        """Read the run's facts off the UI thread."""
        self.post_message(DescribeLoaded(self.app.source.describe(self.run_id)))

    def on_describe_loaded(self, message: DescribeLoaded) -> None:
        snap = message.snapshot
        if snap is not None:
            self.sub_title = f"describe · {snap.name}"
        self.query_one(DescribeTree).show(snap)
        self.loaded = True

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.group == "describe":
            error = event.worker.error
            self.query_one(DescribeTree).show(None, f"reading the run failed: {type(error).__name__}: {error}")
            self.loaded = True
