"""Validation-based early stopping over the asynchronous backlog (seed 004).

Rules implemented here:

* Evaluations are consumed strictly in checkpoint order (step, publication
  time, id). Consumption stops at the first request without a receipt: a
  pending or failed evaluation is never counted as a non-improvement and is
  never skipped.
* Patience counts completed *eligible* evaluations; a checkpoint before
  ``warmup`` optimizer updates is consumed but not eligible (it neither sets the
  best nor counts against patience).
* State (best metric, best checkpoint, patience counter, consumed evaluations,
  stopping reason and triggering checkpoint) lives in
  ``<run_dir>/early_stopping.json``, written atomically after every change, so
  a resumed run neither resets patience nor consumes an evaluation twice.
* ``max_budget`` stops the run once that many optimizer updates completed.
* Once stopped, the decision is final and its state (best, patience counter,
  evaluations, reason, trigger) stays as it was at the stop. Receipts of
  checkpoints after the stop (published before training noticed, drained
  later) are consumed once and listed in ``after_stop`` without being counted.
  A budget stop is no verdict on evaluations: checkpoints at or before the
  budget's update still count when drained later, until patience would have
  run out.

Distributed runs: :meth:`EarlyStopping.should_stop` is a collective. Every rank
calls it at the same step; rank 0 alone reads the backlog, updates and persists
the state, and broadcasts its decision with ``torch.distributed`` (when
initialized), so all ranks stop at the same step.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Optional

from traceml_tui.core.atomic import atomic_write_json
from traceml_tui.core.rundir import EARLY_STOPPING, RunDir
from traceml_tui.hygiene import backlog

STATE_FILE = EARLY_STOPPING  # relative to the run directory
STATE_VERSION = 1
#: Fields of the policy frozen into the state on first use; a resume must match them.
_POLICY = ("metric", "direction", "min_delta", "patience", "warmup", "max_budget")


class EarlyStopping:
    """Early stopping driven by validation receipts of ``run_dir``.

    ``metric``: key in the receipt's ``metrics``; ``direction``: ``min`` or
    ``max``; ``min_delta``: improvement required over the best; ``patience``:
    completed eligible evaluations without improvement before stopping;
    ``warmup``: updates before evaluations become eligible; ``max_budget``:
    updates after which the run stops regardless. ``enabled=False`` (with a
    ``reason``) records that a fixed-duration protocol opted out.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        metric: str = "",
        direction: str = "min",
        min_delta: float = 0.0,
        patience: int = 1,
        warmup: int = 0,
        max_budget: Optional[int] = None,
        enabled: bool = True,
        reason: Optional[str] = None,
        config_digest: Optional[str] = None,
    ) -> None:
        if enabled:
            if direction not in ("min", "max"):
                raise ValueError(f"direction must be min or max, got {direction!r}")
            if not metric:
                raise ValueError("metric is required")
            if patience < 1:
                raise ValueError("patience must be >= 1")
            if min_delta < 0:
                raise ValueError("min_delta must be >= 0")
        elif not reason:
            raise ValueError("disabling early stopping requires a reason")
        self.run_dir = Path(run_dir)
        self.path = RunDir(self.run_dir).early_stopping
        self.config_digest = config_digest
        self.policy = {
            "enabled": enabled,
            "reason": reason,
            "metric": metric,
            "direction": direction,
            "min_delta": float(min_delta),
            "patience": int(patience),
            "warmup": int(warmup),
            "max_budget": None if max_budget is None else int(max_budget),
        }
        self.state = self._load()

    @classmethod
    def from_config(cls, run_dir: Path, hygiene_cfg: dict) -> "EarlyStopping":
        """Build from the normalized config returned by ``parse_hygiene`` (or its ``early_stopping`` block)."""
        from traceml_tui.hygiene.config import validation_config_digest

        block = hygiene_cfg.get("early_stopping", hygiene_cfg)
        digest = validation_config_digest(hygiene_cfg) if "validation" in hygiene_cfg else None
        if not block.get("enabled", True):
            return cls(run_dir, enabled=False, reason=block.get("reason"), max_budget=block.get("max_budget"),
                       config_digest=digest)
        return cls(
            run_dir,
            metric=block["metric"],
            direction=block["direction"],
            min_delta=block["min_delta"],
            patience=block["patience"],
            warmup=block.get("warmup", 0),
            max_budget=block.get("max_budget"),
            config_digest=digest,
        )

    # ------------------------------------------------------------------ state

    def _fresh_state(self) -> dict:
        return {
            "version": STATE_VERSION,
            "policy": dict(self.policy),
            "best_metric": None,
            "best_checkpoint": None,
            "best_step": None,
            "patience_counter": 0,
            "evaluations": 0,
            "last_consumed": None,
            "consumed": [],
            "after_stop": [],
            "stopped": False,
            "reason": None,
            "trigger_checkpoint": None,
            "trigger_step": None,
            "updated": time.time(),
        }

    def _load(self) -> dict:
        state = backlog.read_json(self.path)
        if state is None:
            return self._fresh_state()
        frozen = state.get("policy", {})
        for key in _POLICY:
            if key in frozen and frozen[key] != self.policy[key] and self.policy["enabled"] and frozen.get("enabled", True):
                # Preserve a frozen stopping policy: silently changing it mid-run would
                # reinterpret the patience already spent.
                raise ValueError(
                    f"early stopping policy changed on resume: {key} was {frozen[key]!r}, now {self.policy[key]!r}"
                )
        return state

    def _save(self) -> None:
        self.state["updated"] = time.time()
        atomic_write_json(self.path, self.state)

    # ------------------------------------------------------------------ decisions

    def _improves(self, value: float) -> bool:
        best = self.state["best_metric"]
        if best is None:
            return True
        delta = self.policy["min_delta"]
        if self.policy["direction"] == "min":
            return value < best - delta
        return value > best + delta

    def update(self, step: Optional[int] = None) -> bool:
        """Consume newly completed evaluations in order; returns whether training should stop.

        Once stopped the answer stays True and the decision's state is frozen:
        evaluations of checkpoints after the stop (the backlog drained after
        training) are recorded in ``after_stop`` and change nothing else.

        ``step`` is the number of completed optimizer updates (for the budget).
        Reads and writes files: call it on rank 0 only (or use :meth:`should_stop`).
        """
        state = self.state
        changed = False
        if self.policy["enabled"]:
            consumed = set(state["consumed"])
            for request in backlog.list_requests(self.run_dir):
                ckpt = request["checkpoint"]
                if ckpt in consumed:
                    continue
                receipt = backlog.read_receipt(self.run_dir, ckpt)
                if receipt is not None and receipt.get("config_digest") != request.get("config_digest"):
                    receipt = None  # a result of another validation config is not this request's result
                if receipt is None:
                    break  # pending or failed: wait for it, never count it, never skip it
                changed = True
                self._consume(request, receipt)
                consumed.add(ckpt)
        budget = self.policy["max_budget"]
        if not state["stopped"] and budget is not None and step is not None and step >= budget:
            state.update(stopped=True, reason="max_budget", trigger_checkpoint=state["last_consumed"], trigger_step=step)
            changed = True
        if changed or not self.path.exists():
            self._save()
        return state["stopped"]

    def _consume(self, request: dict, receipt: dict) -> None:
        state = self.state
        ckpt, step = request["checkpoint"], request.get("step")
        state["consumed"].append(ckpt)
        state["last_consumed"] = ckpt
        value = receipt.get("metrics", {}).get(self.policy["metric"])
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            value = None  # a completed evaluation without the monitored metric is not evidence either way
        if self._after_stop(step):
            # The decision is final: a checkpoint after the stop is recorded, never counted.
            state.setdefault("after_stop", []).append({"checkpoint": ckpt, "step": step, "value": value})
            return
        eligible = isinstance(step, int) and step >= self.policy["warmup"]
        if not eligible or value is None:
            return
        state["evaluations"] += 1
        if self._improves(float(value)):
            state.update(best_metric=float(value), best_checkpoint=ckpt, best_step=step, patience_counter=0)
            return
        state["patience_counter"] += 1
        if not state["stopped"] and state["patience_counter"] >= self.policy["patience"]:
            state.update(stopped=True, reason="patience_exhausted", trigger_checkpoint=ckpt, trigger_step=step)

    def _after_stop(self, step: Any) -> bool:
        """Whether a checkpoint at ``step``, consumed now, comes after the stop (docs/hygiene.md).

        After a patience stop every later checkpoint does (the trigger was the
        last one counted). A budget stop is no verdict on evaluations: a
        checkpoint at or before the budget's update still counts, until
        patience would have run out as well.
        """
        state = self.state
        if not state["stopped"]:
            return False
        if state["reason"] != "max_budget":
            return True
        trigger = state.get("trigger_step")
        return (not isinstance(step, int) or not isinstance(trigger, int) or step > trigger
                or state["patience_counter"] >= self.policy["patience"])

    def should_stop(self, step: int) -> bool:
        """Collective decision: call on every rank at the same step; all ranks get rank 0's answer."""
        dist = _distributed()
        if dist is None:
            return self.update(step)
        import torch

        decision = torch.zeros(1, dtype=torch.int32)
        if dist.get_rank() == 0:
            decision[0] = 1 if self.update(step) else 0
        if dist.get_backend() == "nccl" and torch.cuda.is_available():
            decision = decision.cuda()
        dist.broadcast(decision, src=0)
        return bool(int(decision.item()))

    @property
    def stopped(self) -> bool:
        return bool(self.state["stopped"])

    def summary(self) -> dict[str, Any]:
        """The persisted state (best, counter, last consumed, reason, trigger) as a plain dict."""
        return {k: v for k, v in self.state.items() if k != "consumed"}


def _distributed():
    """``torch.distributed`` when a multi-rank process group is up, else ``None`` (no torch import otherwise)."""
    import sys

    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None
