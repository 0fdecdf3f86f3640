"""The heavy QC backlog's Prometheus families (docs/cluster.md, docs/qc.md), beside the validation backlog's.

Built from ``reader.backlog.worker_qc`` (the index's QC backlog, its word decided by
:func:`traceml_tui.core.state.decide_worker_qc`), so a scrape shows the word ``traceml status --json`` and the
Backlog screen show. Only runs whose manifest requires worker QC are exported here.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily

from traceml_tui.core.rundir import QC_BACKLOG
from traceml_tui.core.state import BacklogState, WorkerQcState


def qc_families(reader: Any, runs: Iterable[Any], now: float, labels: Callable[[Any], list[str]]) -> Iterator:
    """``traceml_qc_backlog_requests{state}`` (QC requests by state, as ``traceml_backlog_requests`` counts
    validation's), ``traceml_qc_backlog_outstanding`` (QC requests without a receipt: pending or failed QC is not
    passed QC), ``traceml_qc_backlog_oldest_outstanding_age_seconds`` and ``traceml_worker_qc_state{state}`` (1 for
    the run's worker-QC word, 0 for the others, as ``traceml_run_status``)."""
    requests = GaugeMetricFamily("traceml_qc_backlog_requests", "Heavy QC requests by state",
                                 labels=["run", "run_id", "state"])
    outstanding = GaugeMetricFamily("traceml_qc_backlog_outstanding",
                                    "Heavy QC requests without a receipt (pending or failed QC is not passed QC)",
                                    labels=["run", "run_id"])
    oldest = GaugeMetricFamily("traceml_qc_backlog_oldest_outstanding_age_seconds",
                               "Age of the oldest heavy QC request not yet completed", labels=["run", "run_id"])
    word = GaugeMetricFamily("traceml_worker_qc_state", "1 for the run's worker-QC word, 0 for the others",
                             labels=["run", "run_id", "state"])
    for run in runs:
        entries = reader.backlog.entries(run.run_id, now=now, kind=QC_BACKLOG)
        report = reader.backlog.worker_qc(run.run_id, now, entries)
        if report is None:  # the run requires no worker QC
            continue
        lab = labels(run)
        for state in BacklogState:
            requests.add_metric([*lab, str(state)], sum(1 for e in entries if e.state is state))
        outstanding.add_metric(lab, len(report["outstanding"]))
        waiting = [e.created for e in entries if e.outstanding and e.created is not None]
        if waiting:
            oldest.add_metric(lab, max(0.0, now - min(waiting)))
        for state in WorkerQcState:
            word.add_metric([*lab, str(state)], 1.0 if report["state"] == state.value else 0.0)
    yield from (requests, outstanding, oldest, word)
