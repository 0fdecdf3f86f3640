"""Hugging Face ``transformers.Trainer``: ``TraceMLCallback`` (docs/trainers.md).

``Trainer(..., callbacks=[TraceMLCallback()])`` — or nothing at all under
`traceml run`, whose bootstrap adds it to every ``Trainer`` (and subclass) the
script builds. Per rank, one step record per optimizer update (gradient
accumulation micro-batches fold in):

* the step envelope from ``on_step_begin`` to ``on_step_end``; the batches of
  an update are fetched before ``on_step_begin``, so their DataLoader time is
  the step's data wait (evaluation fetches between steps are not);
* forward: ``Trainer.compute_loss`` (the model's forward pass and its loss); backward:
  ``Accelerator.backward`` (DDP's all-reduce included); optimizer from
  ``on_pre_optimizer_step`` to ``on_optimizer_step`` (exactly ``optimizer.step()``).
  A ``training_step`` of its own that calls neither method has them timed by
  the model's hooks (``sdk/phases.py``) from its second update on;
* loss: the sum of ``Trainer.training_step`` outputs over the update (each is
  already divided by the accumulation steps), this rank's own: on CPU read as
  each returns (``.item()`` syncs nothing there), elsewhere kept as a tensor
  until the record is written; lr read before the scheduler steps; the gradient
  norm the trainer computed (``accelerator.clip_grad_norm_``); examples;
* ``on_evaluate`` metrics as eval records, and, when the run declares a
  ``hygiene:`` validation block, every ``checkpoint-N/`` folder the trainer
  saves published to the validation backlog (rank 0).

The per-micro-batch work runs in wrappers on methods the Trainer calls anyway,
and the per-update work in the four events it dispatches to every callback
anyway: no model hook, no ``trace_step`` object, no ``traceml.log`` call per
update (docs/trainers.md "Overhead").

Importing this module does not import transformers; the class is built on
first use of ``TraceMLCallback``.
"""

from __future__ import annotations

import os
import sys
import weakref
from time import perf_counter
from typing import Any, Callable, Optional

from traceml_tui import sdk
from traceml_tui.integrations.support import (
    attach_on_init,
    eval_metrics,
    examples_in,
    fail_open,
    guarded,
    open_session,
    timed_backward,
    timed_forward,
    unmeasured,
)
from traceml_tui.sdk import env
from traceml_tui.sdk import loader as _loader

NAME = "Hugging Face Trainer"
_classes: dict[str, type] = {}


