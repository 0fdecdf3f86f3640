"""The one canonical learning curve: ``<run_dir>/learning_curve.png`` (seed 004).

One renderer, one stable file, refreshed atomically from recorded
measurements during training and after asynchronous evaluations finish:

* top panel — each loss component's scale-free ratio (value / mean square of its
  own target) with the 1.0 no-skill line and a smoothed trend, so a model that
  is not learning is visible; the physical loss is shown only when no ratio
  was recorded, and labelled as such;
  Validation losses sit beside them as distinct series in the same units: a
  validation metric ``<component>_ratio`` is that component's scale-free ratio
  on validation data (physical validation ``loss`` values only beside a
  physical training loss);
* bottom panel — the task metrics only, on training data (step records'
  ``metrics``) and on validation (receipts and completed ``eval`` records), with
  pending and failed evaluations marked explicitly and the newest completed
  checkpoint marked. Loss quantities never land here (:func:`is_loss_metric`).

The x axis counts optimizer updates; examples seen are given in the axis label.
Each attempt (a resume) is drawn as its own line, never joined to the previous
one. Matplotlib is imported inside the renderer so importing this package
stays cheap.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from traceml_tui.core import jsonl, records
from traceml_tui.core.atomic import atomic_write_bytes
from traceml_tui.core.rundir import RunDir
from traceml_tui.core.state import BacklogState
from traceml_tui.hygiene import backlog

#: Points drawn per series at most; longer series are averaged per bucket.
MAX_POINTS = 1500
#: Evaluations drawn as failed: an eval record's ``failed``, a backlog request ``failed`` or ``blocked``.
_FAILED = frozenset({BacklogState.FAILED.value, BacklogState.BLOCKED.value})


@dataclass
class AttemptSeries:
    """Columns of one attempt's rank-0 step records (lists of equal length per key)."""

    attempt: int
    steps: list[int] = field(default_factory=list)
    examples: list[Optional[int]] = field(default_factory=list)
    loss: list[Optional[float]] = field(default_factory=list)
    ratios: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    train_metrics: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


@dataclass
class CurveData:
    run: str
    attempts: list[AttemptSeries]
    evals: list[dict]  # {checkpoint, step, metrics} completed evaluations
    unfinished: list[dict]  # {checkpoint, step, state} evaluations without a result (eval status or BacklogState word)
    early_stopping: Optional[dict] = None  # persisted early_stopping.json, when present

    @property
    def updates(self) -> int:
        return max((a.steps[-1] for a in self.attempts if a.steps), default=0)


def load_curve_data(run_dir: Path) -> CurveData:
    """Read rank 0's step/eval records and the validation backlog into plain columns."""
    run_dir = Path(run_dir)
    run_name = run_dir.name
    attempts: list[AttemptSeries] = []
    eval_records: dict[str, dict] = {}
    unfinished_records: dict[str, dict] = {}
    layout = RunDir(run_dir)
    for attempt, path in [(s.attempt, s.path) for s in layout.step_files(rank=0)]:
        series = AttemptSeries(attempt=attempt)
        # complete lines only; a damaged line is an ingest error elsewhere, not a reason to lose the curve
        for rec in jsonl.file_records(path):
            if isinstance(rec, records.Header):
                run_name = rec.run or run_name
            elif isinstance(rec, records.Step):
                _add_step(series, rec)
            elif isinstance(rec, records.Eval) and rec.role != "train":
                key = rec.checkpoint or f"step-{rec.step}"
                if rec.status == "completed":
                    eval_records[key] = {"checkpoint": key, "step": rec.step, "metrics": dict(rec.metrics)}
                    unfinished_records.pop(key, None)
                elif key not in eval_records:
                    unfinished_records[key] = {"checkpoint": key, "step": rec.step, "state": rec.status}
        if series.steps:
            attempts.append(series)

    # The backlog is authoritative for checkpoint evaluations: a receipt is a result,
    # a request without one is pending (or failed), never a result.
    status = backlog.backlog_status(run_dir)
    evals = dict(eval_records)
    unfinished = dict(unfinished_records)
    for row in status["requests"]:
        if row["state"] == BacklogState.COMPLETED:
            evals[row["checkpoint"]] = {"checkpoint": row["checkpoint"], "step": row["step"], "metrics": row.get("metrics", {})}
            unfinished.pop(row["checkpoint"], None)
        elif row["checkpoint"] not in evals:
            unfinished[row["checkpoint"]] = {"checkpoint": row["checkpoint"], "step": row["step"], "state": row["state"]}
    key = lambda item: (item["step"] if isinstance(item["step"], int) else -1, item["checkpoint"])  # noqa: E731
    return CurveData(run=run_name, attempts=attempts, evals=sorted(evals.values(), key=key),
                     unfinished=sorted(unfinished.values(), key=key),
                     early_stopping=backlog.read_early_stopping(layout.early_stopping))


