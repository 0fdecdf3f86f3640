"""Validation-based early stopping over the asynchronous backlog (seed 004).

Rules implemented here:

* Evaluations are consumed strictly in checkpoint order (step, publication
  time, id). Consumption stops at the first request without a receipt: a
  pending or failed evaluation is never counted as a non-improvement and is
  never skipped. A *blocked* request (every allowed attempt failed; no drainer
  retries it) is the exception: it is recorded in ``skipped`` with its reason
  and consumption goes on, so one broken checkpoint cannot freeze early
  stopping for the rest of the run (docs/hygiene.md).
* A receipt without the monitored metric is consumed but not counted, and
  recorded in ``missing_metric`` (with the metric names it has) so a misnamed
  metric is reported instead of silently disabling early stopping.
* Patience counts completed *eligible* evaluations; a checkpoint before
  ``warmup`` optimizer updates is consumed but not eligible (it neither sets the
  best nor counts against patience).
* State (best metric, best checkpoint, patience counter, consumed evaluations,
  stopping reason and triggering checkpoint) lives in
  ``<run_dir>/early_stopping.json``, written atomically after every change, so
  a resumed run neither resets patience nor consumes an evaluation twice.
* ``max_budget`` stops the run once that many optimizer updates completed;
  its trigger is that update (``trigger_step``) and no checkpoint: no
  evaluation decided it.
* Once stopped, the decision is final and its state (best, patience counter,
  evaluations, reason, trigger) stays as it was at the stop. Receipts of
  checkpoints after the stop (published before training noticed, drained
  later) are consumed once and listed in ``after_stop`` without being counted.
  A budget stop is no verdict on evaluations: checkpoints at or before the
  update it stopped at still count when drained later (the run trained up to
  them); only later ones are after the stop.

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
from traceml_tui.core.state import BacklogState, decide_backlog
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
        max_attempts: Optional[int] = None,
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
        # When a request without a receipt is blocked: the run's declared max_attempts (one home:
        # backlog.declared_validation), unless the caller's config says.
        self.max_attempts = max_attempts if max_attempts is not None else backlog.declared_max_attempts(self.run_dir)
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
        attempts = (hygiene_cfg.get("validation") or {}).get("max_attempts") if "validation" in hygiene_cfg else None
        if not block.get("enabled", True):
            return cls(run_dir, enabled=False, reason=block.get("reason"), max_budget=block.get("max_budget"),
                       config_digest=digest, max_attempts=attempts)
        return cls(
            run_dir,
            metric=block["metric"],
            direction=block["direction"],
            min_delta=block["min_delta"],
            patience=block["patience"],
            warmup=block.get("warmup", 0),
            max_budget=block.get("max_budget"),
            config_digest=digest,
            max_attempts=attempts,
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
            "skipped": [],
            "missing_metric": [],
            "stopped": False,
            "reason": None,
            "trigger_checkpoint": None,
            "trigger_step": None,
            "updated": time.time(),
        }

    def _load(self) -> dict:
        errors: list[str] = []
        state = backlog.read_early_stopping(self.path, errors)
        if errors:
            # Never start afresh over a damaged state: patience already spent would be forgotten and
            # the file overwritten (docs/hygiene.md).
            raise ValueError(f"{errors[0]}; move it aside to start early stopping afresh")
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
            # Called every update: the consumed requests are not read again (a run's requests only grow, and
            # reading them all made each call cost O(checkpoints published): docs/hygiene.md "Early stopping").
            for request in backlog.list_requests(self.run_dir, skip=consumed):
                ckpt = request["checkpoint"]
                if ckpt in consumed:
                    continue
                receipt = backlog.read_receipt(self.run_dir, ckpt)
                reason = None
                if receipt is not None and receipt.get("config_digest") != request.get("config_digest"):
                    # A result of another validation config is not this request's result, and no drainer will
                    # replace it (a receipt is never overwritten): waiting for it froze early stopping for good.
                    reason = (f"its receipt is bound to another validation config "
                              f"({receipt.get('config_digest')}, the request's {request.get('config_digest')})")
                    receipt = None
                if receipt is None:
                    reason = reason or self._blocked(ckpt)
                    if reason is None:
                        break  # pending or failed: wait for it, never count it, never skip it
                    # Blocked: no drainer retries it, so waiting would freeze early stopping for good.
                    # Recorded as skipped (never as a non-improvement) and the next ones are consumed.
                    state.setdefault("skipped", []).append(
                        {"checkpoint": ckpt, "step": request.get("step"), "reason": reason})
                    state["consumed"].append(ckpt)
                    consumed.add(ckpt)
                    changed = True
                    continue
                changed = True
                self._consume(request, receipt)
                consumed.add(ckpt)
        budget = self.policy["max_budget"]
        if not state["stopped"] and budget is not None and step is not None and step >= budget:
            # The budget's update triggered it, not an evaluation: no trigger checkpoint (docs/hygiene.md).
            state.update(stopped=True, reason="max_budget", trigger_checkpoint=None, trigger_step=step)
            changed = True
        if changed or not self.path.exists():
            self._save()
        return state["stopped"]

    def _blocked(self, checkpoint: str) -> Optional[str]:
        """Why a request without a receipt will not get one from any drainer (blocked), else None."""
        records = backlog.failures_of(self.run_dir, checkpoint)
        # the backlog's own rule (core.state.decide_backlog): claims aside, only the failures decide
        word = decide_backlog(has_receipt=False, has_claim=False, claim_stale=False, failures=len(records),
                              max_attempts=self.max_attempts)
        if word is not BacklogState.BLOCKED:
            return None
        error = records[-1].get("error") if records else None
        return f"blocked after {len(records)} failed attempts" + (f" (last: {error})" if error else "")

    def _consume(self, request: dict, receipt: dict) -> None:
        state = self.state
        ckpt, step = request["checkpoint"], request.get("step")
        state["consumed"].append(ckpt)
        state["last_consumed"] = ckpt
        metrics = receipt.get("metrics") if isinstance(receipt.get("metrics"), dict) else {}
        value = metrics.get(self.policy["metric"])
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            value = None  # a completed evaluation without the monitored metric is not evidence either way
            # … but it is reported: a misnamed metric (R2 for r2) would otherwise disable early stopping silently.
            state.setdefault("missing_metric", []).append(
                {"checkpoint": ckpt, "step": step, "metrics": sorted(str(k) for k in metrics)})
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
        checkpoint at or before the update it stopped at (its own update
        included) took part in the training the budget allowed and still counts.
        """
        state = self.state
        if not state["stopped"]:
            return False
        if state["reason"] != "max_budget":
            return True
        trigger = state.get("trigger_step")
        return not isinstance(step, int) or not isinstance(trigger, int) or step > trigger

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
