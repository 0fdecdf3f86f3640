"""The reader's views laid out as the screens' snapshots (pure: no I/O, no figure of its own).

:class:`traceml_tui.tui.source.IndexSource` fetches views from
:class:`daemon.reader.Reader` and hands them here; every number and state on a
snapshot is the view's (docs/contracts.md, "One set of figures"). What is left
to this module is layout: a run's folder name, which series a chart shows, the
words of a note.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Optional

from traceml_tui.core import steptime
from traceml_tui.core.state import BacklogState, RankState
from traceml_tui.tui.snapshots import (
    BacklogItem,
    CompareSnapshot,
    DescribeSnapshot,
    EarlyStoppingInfo,
    FieldVerdict,
    NodeMetrics,
    Outcome,
    RankRow,
    RunRow,
    Series,
)
from traceml_tui.tui.textplot import duration


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@functools.lru_cache(maxsize=4096)  # pure, and asked for every run on every refresh
def run_folder(run_dir: str, root: str, name: str) -> str:
    """Where a run lives, from its root's own name: ``logs/exp1``.

    When the run's folder is not named as the run, the folder itself is named
    (``logs/exp1/dir``), so two runs of the same name always read apart.
    """
    base = os.path.dirname(root.rstrip("/")) or "/"
    where = run_dir if os.path.basename(run_dir) != name else os.path.dirname(run_dir)
    try:
        return os.path.relpath(where, base)
    except ValueError:  # another drive (Windows): the folder's own name
        return os.path.basename(where)


def empty_note(health: Any) -> str:
    """What an empty Runs list says: that the writer does not index this watch's roots, when it does not (its
    runs may well be there), else that nothing was found."""
    unwatched = getattr(health, "unwatched", ())
    if unwatched:
        return (f"{', '.join(unwatched)} not indexed: {health.who()} writes this index for other roots — restart it "
                f"with these roots too, or watch them with another --index")
    return "nothing under the watched roots; start a run with `traceml run`"


def run_row(run: Any, figures: Any, *, workload: Optional[str], trend: tuple[float, ...], backlog: int) -> RunRow:
    """One line of the Runs screen: the reader's summary and figures (daemon/views.py)."""
    return RunRow(
        run_id=run.run_id, name=run.name, status=run.status, silent_ranks=run.silent_ranks,
        explaining_ranks=run.explaining_ranks, lost_nodes=run.lost_nodes, first_failed=run.first_failed,
        workload=workload, nodes=run.nnodes, procs_per_node=run.nproc_per_node or (run.ranks or None),
        step=run.last_step, declared_steps=figures.declared_steps, median_step_ms=figures.step_ms, trend=trend,
        # the rates as of this refresh (the run's, by daemon/rates.py; ``figures`` are cached per run version and a
        # paused run's rate falls without a new version)
        steps_per_s=run.steps_per_s, examples_per_s=run.examples_per_s, loss_ratio=figures.loss_ratio,
        eval_step=figures.eval_step, eval_lag=figures.eval_lag, backlog=backlog, errors=run.errors or 0,
        last_ts=run.last_ts, folder=run_folder(run.dir, run.root, run.name), dir=run.dir,
        slowest_rank=figures.slowest_rank, straggler_score=figures.straggler_score,
        straggler_pct=figures.straggler_pct, straggler=figures.straggler, step_statistic=figures.step_statistic,
        marks=run.marks, attention=run.attention,
        validation_mark=run.validation_mark,
        quiet_ranks=tuple(r for r, _ in run.quiet_ranks),
        interrupted_by=run.interrupted_by, interrupted_at=run.interrupted_at,
        age=duration(run.age_s), duration=duration(run.duration_s),
        age_s=run.age_s, duration_s=run.duration_s)


def rank_row(r: Any, now: float, quiet: tuple[int, ...] = ()) -> RankRow:
    """One rank of the Run screen: its median step time and Δ are the view's; the parts the window's means."""
    return RankRow(
        rank=r.rank, attempt=r.attempt, node=r.node, step=r.last_step, step_ms=r.step_ms,
        parts=tuple((r.parts or {}).get(name) for name in steptime.PART_NAMES), delta_pct=r.delta_pct,
        silent_s=None if r.last_ts is None else max(0.0, now - r.last_ts),
        silent=r.state in (RankState.STALLED, RankState.LOST), ended=r.ended, state=r.state, quiet=r.rank in quiet)


def early_stopping_info(view: Any) -> Optional[EarlyStoppingInfo]:
    """The reader's early stopping (daemon/views.py) as the panel's snapshot, with the notes in hygiene's words."""
    from traceml_tui.hygiene.report import (  # the wording's one home
        early_stopping_notes,
        missing_metric_note,
        skipped_note,
    )

    if view is None:
        return None
    if view.source == "summary":
        notes = tuple(early_stopping_notes(view.recorded))
    else:
        skipped = [{"checkpoint": c, "step": st, "reason": r} for c, st, r in view.skipped]
        notes = tuple(([skipped_note(skipped)] if skipped else [])
                      + ([missing_metric_note(view.metric, view.lacking, view.lacking_metrics)] if view.lacking else []))
    return EarlyStoppingInfo(
        enabled=view.enabled, source=view.source, metric=view.metric, direction=view.direction,
        patience=view.patience, patience_used=view.patience_used, evaluations=view.evaluations, state=view.state,
        reason=view.reason, trigger_checkpoint=view.trigger_checkpoint, trigger_step=view.trigger_step,
        best_checkpoint=view.best_checkpoint, best_step=view.best_step, best_value=view.best_value,
        receipts=view.receipts, after_stop_steps=view.after_stop_steps, notes=notes,
        min_delta=view.min_delta, warmup=view.warmup)