def _add_step(series: AttemptSeries, rec: records.Step) -> None:
    step = rec.step
    series.steps.append(step)
    series.examples.append(rec.examples)
    series.loss.append(records.finite_or_none(rec.loss))
    if rec.components:
        for name, comp in rec.components.items():
            ratio = records.finite_or_none(comp.ratio)
            if ratio is None:
                value, target = records.finite_or_none(comp.value), records.finite_or_none(comp.target_ms)
                if value is not None and target:
                    ratio = value / target
            if ratio is not None:
                series.ratios.setdefault(name, []).append((step, ratio))
    if rec.metrics:
        for name, value in rec.metrics.items():
            number = records.finite_or_none(value)
            if number is not None:
                series.train_metrics.setdefault(name, []).append((step, number))


# --------------------------------------------------------------------------- loss vs task metrics

#: Suffix of a validation metric that is a component's scale-free ratio (``mse_ratio``: value / target mean square).
RATIO_SUFFIX = "_ratio"


def component_names(data: CurveData) -> set[str]:
    """The loss components the training history records."""
    return {name for series in data.attempts for name in series.ratios}


def is_loss_metric(name: str, components: set[str]) -> bool:
    """Whether an evaluation metric is a loss (top panel), not a task metric (bottom panel).

    ``<x>_ratio`` (a scale-free ratio), ``loss`` and a loss component's own name
    (its physical value) are losses.
    """
    return name.endswith(RATIO_SUFFIX) or name == "loss" or name in components


def eval_points(data: CurveData, name: str) -> list[tuple[int, float]]:
    """(step, value) of one metric over the completed evaluations, in checkpoint order."""
    out = []
    for e in data.evals:
        value = records.finite_or_none(e["metrics"].get(name))
        if isinstance(e["step"], int) and value is not None:
            out.append((e["step"], value))
    return out


# --------------------------------------------------------------------------- numeric helpers


def downsample(xs, ys, max_points: int = MAX_POINTS):
    """Bucket means so a series has at most ``max_points`` points (keeps first/last extent)."""
    import numpy as np

    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    n = len(x)
    if n <= max_points:
        return x, y
    edges = np.linspace(0, n, max_points + 1).astype(int)
    counts = np.diff(edges)
    keep = counts > 0
    sx = np.add.reduceat(x, edges[:-1][keep]) / counts[keep]
    sy = np.add.reduceat(y, edges[:-1][keep]) / counts[keep]
    return sx, sy


