"""Messages posted by the refresh worker (any thread) to the App (UI thread)."""

from __future__ import annotations

from typing import Optional

from textual.message import Message

from traceml_tui.tui.snapshots import BacklogSnapshot, CompareSnapshot, RunDetail, RunsSnapshot


class RunsUpdated(Message):
    """A fresh list of runs."""

    def __init__(self, snapshot: RunsSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class RunUpdated(Message):
    """Fresh detail for the run open on the Run screen (None: the run is gone)."""

    def __init__(self, run_id: int, detail: Optional[RunDetail]) -> None:
        super().__init__()
        self.run_id = run_id
        self.detail = detail


class BacklogUpdated(Message):
    def __init__(self, key: object, snapshot: BacklogSnapshot) -> None:
        super().__init__()
        self.key = key
        self.snapshot = snapshot


class CompareUpdated(Message):
    def __init__(self, key: object, snapshot: CompareSnapshot) -> None:
        super().__init__()
        self.key = key
        self.snapshot = snapshot


class LogLinesRead(Message):
    """New lines of a run's training logs, read by the Log screen's worker (``sources`` None: run unknown)."""

    def __init__(self, sources: object, lines: list, skipped_bytes: int, first: bool) -> None:
        super().__init__()
        self.sources = sources
        self.lines = lines
        self.skipped_bytes = skipped_bytes
        self.first = first


class DescribeLoaded(Message):
    """The Describe screen's facts, read by its worker (None: the run is unknown)."""

    def __init__(self, snapshot: object) -> None:
        super().__init__()
        self.snapshot = snapshot
