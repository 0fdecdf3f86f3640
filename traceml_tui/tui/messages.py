"""Messages of `traceml watch`: snapshots posted by the refresh worker (any thread) to the App (UI thread), and
what a screen asks of the App (screens never call App internals; the App handles these with ``@on``).

Snapshot messages are coalesced (``can_replace``): when the UI thread is behind, a newer snapshot of the same
view replaces the one still queued, so a burst of refreshes costs one redraw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from textual.message import Message

from traceml_tui.tui.snapshots import BacklogSnapshot, CompareSnapshot, RunDetail, RunsSnapshot


@dataclass
class RunsUpdated(Message):
    """A fresh list of runs."""

    snapshot: RunsSnapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunsUpdated)


@dataclass
class RunUpdated(Message):
    """Fresh detail for the run open on the Run screen (None: the run is gone)."""

    run_id: int
    detail: Optional[RunDetail]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunUpdated) and message.run_id == self.run_id


@dataclass
class BacklogUpdated(Message):
    """A fresh backlog snapshot for the view ``key`` = ("backlog", run id or None)."""

    key: Any
    snapshot: BacklogSnapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, BacklogUpdated) and message.key == self.key


@dataclass
class CompareUpdated(Message):
    """A fresh comparison for the view ``key`` = ("compare", reference, candidate, threshold)."""

    key: Any
    snapshot: CompareSnapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, CompareUpdated) and message.key == self.key


@dataclass
class LogLinesRead(Message):
    """New lines of a run's training logs, read by the Log screen's worker (``sources`` None: run unknown)."""

    sources: Any
    lines: list
    skipped_bytes: int
    first: bool


@dataclass
class DescribeLoaded(Message):
    """The Describe screen's facts, read by its worker (None: the run is unknown)."""

    snapshot: Any


# -- what screens ask of the App


@dataclass
class ViewChanged(Message):
    """A screen changed what it shows (the Run screen's chart): the refresh worker re-reads what is wanted."""


@dataclass
class OpenRun(Message):
    """Open the Run screen of ``run_id``."""

    run_id: int


@dataclass
class OpenBacklog(Message):
    """Open the Backlog screen of one run (``run_id``) or of every run (None)."""

    run_id: Optional[int]


@dataclass
class OpenLogs(Message):
    """Open the Log screen of a run (one rank's lines when ``rank`` is given)."""

    run_id: int
    rank: Optional[int] = None


@dataclass
class OpenDescribe(Message):
    """Open the Describe screen of a run."""

    run_id: int


@dataclass
class OpenCompare(Message):
    """Open the Compare screen of two runs (by directory or name)."""

    reference: str
    candidate: str


@dataclass
class CompareThreshold(Message):
    """The Compare screen's threshold changed (None: exploratory)."""

    value: Optional[float]
