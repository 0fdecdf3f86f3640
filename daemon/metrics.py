"""Prometheus metrics of the index, served by ``traceml daemon --metrics HOST:PORT`` (docs/cluster.md).

Each scrape reads the index through :class:`daemon.reader.Reader` (read-only,
states decided by the core rules), so a scrape shows the same words as
``traceml status`` and ``traceml watch``. Cardinality is bounded: a run that
has ended (or gone silent for good) drops out ``retention_s`` after its last
record; live runs are always exported.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from traceml_tui.core.signals import shielded
from traceml_tui.core.state import LIVE_RUN_STATES, BacklogState, RankState, RunStatus

from .metrics_qc import qc_families
from .reader import BacklogItem, Reader, RunSummary
from .views import RunFigures

#: Default seconds a finished run stays exported after its last record.
DEFAULT_RETENTION_S = 3600.0

#: Rank states without an end record: their silence is worth a number.
_SILENT_STATES = {RankState.RUNNING, RankState.STALLED, RankState.LOST}


class HostPortError(ValueError):
    """``--metrics`` is not ``HOST:PORT``."""


def parse_host_port(text: str) -> tuple[str, int]:
    """``127.0.0.1:9464`` → ("127.0.0.1", 9464); ``[::1]:9464`` for IPv6; a bare ``:9464`` means loopback."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise HostPortError(f"--metrics {text[:80]!r} is not HOST:PORT (for example 127.0.0.1:9464)")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def exported(run: RunSummary, now: float, retention_s: float) -> bool:
    """Whether a scrape at ``now`` exports ``run``: the one retention rule (docs/cluster.md).

    Live runs always; a run gone from disk never; an ended run until ``retention_s``
    after its last record. The clock is the record's own ``ts``, not when this
    daemon ingested it: a daemon started on a fresh index over old runs must not
    export (and page for) every historical failure for another ``retention_s``.
    A run without any record has no such time and stays exported.
    """
    if run.missing:
        return False
    if run.status in LIVE_RUN_STATES:
        return True
    return run.last_ts is None or now - run.last_ts <= retention_s


def _age(now: float, ts: Optional[float]) -> Optional[float]:
    return None if ts is None else max(0.0, now - ts)


