"""Hugging Face ``transformers.Trainer``: ``TraceMLCallback`` (docs/trainers.md).

``Trainer(..., callbacks=[TraceMLCallback()])`` — or nothing at all under
`traceml run`, whose bootstrap adds it to every ``Trainer`` (and subclass) the
script builds. Per rank, one step record per optimizer update (gradient
accumulation micro-batches fold in):

* the step envelope from ``on_step_begin`` to ``on_step_end``; the batches of
  an update are fetched before ``on_step_begin``, so their DataLoader time is
  the step's data wait (evaluation fetches between steps are not);
* forward and backward from hooks on the model, optimizer from
  ``on_pre_optimizer_step`` to ``on_optimizer_step`` (exactly ``optimizer.step()``);
* loss: the sum of ``Trainer.training_step`` outputs over the update (each is
  already divided by the accumulation steps), this rank's own, kept as a tensor
  until the record is written; lr read before the scheduler steps; the gradient
  norm the trainer computed (``accelerator.clip_grad_norm_``); examples;
* ``on_evaluate`` metrics as eval records, and, when the run declares a
  ``hygiene:`` validation block, every ``checkpoint-N/`` folder the trainer
  saves published to the validation backlog (rank 0).

Importing this module does not import transformers; the class is built on
first use of ``TraceMLCallback``.
"""

from __future__ import annotations

import functools
import os
import sys
import weakref
from typing import Any, Optional

from traceml_tui import sdk
from traceml_tui.integrations.support import attach_on_init, eval_metrics, examples_in, guarded, unmeasured
from traceml_tui.sdk import env
from traceml_tui.sdk.phases import begin_phase, end_phase

NAME = "Hugging Face Trainer"
_classes: dict[str, type] = {}


class _Tracer:
    """The callback's behaviour; :func:`callback_class` mixes it into ``transformers.TrainerCallback``."""

    def __init__(self) -> None:
        self._traceml_off = False
        self._auto = False  # added by the import hook (stands down when the script added its own)
        self._trainer_ref: Any = None
        self._step: Any = None  # the open sdk.trace_step of the current update
        self._phases = True  # forward/backward/optimizer measurable on this trainer
        self._reset()

    def _reset(self) -> None:
        self._loss: Any = None
        self._examples: Optional[int] = None
        self._lr: Any = None
        self._grad_norm: Any = None

    # -- binding to the trainer ---------------------------------------------------------------
    def _bind(self, trainer: Any) -> None:
        """Wrap ``trainer.training_step`` (per-rank loss, examples) and the gradient norm it computes."""
        self._trainer_ref = weakref.ref(trainer)
        if getattr(trainer.__dict__.get("training_step"), "_traceml_of", None) is None:
            original = trainer.training_step
            tracer = weakref.ref(self)

            @functools.wraps(original)
            def training_step(*args: Any, **kwargs: Any) -> Any:
                out = original(*args, **kwargs)
                me = tracer()
                if me is not None and me._step is not None:
                    me._on_micro_batch(out, args[1] if len(args) > 1 else kwargs.get("inputs"))
                return out

            training_step._traceml_of = original  # type: ignore[attr-defined]
            trainer.training_step = training_step
        accelerator = getattr(trainer, "accelerator", None)
        clip = getattr(accelerator, "clip_grad_norm_", None)
        if clip is not None and getattr(clip, "_traceml_of", None) is None:
            tracer = weakref.ref(self)

            @functools.wraps(clip)
            def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
                norm = clip(*args, **kwargs)
                me = tracer()
                if me is not None and me._step is not None:
                    me._grad_norm = norm
                return norm

            clip_grad_norm_._traceml_of = clip  # type: ignore[attr-defined]
            accelerator.clip_grad_norm_ = clip_grad_norm_

    def _unbind(self) -> None:
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        if trainer is None:
            return
        if getattr(trainer.__dict__.get("training_step"), "_traceml_of", None) is not None:
            del trainer.training_step
        accelerator = getattr(trainer, "accelerator", None)
        if accelerator is not None and getattr(accelerator.__dict__.get("clip_grad_norm_"), "_traceml_of", None):
            del accelerator.clip_grad_norm_

    def _find_trainer(self) -> Any:
        """The Trainer running this callback (an explicit callback is never handed it): the caller whose
        callback handler holds us."""
        frame = sys._getframe(1)
        for _ in range(16):
            frame = frame.f_back
            if frame is None:
                return None
            candidate = frame.f_locals.get("self")
            handler = getattr(candidate, "callback_handler", None)
            if handler is not None and any(cb is self for cb in getattr(handler, "callbacks", ())):
                return candidate
        return None

    def _on_micro_batch(self, out: Any, inputs: Any) -> None:
        if out is not None:
            loss = out.detach() if getattr(out, "requires_grad", False) else out  # the Trainer returns it detached
            self._loss = loss if self._loss is None else self._loss + loss
        count = examples_in(inputs)
        if count is not None:
            self._examples = count if self._examples is None else self._examples + count

    def _traceml_abandon(self) -> None:
        """Drop an open update (never recorded as completed) and undo the wrappers."""
        step, self._step = self._step, None
        if step is not None:
            step.__exit__(RuntimeError, None, None)
        self._unbind()

    # -- events -------------------------------------------------------------------------------
    @guarded(NAME)
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        trainer = trainer or self._find_trainer()
        if self._auto and trainer is not None and any(
            isinstance(cb, _Tracer) and cb is not self for cb in trainer.callback_handler.callbacks
        ):
            self._traceml_off = True  # the script added its own: never instrumented twice
            return
        sdk.init()
        self._phases = True
        if trainer is None:
            unmeasured("loss grad_norm examples", f"{NAME}: the trainer running the callback was not found")
        else:
            self._bind(trainer)
            reason = _unmeasurable_phases(trainer, model)
            if reason is not None:
                self._phases = False
                unmeasured("forward backward optimizer", reason)

    @guarded(NAME)
    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self._step is not None:  # an update that never ended (an exception the trainer swallowed)
            self._step.__exit__(RuntimeError, None, None)
        self._reset()
        step = sdk.trace_step(model if self._phases else None)
        step.__enter__()
        self._step = step
        sdk._session.current.opt_manual = True  # optimizer timed by the callback events below

    @guarded(NAME)
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        if self._step is None:
            return
        if optimizer is not None and optimizer.param_groups:
            self._lr = optimizer.param_groups[0].get("lr")  # before the scheduler steps: this update's lr
        if self._phases:
            begin_phase(sdk._session.current, "optimizer")

    @guarded(NAME)
    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._step is None or not self._phases:
            return
        end_phase(sdk._session.current, "optimizer")

    @guarded(NAME)
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        sdk.log(loss=self._loss, lr=self._lr, grad_norm=self._grad_norm, batch_size=self._examples)
        self._reset()
        step.__exit__(None, None, None)

    @guarded(NAME)
    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        if not metrics:
            return
        numbers = eval_metrics(metrics, "eval_")
        if numbers:
            sdk.log_eval(numbers)  # on the step axis: this rank's completed optimizer updates

    @guarded(NAME)
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not os.environ.get(env.VALIDATION_DIGEST) or not state.is_world_process_zero:
            return  # no hygiene validation declared; or not the rank that publishes
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if not os.path.isdir(folder):
            unmeasured("checkpoints", f"{NAME} saved no checkpoint-{state.global_step} folder in its output_dir")
            return
        try:
            sdk.publish_checkpoint(folder)
        except Exception as exc:  # noqa: BLE001 - a checkpoint not published must not stop training or the steps
            unmeasured("checkpoints", f"publishing {NAME} checkpoint folders failed ({type(exc).__name__}: "
                                      f"{str(exc)[:200]})")

    @guarded(NAME)
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._traceml_abandon()
        session = sdk._session
        if session is not None and not session.closed:
            session.flush()  # every step is on disk before the trainer returns