def smooth(ys, window: Optional[int] = None):
    """Trailing moving average (window ~ n/25, at least 1) over the full-resolution series."""
    import numpy as np

    y = np.asarray(ys, dtype=float)
    n = len(y)
    if n == 0:
        return y
    w = window or max(1, min(500, n // 25))
    csum = np.cumsum(np.insert(y, 0, 0.0))
    out = np.empty(n)
    idx = np.arange(1, n + 1)
    lo = np.maximum(0, idx - w)
    out[:] = (csum[idx] - csum[lo]) / (idx - lo)
    return out


# --------------------------------------------------------------------------- rendering


def render_learning_curve(run_dir: Path, out: Optional[Path] = None) -> Path:
    """Render ``<run_dir>/learning_curve.png`` (or ``out``) atomically; returns the path written.

    Handles any number of updates (0 gives an explicit "no updates yet" figure);
    long series are downsampled for speed.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    out = Path(out) if out is not None else RunDir(run_dir).learning_curve
    data = load_curve_data(run_dir)
    fig = build_figure(data, Figure)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    atomic_write_bytes(out, buf.getvalue())
    return out


def build_figure(data: CurveData, figure_cls):
    """The curve's matplotlib figure for ``data`` (two panels: losses on top, task metrics below)."""
    fig = figure_cls(figsize=(10, 8), dpi=100)
    ax_loss, ax_task = fig.subplots(2, 1, sharex=True)
    _draw_loss(ax_loss, data)
    _draw_task(ax_task, data)
    ax_task.set_xlabel(_x_label(data))
    newest = data.evals[-1] if data.evals else None
    title = f"{data.run} · learning curve · {data.updates} optimizer updates"
    if newest is not None:
        title += f" · newest eval {newest['checkpoint']}"
    pending = sum(1 for u in data.unfinished if u["state"] not in _FAILED)
    failed = sum(1 for u in data.unfinished if u["state"] in _FAILED)
    if pending or failed:
        title += f" · {pending} pending, {failed} failed"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def _x_label(data: CurveData) -> str:
    label = "optimizer updates"
    last = None
    for series in data.attempts:
        for step, examples in zip(series.steps, series.examples):
            if examples is not None:
                last = (step, examples)
    if last is not None:
        label += f"   (examples seen: {last[1]:,} at update {last[0]:,})"
    else:
        label += "   (examples seen: not recorded)"
    return label


def _colors():
    return ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]


def _marker_for(n: int) -> Optional[str]:
    return "o" if n <= 60 else None


def _mark_attempts(ax, data: CurveData) -> None:
    for series in data.attempts[1:]:
        ax.axvline(series.steps[0], color="0.5", linestyle=":", linewidth=1)
        ax.annotate(f"resume (attempt {series.attempt})", xy=(series.steps[0], 1.0), xycoords=("data", "axes fraction"),
                    xytext=(2, -10), textcoords="offset points", fontsize=7, color="0.4")


def _draw_loss(ax, data: CurveData) -> None:
    colors = _colors()
    names = sorted(component_names(data))
    ax.set_title("loss: scale-free ratio per component (value / mean square of its target); "
                 "train (solid) and eval (dashed, per checkpoint)", fontsize=9, loc="left")
    if not data.attempts:
        ax.text(0.5, 0.5, "no optimizer updates recorded yet", ha="center", va="center", transform=ax.transAxes, color="0.4")
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="no skill (predict 0) = 1.0")
        ax.set_ylim(0, 2)
        ax.legend(loc="upper right", fontsize=7)
        return
    if names:
        positive = True
        for i, name in enumerate(names):
            color = colors[i % len(colors)]
            for j, series in enumerate(data.attempts):
                points = series.ratios.get(name)
                if not points:
                    continue
                xs, ys = zip(*points)
                positive = positive and min(ys) > 0
                first = j == 0 or not any(s.ratios.get(name) for s in data.attempts[:j])
                dx, dy = downsample(xs, ys)
                ax.plot(dx, dy, color=color, alpha=0.3, linewidth=0.8, marker=_marker_for(len(dx)), markersize=3,
                        label=f"{name} ratio" if first else None)
                tx, ty = downsample(xs, smooth(ys))
                ax.plot(tx, ty, color=color, linewidth=2.0, marker=_marker_for(len(tx)), markersize=4,
                        label=f"{name} trend" if first else None)
            evals = eval_points(data, name + RATIO_SUFFIX)
            if evals:
                xs, ys = zip(*evals)
                positive = positive and min(ys) > 0
                ax.plot(xs, ys, color=color, linestyle="--", linewidth=1.5, marker="s", markersize=6,
                        markeredgecolor="black", zorder=5, label=f"{name} eval ratio")
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="no skill (predict 0) = 1.0")
        ax.set_ylabel("loss / target mean square")
        lo, hi = ax.get_ylim()
        if positive and hi / max(lo, 1e-12) > 50:
            ax.set_yscale("log")
    else:
        # No ratio was recorded: show the physical loss, labelled so it is not taken for evidence of fit.
        for j, series in enumerate(data.attempts):
            pts = [(s, v) for s, v in zip(series.steps, series.loss) if v is not None]
            if not pts:
                continue
            xs, ys = zip(*pts)
            dx, dy = downsample(xs, ys)
            ax.plot(dx, dy, color="tab:gray", alpha=0.4, marker=_marker_for(len(dx)), markersize=3,
                    label="total loss" if j == 0 else None)
            tx, ty = downsample(xs, smooth(ys))
            ax.plot(tx, ty, color="black", linewidth=1.8, marker=_marker_for(len(tx)), markersize=4,
                    label="total loss trend" if j == 0 else None)
        evals = eval_points(data, "loss")
        if evals:
            xs, ys = zip(*evals)
            ax.plot(xs, ys, color="black", linestyle="--", linewidth=1.5, marker="s", markersize=6,
                    markerfacecolor="white", zorder=5, label="eval loss")
        ax.set_ylabel("loss (physical units)")
        ax.text(0.01, 0.02, "no scale-free ratio recorded: physical units are not evidence of fit",
                transform=ax.transAxes, fontsize=7, color="tab:red")
    _mark_attempts(ax, data)
    _mark_newest(ax, data, label=False)
    ax.legend(loc="upper right", fontsize=7)