class IndexCollector(Collector):
    """Builds every metric family from the index at scrape time."""

    def __init__(self, index_path: str, retention_s: float = DEFAULT_RETENTION_S,
                 clock: Callable[[], float] = time.time, stall_floor_s: Optional[float] = None) -> None:
        self.index_path = index_path
        self.retention_s = retention_s
        self.clock = clock
        self.stall_floor_s = stall_floor_s

    def collect(self) -> Iterator:
        now = self.clock()
        kw = {} if self.stall_floor_s is None else {"stall_floor_s": self.stall_floor_s}
        try:
            reader = Reader(self.index_path, **kw)
        except Exception:  # no index yet, or one being upgraded: say so, export nothing else
            up = GaugeMetricFamily("traceml_index_up", "1 when the index could be read at this scrape")
            up.add_metric([], 0)
            yield up
            return
        with reader:
            all_runs = reader.list_runs(now=now)
            runs = [r for r in all_runs if exported(r, now, self.retention_s)]
            backlogs = {r.run_id: reader.backlog.entries(r.run_id, now=now) for r in runs}
            # the figures every surface shows, computed once by the reader (daemon/views.py)
            figures = {r.run_id: reader.figures(r, now, backlogs[r.run_id]) for r in runs}
            yield from self._run_families(runs, now)
            yield from self._mark_families(runs)
            yield from self._figure_families(runs, figures)
            yield from self._rank_families(reader, runs, now)
            yield from self._hang_families(runs)
            yield from self._backlog_families(backlogs, runs, now)
            yield from qc_families(reader, runs, now, self._labels)
            yield from self._ingest_families(all_runs, now)
        up = GaugeMetricFamily("traceml_index_up", "1 when the index could be read at this scrape")
        up.add_metric([], 1)
        yield up

    @staticmethod
    def _labels(run: RunSummary) -> list[str]:
        return [run.name, str(run.run_id)]

    def _run_families(self, runs: list[RunSummary], now: float) -> Iterator:
        status = GaugeMetricFamily("traceml_run_status", "1 for the run's state, 0 for the others",
                                   labels=["run", "run_id", "status"])
        sps = GaugeMetricFamily("traceml_run_steps_per_second", "Steps per second (the slowest rank's, over its last seconds of records; daemon/rates.py)",
                                labels=["run", "run_id"])
        eps = GaugeMetricFamily("traceml_run_examples_per_second", "Examples per second (every rank's, over its last seconds of records; daemon/rates.py)",
                                labels=["run", "run_id"])
        strag = GaugeMetricFamily("traceml_run_straggler_score",
                                  "Slowest rank's step time over the median rank's (1 = even; the lower median"
                                  " with two ranks, as the summary's straggler rule), by the run's statistic",
                                  labels=["run", "run_id"])
        age = GaugeMetricFamily("traceml_run_last_record_age_seconds", "Seconds since the run's newest record",
                                labels=["run", "run_id"])
        step = GaugeMetricFamily("traceml_run_last_step", "Newest completed step of any rank", labels=["run", "run_id"])
        lost = GaugeMetricFamily("traceml_run_lost_node",
                                 "1 for each node whose launcher lease expired while another node's did not",
                                 labels=["run", "run_id", "node"])
        for run in runs:
            lab = self._labels(run)
            for word in RunStatus:
                status.add_metric([*lab, str(word)], 1.0 if run.status is word else 0.0)
            if run.steps_per_s is not None:
                sps.add_metric(lab, run.steps_per_s)
            if run.examples_per_s is not None:
                eps.add_metric(lab, run.examples_per_s)
            if run.straggler_score is not None:
                strag.add_metric(lab, run.straggler_score)
            if (a := _age(now, run.last_ts)) is not None:
                age.add_metric(lab, a)
            if run.last_step is not None:
                step.add_metric(lab, run.last_step)
            for node in run.lost_nodes:
                lost.add_metric([*lab, str(node)], 1.0)
        yield from (status, sps, eps, strag, age, step, lost)

    def _mark_families(self, runs: list[RunSummary]) -> Iterator:
        """What the Runs screen marks (docs/watch.md "Nothing hides"), from the same reader view: whether a run needs
        attention (core.state.needs_attention: an alert word or a validation mark, ``⚠ 1 blocked``), its
        validation mark (``blocked``: the blocked requests; ``missing``: its summary says ``Validation: MISSING``)
        and how many exported runs need attention (the Runs screen's ``3 need attention``)."""
        attention = GaugeMetricFamily("traceml_run_needs_attention",
                                      "1 when the run needs attention: failed, lost, stalled, or a validation mark",
                                      labels=["run", "run_id"])
        mark = GaugeMetricFamily("traceml_run_validation_mark",
                                 "The run's validation mark: blocked requests (mark=blocked), or 1 when its summary"
                                 " says validation is missing (mark=missing)", labels=["run", "run_id", "mark"])
        count = GaugeMetricFamily("traceml_runs_need_attention", "Exported runs that need attention")
        for run in runs:
            lab = self._labels(run)
            attention.add_metric(lab, 1.0 if run.attention else 0.0)
            if run.validation_mark is not None:
                blocked = run.validation_blocked > 0  # core.state.validation_mark: blocked before missing
                mark.add_metric([*lab, "blocked" if blocked else "missing"],
                                float(run.validation_blocked) if blocked else 1.0)
        count.add_metric([], float(sum(1 for r in runs if r.attention)))
        yield from (attention, mark, count)

    def _figure_families(self, runs: list[RunSummary], figures: dict[int, RunFigures]) -> Iterator:
        """The run's figures as every surface shows them: step time, straggler verdict, eval lag, early-stopping
        best (docs/cluster.md)."""
        lab_names = ["run", "run_id"]
        step = GaugeMetricFamily("traceml_run_step_time_median_seconds",
                                 "The median rank's step time: its median over its rolling window while the run is"
                                 " live, its mean over the final summary's analysis window once that summary is"
                                 " current (traceml_run_step_time_final)", labels=lab_names)
        source = GaugeMetricFamily("traceml_run_step_time_final",
                                   "1 when the run's step time, straggler and Δ are its current final summary's"
                                   " per-rank means, 0 while they are the rolling medians", labels=lab_names)
        slowest = GaugeMetricFamily("traceml_run_slowest_rank", "The rank with the slowest step time",
                                    labels=lab_names)
        verdict = GaugeMetricFamily("traceml_run_straggler",
                                    "1 when the slowest rank is at least 10% slower than the median rank",
                                    labels=lab_names)
        lag = GaugeMetricFamily("traceml_run_eval_lag_steps", "Training steps since the newest evaluated step",
                                labels=lab_names)
        best = GaugeMetricFamily("traceml_run_early_stopping_best",
                                 "Early stopping's best value of its monitored metric so far",
                                 labels=[*lab_names, "metric"])
        best_step = GaugeMetricFamily("traceml_run_early_stopping_best_step", "The step of early stopping's best",
                                      labels=[*lab_names, "metric"])
        for run in runs:
            fig, lab = figures[run.run_id], self._labels(run)
            if fig.step_ms is not None:
                step.add_metric(lab, fig.step_ms / 1000.0)
            source.add_metric(lab, 1.0 if fig.step_statistic.kind == "summary" else 0.0)
            if fig.slowest_rank is not None:
                slowest.add_metric(lab, fig.slowest_rank)
                verdict.add_metric(lab, 1.0 if fig.straggler else 0.0)
            if fig.eval_lag is not None:
                lag.add_metric(lab, fig.eval_lag)
            if (b := fig.best) is not None:
                metric = fig.early_stopping.metric if fig.early_stopping is not None else None
                best.add_metric([*lab, str(metric or "")], b[2])
                if b[1] is not None:
                    best_step.add_metric([*lab, str(metric or "")], b[1])
        yield from (step, source, slowest, verdict, lag, best, best_step)

    def _rank_families(self, reader: Reader, runs: list[RunSummary], now: float) -> Iterator:
        labels = ["run", "run_id", "rank"]
        median = GaugeMetricFamily("traceml_rank_step_time_median_seconds",
                                   "The rank's step time by the run's statistic: the median of its rolling window,"
                                   " or its mean over the current final summary's window", labels=labels)
        wait = GaugeMetricFamily("traceml_rank_input_wait_median_seconds",
                                 "Input wait before the rank's steps over the same steps (median, or the summary's"
                                 " mean)", labels=labels)
        silence = GaugeMetricFamily("traceml_rank_silence_seconds", "Seconds since the rank's newest record",
                                    labels=labels)
        # Only the current state (value 1): all seven per rank would be most of a 64-rank job's series.
        delta = GaugeMetricFamily("traceml_rank_step_time_delta_ratio",
                                  "The rank's step time over the median rank's, minus 1 (Δ)", labels=labels)
        state = GaugeMetricFamily("traceml_rank_state", "The rank's state (1; other states are absent)",
                                  labels=[*labels, "state"])
        for run in runs:
            for row in reader.rank_views(run, reader.rank_rows(run.run_id, now=now)):
                lab = [*self._labels(run), str(row.rank)]
                if row.step_ms is not None:
                    median.add_metric(lab, row.step_ms / 1000.0)
                if row.delta_pct is not None:
                    delta.add_metric(lab, row.delta_pct / 100.0)
                if row.input_wait_ms is not None:
                    wait.add_metric(lab, row.input_wait_ms / 1000.0)
                if row.state in _SILENT_STATES and (a := _age(now, row.last_seen or row.last_ts)) is not None:
                    silence.add_metric(lab, a)
                if row.state is not None:
                    state.add_metric([*lab, str(row.state)], 1.0)
        yield from (median, wait, delta, silence, state)

    def _hang_families(self, runs: list[RunSummary]) -> Iterator:
        """The ranks of a hang (core/hang.py): ``role="culprit"`` never reached the collective its peers wait
        in (``role="waiting"``); the culprit's innermost frame of the training code is a label (a file name
        relative to the script's folder and a line number: bounded, one series per hang)."""
        hang = GaugeMetricFamily("traceml_rank_hang", "1 for each rank of a hang: the culprit and the ranks waiting",
                                 labels=["run", "run_id", "rank", "role", "where"])
        for run in runs:
            if run.hang is None:
                continue
            frame = run.hang.frame or {}
            where = f"{frame.get('file')}:{frame.get('line')}" if frame else ""
            for rank in run.hang.culprits:
                hang.add_metric([*self._labels(run), str(rank), "culprit", where], 1.0)
            for rank in run.hang.waiting:
                hang.add_metric([*self._labels(run), str(rank), "waiting", ""], 1.0)
        yield hang

    def _backlog_families(self, backlogs: dict[int, tuple[BacklogItem, ...]], runs: list[RunSummary],
                          now: float) -> Iterator:
        backlog = GaugeMetricFamily("traceml_backlog_requests", "Validation requests by state",
                                    labels=["run", "run_id", "state"])
        oldest = GaugeMetricFamily("traceml_backlog_oldest_outstanding_age_seconds",
                                   "Age of the oldest request not yet completed", labels=["run", "run_id"])
        for run in runs:
            items = backlogs[run.run_id]
            if not items:
                continue
            lab = self._labels(run)
            for word in BacklogState:
                backlog.add_metric([*lab, str(word)], sum(1 for i in items if i.state is word))
            waiting = [i.created for i in items if i.outstanding and i.created is not None]  # core/backlog.py
            if waiting:
                oldest.add_metric(lab, max(0.0, now - min(waiting)))
        yield from (backlog, oldest)

    def _ingest_families(self, runs: list[RunSummary], now: float) -> Iterator:
        records = CounterMetricFamily("traceml_ingest_records", "Step records held by the index")
        records.add_metric([], float(sum(r.records for r in runs)))
        errors = CounterMetricFamily("traceml_ingest_errors", "Lines and files the daemon could not ingest")
        errors.add_metric([], float(sum(r.errors for r in runs)))
        seen = [r.last_seen for r in runs if r.last_seen is not None]
        commit = GaugeMetricFamily("traceml_index_last_commit_age_seconds",
                                   "Seconds since the newest record was committed to the index")
        if seen:
            commit.add_metric([], max(0.0, now - max(seen)))
        lag = GaugeMetricFamily("traceml_ingest_lag_seconds",
                                "Seconds between a run's newest record being written and being committed",
                                labels=["run", "run_id"])
        for run in runs:
            if run.status in LIVE_RUN_STATES and run.last_seen is not None and run.last_ts is not None:
                lag.add_metric(self._labels(run), max(0.0, run.last_seen - run.last_ts))
        yield from (records, errors, commit, lag)


def serve(index_path: str, host: str, port: int, retention_s: float = DEFAULT_RETENTION_S,
          stall_floor_s: Optional[float] = None):
    """Serve the metrics on ``host:port`` in a background thread; returns ``(server, thread)``."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(IndexCollector(index_path, retention_s, stall_floor_s=stall_floor_s))
    with shielded():  # its thread and each request's (started from it) leave signals to the main thread
        return start_http_server(port, addr=host, registry=registry)