class _Tracer:
    """The callback's behaviour; :func:`callback_class` mixes it into ``transformers.TrainerCallback``.

    Only the events it uses are defined here (the rest are ``TrainerCallback``'s empty methods): the Trainer
    dispatches every event to every callback anyway, so what an event costs is the method's own body. The
    per-update events (``on_step_begin``, ``on_pre_optimizer_step``, ``on_optimizer_step``, ``on_step_end``)
    catch their own exceptions instead of going through :func:`guarded`, which would re-pack the Trainer's
    keyword arguments once more per event (docs/trainers.md "Overhead").
    """

    def __init__(self) -> None:
        self._traceml_off = False
        self._auto = False  # added by the import hook (stands down when the script added its own)
        self._trainer_ref: Any = None
        self._model_ref: Any = None  # the model the Trainer hands its callbacks
        self._session: Any = None
        self._state: Any = None  # the SDK step state of the open update (sdk/session.py _StepState)
        self._phases = True  # forward/backward/optimizer measurable on this trainer
        # forward/backward timed by the model's hooks (sdk/phases.py) instead of the Trainer's compute_loss and
        # Accelerator.backward: a trainer whose training_step calls neither (_check_phases)
        self._by_hooks = False
        self._checked = False  # the first update's phases were checked
        self._reset()

    def _reset(self) -> None:
        self._loss: Any = None
        self._examples: Optional[int] = None
        self._lr: Any = None
        self._grad_norm: Any = None

    # -- binding to the trainer ---------------------------------------------------------------
    def _bind(self, trainer: Any) -> None:
        """Wrap the per-update methods the Trainer calls anyway (instance attributes; :func:`_wrap`).

        ``training_step`` (this rank's loss, examples) and ``Accelerator.clip_grad_norm_`` (the gradient norm)
        always; where the phases can be split, ``compute_loss`` (forward) and ``Accelerator.backward``
        (backward) too.
        """
        self._trainer_ref = weakref.ref(trainer)
        tracer = weakref.ref(self)
        _wrap(trainer, "training_step", _training_step, tracer)
        accelerator = getattr(trainer, "accelerator", None)
        if accelerator is not None:
            _wrap(accelerator, "clip_grad_norm_", _clip_grad_norm, tracer)
        if self._phases and not self._by_hooks:
            _wrap(trainer, "compute_loss", timed_forward, tracer)  # forward: the model's pass and its loss
            if accelerator is not None:
                _wrap(accelerator, "backward", timed_backward, tracer)

    def _unbind(self, *, phases_only: bool = False) -> None:
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        if trainer is None:
            return
        accelerator = getattr(trainer, "accelerator", None)
        _unwrap(trainer, "compute_loss")
        if accelerator is not None:
            _unwrap(accelerator, "backward")
        if phases_only:
            return
        _unwrap(trainer, "training_step")
        if accelerator is not None:
            _unwrap(accelerator, "clip_grad_norm_")

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

    def _close(self, ok: bool) -> None:
        """End the open update now (``ok``: its optimizer stepped): its values, then its record."""
        now = perf_counter()
        state, self._state = self._state, None
        if state is None:
            return
        if ok:
            values = state.values  # what sdk.log(loss=, lr=, grad_norm=, batch_size=) stores, without the call
            if self._loss is not None:
                values["loss"] = self._loss
            if self._lr is not None:
                values["lr"] = self._lr
            if self._grad_norm is not None:
                values["grad_norm"] = self._grad_norm
            if self._examples is not None:
                values["batch_size"] = self._examples
        self._loss = self._examples = self._lr = self._grad_norm = None  # (self._reset() inline: once per update)
        self._session.end(state, now, ok)
        if ok and not self._checked:
            self._check_phases(state)

    def _check_phases(self, state: Any) -> None:
        """After the first update: a trainer whose ``training_step`` calls ``compute_loss`` or
        ``Accelerator.backward`` not (a subclass's own loop) has its forward and backward timed by the model's
        hooks from the next update on, and the wrappers of the two methods go."""
        self._checked = True
        if not self._phases or self._by_hooks or (state.fwd_ms is not None and state.bwd_ms is not None):
            return
        model = self._model_ref() if self._model_ref is not None else None
        if model is None or not hasattr(model, "register_forward_hook"):
            unmeasured("forward backward", f"{NAME}: its training_step calls neither compute_loss nor "
                                           f"Accelerator.backward, and the model takes no hooks")
            return
        from traceml_tui.sdk import phases

        self._by_hooks = True
        self._unbind(phases_only=True)
        phases.attach(model, sdk._current_state)

    def _traceml_abandon(self) -> None:
        """Drop an open update (never recorded as completed) and undo the wrappers."""
        self._close(False)
        self._unbind()

    def _fail(self, where: str, exc: Exception) -> None:
        fail_open(self, NAME, where, exc)

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
        session = sdk.init()
        session.loop_started()  # a second train() in this process: no input wait across the two
        if not _loader.dataloader_done:
            _loader.install_dataloader()  # the training DataLoader's fetches are the data wait
        self._phases = True
        self._model_ref = weakref.ref(model) if model is not None else None
        if trainer is None:
            unmeasured("loss grad_norm examples", f"{NAME}: the trainer running the callback was not found")
        else:
            reason = _unmeasurable_phases(trainer, model)
            if reason is not None:
                self._phases = False
                unmeasured("forward backward optimizer", reason)
            self._bind(trainer)
        param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
        if param is not None and param.is_cuda:
            session.enable_cuda()  # CUDA events time the step and its parts (sdk/phases.py)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._traceml_off:
            return
        try:
            if self._state is not None:  # an update that never ended (an exception the trainer swallowed)
                self._close(False)
            session = open_session()
            if session is None:
                return
            self._session = session
            self._state = session.begin(perf_counter())
            self._state.opt_manual = True  # optimizer timed by the events below, never by torch's hooks
        except Exception as exc:  # noqa: BLE001 - fail-open
            self._fail("on_step_begin", exc)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any
                              ) -> None:
        step = self._state
        if step is None or self._traceml_off:
            return
        try:
            groups = getattr(optimizer, "param_groups", None)
            if groups:
                self._lr = groups[0].get("lr")  # before the scheduler steps: this update's lr
            if self._phases:
                if step.gpu is not None:
                    step.gpu.open("optimizer")
                step.opt_start = perf_counter()
        except Exception as exc:  # noqa: BLE001 - fail-open
            self._fail("on_pre_optimizer_step", exc)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = perf_counter()
        step = self._state
        if step is None or step.opt_start is None:
            return
        try:
            step.opt_ms = (step.opt_ms or 0.0) + (now - step.opt_start) * 1000.0
            step.opt_start = None
            if step.gpu is not None:
                step.gpu.close_phase("optimizer")
        except Exception as exc:  # noqa: BLE001 - fail-open
            self._fail("on_optimizer_step", exc)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._state is None or self._traceml_off:
            return
        try:
            self._close(True)
        except Exception as exc:  # noqa: BLE001 - fail-open
            self._fail("on_step_end", exc)

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