def _mark_newest(ax, data: CurveData, *, label: bool) -> None:
    if not data.evals:
        return
    newest = data.evals[-1]
    if not isinstance(newest["step"], int):
        return
    ax.axvline(newest["step"], color="tab:green", linestyle="-.", linewidth=1,
               label=f"newest completed eval: {newest['checkpoint']}" if label else None)


def _mark_early_stopping(ax, data: CurveData) -> None:
    state = data.early_stopping
    if not state:
        return
    if isinstance(state.get("best_step"), int):
        ax.axvline(state["best_step"], color="tab:purple", linestyle=":", linewidth=1.2,
                   label=f"selected best: {state.get('best_checkpoint')}")
    if state.get("stopped") and isinstance(state.get("trigger_step"), int):
        # Drawn at the stop's update and labelled with it; a budget stop has no trigger checkpoint.
        ckpt = state.get("trigger_checkpoint")
        ax.axvline(state["trigger_step"], color="tab:red", linestyle=":", linewidth=1.2,
                   label=f"early stop ({state.get('reason')}) at update {state['trigger_step']}"
                         + (f" ({ckpt})" if ckpt else ""))


def _draw_task(ax, data: CurveData) -> None:
    from matplotlib.transforms import blended_transform_factory

    colors = _colors()
    ax.set_title("task metrics: train (solid) and eval (dashed, per checkpoint)", fontsize=9, loc="left")
    losses = component_names(data)
    names = sorted(n for n in {n for s in data.attempts for n in s.train_metrics} | {n for e in data.evals for n in e["metrics"]}
                   if not is_loss_metric(n, losses))
    drew = False
    for i, name in enumerate(names):
        color = colors[i % len(colors)]
        for j, series in enumerate(data.attempts):
            points = series.train_metrics.get(name)
            if not points:
                continue
            xs, ys = zip(*points)
            first = not any(s.train_metrics.get(name) for s in data.attempts[:j])
            dx, dy = downsample(xs, ys)
            ax.plot(dx, dy, color=color, linewidth=0.8, alpha=0.3, marker=_marker_for(len(dx)), markersize=3,
                    label=f"{name} train" if first else None)
            tx, ty = downsample(xs, smooth(ys))
            ax.plot(tx, ty, color=color, linewidth=1.8, marker=_marker_for(len(tx)), markersize=3,
                    label=f"{name} train trend" if first else None)
            drew = True
        pts = eval_points(data, name)
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, color=color, linestyle="--", linewidth=1.5, marker="s", markersize=6,
                    markeredgecolor="black", zorder=5, label=f"{name} eval")
            drew = True
    marker_tf = blended_transform_factory(ax.transData, ax.transAxes)
    pending = [u for u in data.unfinished if isinstance(u["step"], int) and u["state"] not in _FAILED]
    failed = [u for u in data.unfinished if isinstance(u["step"], int) and u["state"] in _FAILED]
    if pending:
        ax.plot([u["step"] for u in pending], [0.04] * len(pending), transform=marker_tf, linestyle="none",
                marker="^", markersize=8, markerfacecolor="none", color="tab:orange", label=f"eval pending ({len(pending)})")
        ax.annotate("pending", xy=(pending[-1]["step"], 0.04), xycoords=marker_tf, xytext=(4, 6),
                    textcoords="offset points", fontsize=7, color="tab:orange")
    if failed:
        ax.plot([u["step"] for u in failed], [0.04] * len(failed), transform=marker_tf, linestyle="none",
                marker="x", markersize=8, color="tab:red", label=f"eval failed ({len(failed)})")
    _mark_attempts(ax, data)
    _mark_newest(ax, data, label=True)
    _mark_early_stopping(ax, data)
    if not drew:
        msg = "no task metrics recorded yet" if not pending else "no task metrics yet: evaluations pending"
        ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_ylabel("task metric")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=7)
    if data.updates == 0 and not data.evals and not data.unfinished:
        ax.set_xlim(0, 1)

