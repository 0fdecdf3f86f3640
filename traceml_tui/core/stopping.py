"""The early-stopping policy's own state, as every reader shows it (docs/hygiene.md "Early stopping").

``early_stopping.json`` is written by the policy (:mod:`traceml_tui.hygiene.early_stopping`) after every
change and decoded by :func:`traceml_tui.core.hygiene_files.decode_early_stopping`. :func:`stopping_view`
turns the decoded state into the figures a surface shows — the best value and where it was reached, the
patience used, whether it stopped and why, and the policy's own ``min_delta`` and warm-up — so that no
surface judges "best" by a rule of its own: the policy's best already weighs ``min_delta``, the warm-up and
the config digest of each receipt. The daemon indexes the file (``daemon/early_stopping.py``) and
``Reader.early_stopping`` returns this view; the file side reads the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from traceml_tui.core.hygiene_files import EarlyStoppingState


@dataclass(frozen=True)
class StoppingView:
    """The policy and where it stands (all figures as ``early_stopping.json`` holds them)."""

    enabled: bool
    metric: Optional[str]
    direction: Optional[str]  # min | max
    min_delta: Optional[float]
    warmup: Optional[int]  # updates before an evaluation counts
    patience: Optional[int]
    max_budget: Optional[int]
    disabled_reason: Optional[str]
    best_value: Optional[float]
    best_step: Optional[int]
    best_checkpoint: Optional[str]
    patience_used: int  # eligible evaluations since the best without improvement
    evaluations: int  # eligible evaluations counted
    stopped: bool
    reason: Optional[str]  # patience_exhausted | max_budget (when stopped)
    trigger_checkpoint: Optional[str]
    trigger_step: Optional[int]
    after_stop_steps: tuple[Optional[int], ...]  # checkpoints consumed after the stop, not counted
    skipped: tuple[tuple[Optional[str], Optional[int], Optional[str]], ...]  # blocked checkpoints consumed
    # without counting: (checkpoint, step, reason)
    missing_metric: int  # completed evaluations without the monitored metric
    missing_metric_names: tuple[str, ...]  # the metric names those evaluations had
    updated: Optional[float]

    @property
    def patience_left(self) -> Optional[int]:
        return None if self.patience is None else max(0, self.patience - self.patience_used)

    @property
    def state(self) -> str:
        """:func:`state_word` of this state."""
        return state_word(recorded=True, stopped=self.stopped, enabled=self.enabled)


def state_word(*, recorded: bool, stopped: bool, enabled: bool) -> str:
    """The summary's ``early_stopping.state`` word: ``stopped``; else ``disabled`` for a policy that opted out;
    else ``not-stopped`` once the policy recorded a state, ``not-recorded`` before it did."""
    if stopped:
        return "stopped"
    if not enabled:
        return "disabled"
    return "not-stopped" if recorded else "not-recorded"


def stopping_view(state: EarlyStoppingState) -> StoppingView:
    """The view of a decoded ``early_stopping.json`` (pure)."""
    policy = state.policy
    names = sorted({str(n) for e in state.missing_metric for n in e.metrics or ()} - {str(policy.metric)})
    return StoppingView(
        enabled=policy.enabled, metric=policy.metric or None, direction=policy.direction,
        min_delta=policy.min_delta, warmup=policy.warmup, patience=policy.patience, max_budget=policy.max_budget,
        disabled_reason=None if policy.enabled else policy.reason,
        best_value=state.best_metric, best_step=state.best_step, best_checkpoint=state.best_checkpoint,
        patience_used=state.patience_counter, evaluations=state.evaluations, stopped=state.stopped,
        reason=state.reason if state.stopped else None, trigger_checkpoint=state.trigger_checkpoint,
        trigger_step=state.trigger_step, after_stop_steps=tuple(e.step for e in state.after_stop),
        skipped=tuple((e.checkpoint, e.step, e.reason) for e in state.skipped), missing_metric=len(state.missing_metric), missing_metric_names=tuple(names),
        updated=state.updated,
    )


__all__ = ["StoppingView", "state_word", "stopping_view"]