# -- wrappers on the methods the Trainer calls per micro-batch --------------------------------------
def _wrap(owner: Any, name: str, make: Callable[[Callable, Callable], Callable], tracer: Callable) -> None:
    """Put ``make(original, tracer)`` on ``owner`` as an instance attribute (once)."""
    if getattr(owner.__dict__.get(name), "_traceml_of", None) is not None:
        return
    original = getattr(owner, name, None)
    if original is None:
        return
    wrapper = make(original, tracer)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper._traceml_of = original  # type: ignore[attr-defined]
    wrapper.__doc__ = getattr(original, "__doc__", None)
    setattr(owner, name, wrapper)


def _unwrap(owner: Any, name: str) -> None:
    if getattr(owner.__dict__.get(name), "_traceml_of", None) is not None:
        delattr(owner, name)


def _training_step(original: Callable, tracer: Callable) -> Callable:
    """``Trainer.training_step``: its output (the micro-batch's loss, already divided by the accumulation steps)
    added to the update's loss; the micro-batch's examples."""
    def training_step(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        me = tracer()
        if me is None or me._state is None:
            return out
        try:
            if out is not None:
                loss = out.detach() if getattr(out, "requires_grad", False) else out  # the Trainer's is detached
                if getattr(loss, "is_cpu", False):
                    # A CPU loss is read now (no device sync on CPU) and summed as a float: the update holds no
                    # tensor and adds no tensor op (docs/trainers.md "Overhead"). Never on an accelerator.
                    try:
                        loss = loss.item()
                    except (RuntimeError, ValueError):  # not one element: kept, the record's loss stays null
                        pass
                me._loss = loss if me._loss is None else me._loss + loss
            count = examples_in(args[1] if len(args) > 1 else kwargs.get("inputs"))
            if count is not None:
                me._examples = count if me._examples is None else me._examples + count
        except Exception as exc:  # noqa: BLE001 - fail-open
            me._fail("training_step", exc)
        return out

    return training_step


def _clip_grad_norm(original: Callable, tracer: Callable) -> Callable:
    """``Accelerator.clip_grad_norm_``: the norm the Trainer computed (before clipping), kept as it is."""
    def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
        norm = original(*args, **kwargs)
        me = tracer()
        if me is not None and me._state is not None:
            me._grad_norm = norm
        return norm

    return clip_grad_norm_


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
