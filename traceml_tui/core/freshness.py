"""Eval freshness: the newest evaluated step and how far training is ahead of it — one rule for every surface.

An evaluation is *completed* when an ``eval`` record says ``status: completed`` or a validation request has
its receipt (docs/hygiene.md: a receipt is the only result a request has). The newest evaluated step is the
highest step among completed evaluations; the lag is the training step minus it, never below 0 (an eval of a
step training has not reported yet — a rank behind another — is no negative lag). The summary's
``training.eval``, the Runs table's ``@S −L``, the Backlog screen's lag, ``traceml validate status`` and the
index reader all take these figures from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional


@dataclass(frozen=True)
class Evaluated:
    """One completed evaluation: the step it evaluated and its checkpoint (None when it names none)."""

    step: int
    checkpoint: Optional[str] = None


@dataclass(frozen=True)
class EvalFreshness:
    """The newest completed evaluation and the training step it is measured against."""

    newest_step: Optional[int] = None
    newest_checkpoint: Optional[str] = None
    train_step: Optional[int] = None

    @property
    def lag_steps(self) -> Optional[int]:
        """Steps training is ahead of the newest evaluation (:func:`eval_lag`)."""
        return eval_lag(self.train_step, self.newest_step)


def eval_lag(train_step: Optional[int], newest_step: Optional[int]) -> Optional[int]:
    """``train_step - newest_step``, at least 0; None when either is unknown."""
    if train_step is None or newest_step is None:
        return None
    return max(0, train_step - newest_step)


def newest(evaluated: Iterable[Evaluated]) -> Optional[Evaluated]:
    """The completed evaluation of the highest step (the first one of that step as given), or None."""
    best: Optional[Evaluated] = None
    for e in evaluated:
        if best is None or e.step > best.step:
            best = e
    return best


def eval_freshness(train_step: Optional[int], evaluated: Iterable[Evaluated]) -> EvalFreshness:
    """The freshness of a run at ``train_step`` given its completed evaluations (eval records and receipts)."""
    top = newest(evaluated)
    return EvalFreshness(top.step if top else None, top.checkpoint if top else None, train_step)


__all__ = ["EvalFreshness", "Evaluated", "eval_freshness", "eval_lag", "newest"]
