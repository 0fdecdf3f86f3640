"""A fake data source for screen and widget tests of `traceml watch`: snapshot objects a test sets.

The App depends on the :class:`~traceml_tui.tui.source.Source` protocol only (injected through
``create_app``), so a screen test does not need an index or an ingester: :class:`FakeSource` serves the
frozen snapshots of :mod:`traceml_tui.tui.snapshots` that the test hands it and bumps ``data_version``
whenever the test changes them, as the daemon does when it commits. The snapshots are never hand-written
figures: :func:`capture` takes them from :class:`~traceml_tui.tui.source.IndexSource` over the committed
real runs of ``tests/fixtures/runs`` (:mod:`support.fixture_runs`), and a test varies them with
``dataclasses.replace``. End-to-end flows and the SVG snapshots keep the real index (``tests/test_tui.py``,
``tests/test_tui_snapshots.py``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from pathlib import Path
from typing import Optional

from traceml_tui.tui.snapshots import (
    BacklogSnapshot,
    DescribeSnapshot,
    LogSources,
    RunDetail,
    RunRow,
    RunsSnapshot,
)


@dataclasses.dataclass(frozen=True)
class RealSnapshots:
    """What :class:`~traceml_tui.tui.source.IndexSource` showed of the committed real runs, once."""

    runs: RunsSnapshot
    details: dict[int, RunDetail]
    backlogs: dict[Optional[int], BacklogSnapshot]
    describes: dict[int, DescribeSnapshot]
    logs: dict[int, LogSources]

    def row(self, name: str) -> RunRow:
        """The Runs row of the run called ``name``."""
        return next(r for r in self.runs.rows if r.name == name)


def capture(tmp: Path) -> RealSnapshots:
    """Index a copy of the committed real runs under ``tmp`` with the real ingester and take every snapshot
    the screens show of them through the real :class:`~traceml_tui.tui.source.IndexSource`, at the fixed time
    the screenshots use (so the figures are the real reader's and do not move between machines)."""
    from traceml_tui.tui.source import IndexSource

    from support import fixture_runs

    _, index = fixture_runs.build_real_index(tmp)
    source = IndexSource(index, clock=lambda: fixture_runs.SHOWN_AT)
    try:
        runs = source.runs()
        ids = [r.run_id for r in runs.rows]
        details = {i: source.run_detail(i, runs) for i in ids}
        backlogs: dict[Optional[int], BacklogSnapshot] = {i: source.backlog(i) for i in ids}
        backlogs[None] = source.backlog(None)
        describes = {i: source.describe(i) for i in ids}
        logs = {i: source.log_sources(i) for i in ids}
    finally:
        source.close()
    missing = [i for i, v in {**details, **describes, **logs}.items() if v is None]
    if missing:
        raise AssertionError(f"the real index gave no snapshot for runs {missing}")
    return RealSnapshots(runs, details, backlogs, describes, logs)  # type: ignore[arg-type]


class FakeSource:
    """:class:`~traceml_tui.tui.source.Source` serving the snapshots a test sets (thread-safe: the App calls
    it from its refresh worker).

    Like the real source, ``run_detail`` answers None for a run that is not in the current Runs snapshot and
    shows the run's current row in the detail; ``calls`` counts every protocol call, so a test can tell
    what the App asked for. A test changes the data with :meth:`set_runs`, :meth:`set_detail`,
    :meth:`replace_row` and :meth:`drop_run`; each bumps ``data_version`` unless told ``bump=False``.
    """

    def __init__(self, snapshots: RealSnapshots, *, clock: Optional[float] = None) -> None:
        """``clock``: what :meth:`now` answers (default: the captured Runs snapshot's own time)."""
        self._lock = threading.RLock()
        self._runs = snapshots.runs
        self._details = dict(snapshots.details)
        self._backlogs = dict(snapshots.backlogs)
        self._describes = dict(snapshots.describes)
        self._logs = dict(snapshots.logs)
        self._summaries: dict[str, tuple[dict, str]] = {}
        self._clock = snapshots.runs.now if clock is None else clock
        self._version = 0
        self.calls: Counter[str] = Counter()
        self.charts: list[Optional[tuple[str, Optional[int]]]] = []  # the chart each run_detail call asked for
        self.closed = False

    # -- what a test does
    def bump(self) -> int:
        """Say the data changed (as a daemon commit does); returns the new version."""
        with self._lock:
            self._version += 1
            return self._version

    def set_runs(self, runs: RunsSnapshot, *, bump: bool = True) -> None:
        """Serve ``runs`` as the Runs snapshot from now on."""
        with self._lock:
            self._runs = runs
            if bump:
                self.bump()

    def replace_row(self, name: str, *, bump: bool = True, **changes) -> RunRow:
        """Change fields of the row of run ``name`` (``dataclasses.replace``); returns the new row."""
        with self._lock:
            rows = list(self._runs.rows)
            at = next(i for i, r in enumerate(rows) if r.name == name)
            rows[at] = dataclasses.replace(rows[at], **changes)
            self.set_runs(dataclasses.replace(self._runs, rows=tuple(rows)), bump=bump)
            return rows[at]

    def drop_run(self, run_id: int, *, bump: bool = True) -> None:
        """The run leaves the index (its row and every snapshot of it go)."""
        with self._lock:
            rows = tuple(r for r in self._runs.rows if r.run_id != run_id)
            for table in (self._details, self._backlogs, self._describes, self._logs):
                table.pop(run_id, None)
            self.set_runs(dataclasses.replace(self._runs, rows=rows), bump=bump)

    def set_detail(self, run_id: int, detail: RunDetail, *, bump: bool = True) -> None:
        """Serve ``detail`` for the Run screen of ``run_id``."""
        with self._lock:
            self._details[run_id] = detail
            if bump:
                self.bump()

    def set_summary(self, spec: str, summary: dict, label: str) -> None:
        """What :meth:`summary` answers for ``spec`` (a final summary dict and its label)."""
        with self._lock:
            self._summaries[spec] = (summary, label)

    # -- the Source protocol (same signatures: tests/test_tui_fake_source.py checks them)
    def data_version(self) -> int:
        """The version a test last bumped to."""
        with self._lock:
            self.calls["data_version"] += 1
            return self._version

    def now(self) -> float:
        """The fixed time the snapshots were taken at (or the one given)."""
        self.calls["now"] += 1
        return self._clock

    def runs(self) -> RunsSnapshot:
        """The Runs snapshot a test set last."""
        with self._lock:
            self.calls["runs"] += 1
            return self._runs

    def run_detail(self, run_id: int, runs: Optional[RunsSnapshot] = None,
                   chart: Optional[tuple[str, Optional[int]]] = None) -> Optional[RunDetail]:
        """The detail set for ``run_id`` with the run's current row; None when the run is gone."""
        with self._lock:
            self.calls["run_detail"] += 1
            self.charts.append(chart)
            row = next((r for r in (runs or self._runs).rows if r.run_id == run_id), None)
            detail = self._details.get(run_id)
            if row is None or detail is None:
                return None
            return dataclasses.replace(detail, run=row)

    def backlog(self, run_id: Optional[int] = None) -> BacklogSnapshot:
        """The captured backlog of ``run_id`` (or of every run); an empty one for a run that has none."""
        with self._lock:
            self.calls["backlog"] += 1
            found = self._backlogs.get(run_id)
            return found if found is not None else BacklogSnapshot((), (), None, None, None, self._clock)

    def summary(self, spec: str) -> tuple[dict, str]:
        """The summary a test set for ``spec``; FileNotFoundError otherwise (as the real source raises)."""
        with self._lock:
            self.calls["summary"] += 1
            if spec not in self._summaries:
                raise FileNotFoundError(f"no final summary for {spec!r}")
            return self._summaries[spec]

    def log_sources(self, run_id: int) -> Optional[LogSources]:
        """The captured log sources of ``run_id`` (None when the run is unknown)."""
        with self._lock:
            self.calls["log_sources"] += 1
            return self._logs.get(run_id)

    def describe(self, run_id: int) -> Optional[DescribeSnapshot]:
        """The captured describe snapshot of ``run_id`` (None when the run is unknown)."""
        with self._lock:
            self.calls["describe"] += 1
            return self._describes.get(run_id)

    def close(self) -> None:
        """Nothing to release; remembered so a test can see the App closed its source."""
        self.calls["close"] += 1
        self.closed = True