def nodes(samples: Any) -> tuple[NodeMetrics, ...]:
    """The newest system sample of each node."""
    latest: dict[int, Any] = {}
    for sample in samples:
        latest[sample.node] = sample
    out = []
    for node in sorted(latest):
        s = latest[node]
        gpus = tuple((int(g.get("index", 0)), _num(g.get("util_pct")), g.get("mem_used"), g.get("mem_total"))
                     for g in s.gpus if isinstance(g, dict))
        out.append(NodeMetrics(node, s.ts, s.cpu_pct, s.ram_used, s.ram_total, gpus))
    return tuple(out)


def points_series(name: str, series: Any) -> Series:
    """A reader Series (buckets with min/max/mean) as a chart's series."""
    pts = series.points
    return Series(name, tuple((p.step_lo + p.step_hi) / 2.0 for p in pts), tuple(p.mean for p in pts),
                  tuple(p.vmin for p in pts), tuple(p.vmax for p in pts))


def outcomes(items: Any) -> tuple[Outcome, ...]:
    """Guard outcomes per node with their reason codes."""
    out = []
    for o in items:
        status = o.status or ("invalid" if o.error else "unknown")
        reasons = ("node_training_failed",) if status == "failed" else (("node_outcome_invalid",) if o.error else ())
        out.append(Outcome(o.node if o.node is not None else -1, status, o.exit_code, reasons))
    return tuple(out)


def backlog_item(run: str, b: Any, now: float, kind: str = "validation") -> BacklogItem:
    """A reader backlog item in the screen's terms (the state is the reader's, decided in the core); ``kind``:
    its backlog, ``validation`` or ``qc``."""
    claimed = b.state in (BacklogState.CLAIMED, BacklogState.STALE_CLAIM)
    return BacklogItem(
        run=run, checkpoint=b.checkpoint, step=b.step, state=b.state,
        age_s=None if b.created is None else now - b.created, owner=b.owner if claimed else None,
        heartbeat_age_s=None if b.heartbeat is None or not claimed else now - b.heartbeat,
        lease_s=b.lease_s if claimed else None, retries=b.failures,
        stuck=b.state is BacklogState.STALE_CLAIM, last_error=b.last_error, metrics=b.metrics,
        attempts=b.attempts, kind=kind)


def field_verdicts(events: Any) -> tuple[FieldVerdict, ...]:
    """Field-collapse verdicts from the index's field_stats events (the same rule as the summary's)."""
    if not events:
        return ()
    import msgspec

    from traceml_tui.core import records
    from traceml_tui.hygiene.field_qc import summarize_records

    parsed = []
    for event in events:
        try:
            parsed.append(msgspec.convert(dict(event.body, kind="field_stats"), records.FieldStats))
        except (msgspec.ValidationError, TypeError):
            continue
    fields = summarize_records(parsed)["fields"]
    return tuple(
        FieldVerdict(name=name, status=v["status"], qc_points=v["qc_points"], failed_at_step=v["failed_at_step"],
                     latest_step=v["latest_step"], latest_spread_ratio=v["latest_spread_ratio"], factor=v["factor"])
        for name, v in fields.items()
    )


def compare_snapshot(reference: dict, candidate: dict, threshold_pct: Optional[float],
                     labels: tuple[str, str]) -> CompareSnapshot:
    """The same comparison as `traceml compare`, laid out by :mod:`traceml_tui.compare.screen` for the screen."""
    from traceml_tui.compare.screen import comparison_rows
    from traceml_tui.tui.textplot import fmt_num

    c = comparison_rows(reference, candidate, threshold_pct, labels, fmt_num)
    return CompareSnapshot(
        reference=labels[0], candidate=labels[1], threshold_pct=threshold_pct, result=c.result,
        exit_code=c.exit_code, reason_code=c.reason_code, reason=c.reason, rows=c.rows, diagnoses=c.diagnoses,
        warnings=c.warnings, report=c.report)


def describe_snapshot(run: Any, manifest: Any, content: Optional[bytes]) -> DescribeSnapshot:
    """The Describe screen: the run's typed manifest and its final summary's declaration and environment."""
    import json

    import msgspec

    summary: Any = None
    if content is not None:
        try:
            summary = json.loads(content)
        except ValueError:
            summary = None
    summary = summary if isinstance(summary, dict) else {}
    context = summary.get("run_context") if isinstance(summary.get("run_context"), dict) else {}
    declaration, environment = context.get("declaration"), summary.get("environment")
    return DescribeSnapshot(
        run_id=run.run_id, name=run.name, status=run.status, folder=run_folder(run.dir, run.root, run.name),
        manifest=msgspec.to_builtins(manifest) if manifest is not None else None,
        declaration=declaration if isinstance(declaration, dict) else None,
        environment=environment if isinstance(environment, dict) else None, has_summary=content is not None,
        duration_s=getattr(run, "duration_s", None))