def _unmeasurable_phases(trainer: Any, model: Any) -> Optional[str]:
    """Why forward/backward/optimizer cannot be split on this trainer (None: they can)."""
    args = getattr(trainer, "args", None)
    if getattr(args, "torch_compile", False) or hasattr(model, "_orig_mod") or hasattr(
        getattr(trainer, "model_wrapped", None), "_orig_mod"
    ):
        return f"{NAME} with torch.compile: module hooks do not see compiled graphs; step time, loss and lr are kept"
    if getattr(trainer, "is_deepspeed_enabled", False):
        return f"{NAME} with DeepSpeed: its engine runs the backward and optimizer; step time, loss and lr are kept"
    if getattr(trainer, "is_fsdp_enabled", False):
        return f"{NAME} with FSDP: sharded modules are not split; step time, loss and lr are kept"
    return None


def callback_class() -> type:
    """``TraceMLCallback``: :class:`_Tracer` on ``transformers.TrainerCallback`` (imports transformers)."""
    cls = _classes.get("hf")
    if cls is None:
        from transformers import TrainerCallback

        cls = type("TraceMLCallback", (_Tracer, TrainerCallback), {
            "__module__": __name__,
            "__qualname__": "TraceMLCallback",
            "__doc__": "Records every optimizer update of a Hugging Face Trainer with traceml (docs/trainers.md).",
        })
        _classes["hf"] = cls
    return cls


def __getattr__(name: str) -> Any:
    if name == "TraceMLCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def attach(trainer: Any) -> bool:
    """Add a traceml callback to ``trainer`` unless it has one (True when one was added)."""
    if any(isinstance(cb, _Tracer) for cb in trainer.callback_handler.callbacks):
        return False
    callback = callback_class()()
    callback._auto = True
    callback._trainer_ref = weakref.ref(trainer)
    trainer.add_callback(callback)
    return True


def activate(module: Any) -> None:
    """Patch ``module.Trainer.__init__`` (``transformers.trainer``) so every Trainer built gets the callback."""
    attach_on_init(module.Trainer, attach, NAME, "hf-attached")
