"""Lightning ``Trainer.fit``: ``TraceMLCallback`` (docs/trainers.md).

``L.Trainer(callbacks=[TraceMLCallback()])`` for ``lightning.pytorch``
(:mod:`traceml_tui.integrations.pytorch_lightning` for the ``pytorch_lightning``
namespace) — or nothing at all under `traceml run`, whose bootstrap adds it to
every Lightning ``Trainer`` the script builds. Per rank, one step record per
optimizer update (``accumulate_grad_batches`` micro-batches fold in):

* the step envelope from the first micro-batch's ``on_train_batch_start`` to
  the end of the step-interval scheduler step that follows the
  LightningModule's ``optimizer_step`` (Lightning calls it only when the
  accumulated update is applied, around ``optimizer.step(closure)``, and steps
  the schedulers right after it, before the batch-end hooks); the training
  DataLoader fetch before it is the step's data wait, validation and
  sanity-check fetches are not; a validation that Lightning runs between two
  micro-batches of an update (an int ``val_check_interval`` not a multiple of
  ``accumulate_grad_batches``) pauses the update: it is the update's input
  wait, not its envelope;
* forward: the LightningModule's ``training_step`` (the forward pass and the
  loss); backward: its ``backward``; optimizer: its ``on_before_optimizer_step``
  (after the closure ran forward and backward) → the end of the scheduler step.
  Lightning runs forward and backward *inside* ``optimizer.step(closure)``, so
  torch's global optimizer hooks are kept out of these steps: they would count
  the closure as optimizer time;
* loss: ``training_step``'s loss divided by ``accumulate_grad_batches`` (what
  Lightning hands the batch end), summed over the update, this rank's own; lr
  before the scheduler steps; examples;
* validation-end metrics (never the sanity check) as eval records, and, when the
  run declares a ``hygiene:`` validation block, every checkpoint file a
  ``ModelCheckpoint`` wrote, once it exists, published to the backlog (rank 0).

The per-update work runs in wrappers on the LightningModule's own methods (and
the training epoch loop's scheduler step), which Lightning calls anyway: a callback hook would cost Lightning a dispatch per
update (docs/trainers.md "Overhead"). Where the phases cannot be split (manual
optimization, torch.compile, DeepSpeed, FSDP) the callback's batch hooks keep
the step envelope, loss and lr instead.

Importing this module does not import Lightning; the class is built on first use
of ``TraceMLCallback``.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Mapping
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
    unmeasured,
)
from traceml_tui.sdk import env
from traceml_tui.sdk import loader as _loader
from traceml_tui.sdk.session import OpenUpdate

NAME = "Lightning Trainer"
#: Namespace -> the module holding its ``Callback`` base class.
NAMESPACES = {"lightning.pytorch": "lightning.pytorch.callbacks", "pytorch_lightning": "pytorch_lightning.callbacks"}
_classes: dict[str, type] = {}


class _Update(OpenUpdate):
    """Everything the update's wrappers read and write, in one object reused by every update (the SDK's step
    state, sdk/session.py ``OpenUpdate``, plus the callback's own figures): a wrapper reads this object held in
    its closure, never the callback's attribute dict through a weak reference (docs/trainers.md, "The
    second-level cache")."""

    __slots__ = ("on", "stepped", "accumulate", "to_scheduler", "boundary", "saved", "session", "loss_before")

    def __init__(self) -> None:
        super().__init__()
        self.on = False  # the module's wrappers time the update (set up for the fit, not switched off)
        # perf_counter at the end of an applied optimizer_step whose update ends at the scheduler step
        self.stepped: Optional[float] = None
        self.accumulate = 1
        self.to_scheduler = False  # updates end after the epoch loop's scheduler step (else at optimizer_step)
        self.boundary = False  # (batch hooks only) the accumulated update was applied in this batch
        self.saved = False  # a checkpoint save began; publish its file once it exists
        self.session: Any = None  # the recording session (sdk.Session) of the open update
        # the update's loss over its micro-batches before this one (None: this is its first): a training_step
        # evaluated again for the same micro-batch (LBFGS's closure) replaces that micro-batch's loss
        self.loss_before: Any = None


class _Tracer:
    """The callback's behaviour; :func:`callback_class` mixes it into Lightning's ``Callback``."""

    _traceml_namespace = "lightning.pytorch"

    def __init__(self) -> None:
        self._traceml_off = False
        self._auto = False  # added by the import hook (stands down when the script added its own)
        self._u = _Update()
        self._module_ref: Any = None
        self._loop_ref: Any = None  # the fit's training epoch loop, whose scheduler step ends an update
        self._val_ref: Any = None  # the fit's validation loop, whose run pauses an update open when it starts
        self._published: set[str] = set()
        self._before_val: dict[str, Any] = {}
        self._fitting = False  # set up for Trainer.fit (a separate trainer.validate() records nothing)

    @property
    def _loss(self) -> Any:
        """The open update's loss so far (a float once read, or the tensor; None before ``training_step``)."""
        return self._u.loss

    @property
    def _state(self) -> Any:
        """The open update's step state (None between updates)."""
        return self._u if self._u.live else None

    def _traceml_abandon(self) -> None:
        self._u.stepped = None
        self._close(False)
        self._unwrap()

    # -- the update ---------------------------------------------------------------------------
    def _open(self, batch: Any) -> None:
        """A training batch starts: open the update on its first micro-batch; count its examples."""
        _open(self._u, batch, weakref.ref(self))

    def _close(self, ok: bool, end: Optional[float] = None) -> None:
        """The update ends (``ok``: its optimizer stepped) now or at ``end``."""
        u = self._u
        u.stepped = None
        u.boundary = False
        if u.live:
            u.session.end_update(u, perf_counter() if end is None else end, ok)

    # -- wrappers on the module's methods -------------------------------------------------------
    def _wrap(self, pl_module: Any) -> None:
        """Time every update through the module's own methods (instance wrappers; see :data:`_WRAPPERS`)."""
        u = self._u
        # The wrappers hold the update object, and the callback only weakly: once the callback is collected
        # with its wrappers still on the module, _tracer_gone makes them pass through, as the callback's end.
        tracer = weakref.ref(self, functools.partial(_tracer_gone, u))
        for name, make in _WRAPPERS.items():
            if getattr(pl_module.__dict__.get(name), "_traceml_of", None) is not None:
                continue
            original = getattr(pl_module, name, None)
            if original is None:
                continue
            wrapper = make(original, u, tracer)
            wrapper.__wrapped__ = original  # type: ignore[attr-defined]
            wrapper._traceml_of = original  # type: ignore[attr-defined]
            pl_module.__dict__[name] = wrapper
        self._module_ref = weakref.ref(pl_module)
        loop = _epoch_loop(pl_module)
        if loop is not None and getattr(loop.__dict__.get(_SCHEDULER_STEP), "_traceml_of", None) is None:
            original = getattr(loop, _SCHEDULER_STEP)
            wrapper = _update_lr_schedulers(original, u, tracer)
            wrapper.__wrapped__ = original  # type: ignore[attr-defined]
            wrapper._traceml_of = original  # type: ignore[attr-defined]
            loop.__dict__[_SCHEDULER_STEP] = wrapper
            self._loop_ref = weakref.ref(loop)
        u.to_scheduler = self._loop_ref is not None
        u.on = not self._traceml_off
        if _dispatcher_skips_none(self._traceml_namespace):
            for hook in _BATCH_HOOKS:  # the update needs none of them now: Lightning skips a hook set to None
                setattr(self, hook, None)

    def _unwrap(self) -> None:
        module = self._module_ref() if self._module_ref is not None else None
        if module is not None:
            for name in _WRAPPERS:
                if getattr(module.__dict__.get(name), "_traceml_of", None) is not None:
                    del module.__dict__[name]
        loop = self._loop_ref() if self._loop_ref is not None else None
        if loop is not None and getattr(loop.__dict__.get(_SCHEDULER_STEP), "_traceml_of", None) is not None:
            del loop.__dict__[_SCHEDULER_STEP]
        val_loop = self._val_ref() if self._val_ref is not None else None
        if val_loop is not None and getattr(val_loop.__dict__.get("run"), "_traceml_of", None) is not None:
            del val_loop.__dict__["run"]
        self._module_ref = self._loop_ref = self._val_ref = None
        self._u.on = self._u.to_scheduler = False
        for hook in _BATCH_HOOKS:
            self.__dict__.pop(hook, None)

    def _wrap_validation(self, trainer: Any) -> None:
        """Pause an update open when the fit's validation runs (see :func:`_validation_run`): its loop's ``run``
        gets an instance wrapper (else the validation start and end hooks pause and resume it)."""
        try:
            val_loop = trainer.fit_loop.epoch_loop.val_loop
        except AttributeError:
            return
        original = getattr(val_loop, "run", None)
        if not callable(original) or getattr(val_loop.__dict__.get("run"), "_traceml_of", None) is not None:
            return
        wrapper = _validation_run(original, self._u, weakref.ref(self))
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper._traceml_of = original  # type: ignore[attr-defined]
        val_loop.__dict__["run"] = wrapper
        self._val_ref = weakref.ref(val_loop)

    def _fail(self, where: str, exc: Exception) -> None:
        fail_open(self, NAME, where, exc)

    # -- checkpoints ----------------------------------------------------------------------------
    def _publish_saved(self, trainer: Any) -> None:
        """Publish the files the checkpoint callbacks wrote since the last look (they exist by now)."""
        if not self._u.saved:
            return
        self._u.saved = False
        if not os.environ.get(env.VALIDATION_DIGEST) or not trainer.is_global_zero:
            return
        for callback in getattr(trainer, "checkpoint_callbacks", ()):
            path = getattr(callback, "_last_checkpoint_saved", "") or getattr(callback, "last_model_path", "")
            if not path or path in self._published or not os.path.isfile(path):
                continue
            self._published.add(path)
            try:
                    sdk.publish_checkpoint(path)
            except Exception as exc:  # noqa: BLE001 - a checkpoint not published must not stop the steps
                unmeasured("checkpoints", f"publishing {NAME} checkpoints failed ({type(exc).__name__}: "
                                          f"{str(exc)[:200]})")

    # -- events ---------------------------------------------------------------------------------
    @guarded(NAME)
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if self._auto and any(isinstance(cb, _Tracer) and cb is not self for cb in trainer.callbacks):
            self._traceml_off = True  # the script added its own: never instrumented twice
            return
        if self._auto and trainer.world_size > 1 and "RANK" not in os.environ:
            # Lightning starts the other ranks itself: they run the script without traceml's bootstrap.
            self._traceml_off = True
            unmeasured("all", f"{NAME} launches its own {trainer.world_size} processes; start the script with "
                                f"`traceml run --nproc-per-node {trainer.world_size}` to record every rank")
            return
        sdk.init().loop_started()  # a second fit in this process: no input wait across the two
        if not _loader.dataloader_done:
            _loader.install_dataloader()  # the training DataLoader's fetches are the data wait
        self._fitting = True
        self._u.accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        reason = _unmeasurable_phases(trainer, pl_module)
        if reason is not None:
            unmeasured("forward backward optimizer", reason)
        else:
            self._wrap(pl_module)
        self._wrap_validation(trainer)
        param = next(iter(pl_module.parameters()), None)
        if param is not None and param.is_cuda:
            sdk.current_run().enable_cuda()

    # The batch hooks below time the update only where the phases cannot be split (no wrappers: manual
    # optimization, torch.compile, DeepSpeed, FSDP); with the wrappers they are set to None or return at once.
    @guarded(NAME)
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not self._u.on:
            self._module_ref = self._module_ref or weakref.ref(pl_module)
            self._open(batch)

    @guarded(NAME)
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        u = self._u
        if u.on or not u.live:
            return
        u.boundary = True  # Lightning calls this only when the accumulated update is applied
        if u.lr is None:
            groups = getattr(optimizer, "param_groups", None)
            if groups:
                u.lr = groups[0].get("lr")  # before the scheduler steps: this update's lr

    @guarded(NAME)
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        u = self._u
        if u.on or not u.live:
            return
        loss = outputs.get("loss") if type(outputs) is dict else outputs
        if loss is not None and hasattr(loss, "detach"):
            if loss.requires_grad:  # Lightning hands a detached copy; a custom output may not be
                loss = loss.detach()
            u.loss = loss if u.loss is None else u.loss + loss
        if u.boundary:  # else a micro-batch of an update still accumulating
            self._close(True)

    @guarded(NAME)
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        u = self._u
        if self._val_ref is None:  # (no validation loop wrapped: its hooks)
            sdk.not_steps_begin()
            if u.live and u.stepped is None:
                u.session.pause_update(u, perf_counter())
        self._publish_saved(trainer)
        if self._fitting and not trainer.sanity_checking:
            self._before_val = dict(trainer.callback_metrics)

    @guarded(NAME)
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        u = self._u
        if self._val_ref is None:
            sdk.not_steps_end()
            if u.live and u.paused is not None:
                u.session.resume_update(u, perf_counter())
        if not self._fitting or trainer.sanity_checking:
            return
        before = self._before_val
        changed = {k: v for k, v in trainer.callback_metrics.items() if before.get(k) is not v}
        self._before_val = {}
        metrics = eval_metrics(changed, "val_", "val/")
        if metrics:
            sdk.log_eval(metrics)  # on the step axis: this rank's completed optimizer updates
        self._publish_saved(trainer)

    @guarded(NAME)
    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        self._u.saved = True  # the file is written after this hook returns

    @guarded(NAME)
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._publish_saved(trainer)
        self._traceml_abandon()
        session = sdk._session
        if session is not None and not session.closed:
            session.flush()  # every step is on disk before fit returns

    @guarded(NAME)
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._publish_saved(trainer)  # a save at the very end of training

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not self._traceml_off:
            self._traceml_abandon()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._fitting = False
        if not self._traceml_off:
            self._unwrap()


# -- the wrappers: one factory per method of the LightningModule -------------------------------------
# Each returns the original's result unchanged and lets its exceptions through; an exception of traceml's own
# work switches the callback off (fail-open). The phase fields and CUDA events are those of sdk/phases.py
# begin_phase/end_phase, written inline: these run several times per update. Each reads and writes only the
# update object ``u`` held in its closure (the callback, through the weak reference ``tracer``, only on the
# rare paths): one object's few memory lines per update, not the callback's attribute dict.

def _open(u: _Update, batch: Any, tracer: Callable) -> None:
    """A training batch starts: open the update on its first micro-batch; count its examples."""
    if u.saved:
        me = tracer()
        module = me._module_ref() if me is not None and me._module_ref is not None else None
        if module is not None:
            me._publish_saved(module.trainer)
    if u.stepped is not None:  # the scheduler step was never seen: the update ended with its optimizer_step
        me = tracer()
        if me is not None:
            me._close(True, u.stepped)
    u.loss_before = u.loss if u.live else None  # a further micro-batch of the open update, or a new update
    if not u.live:
        session = u.session
        if session is None or session.closed:  # (sdk._session is replaced only once closed)
            session = open_session()
            if session is None:
                return
            u.session = session
        session.open_update(u, perf_counter())
    count = examples_in(batch)
    if count is not None:
        u.examples = count if u.examples is None else u.examples + count


def _tracer_gone(u: _Update, _ref: Any) -> None:
    """The callback was collected with its wrappers still on the module: they pass through from now on, and an
    update still open ends unrecorded."""
    u.on = False
    u.stepped = None
    if u.live:
        u.session.end_update(u, perf_counter(), False)


def _fail(tracer: Callable, where: str, exc: Exception) -> None:
    me = tracer()
    if me is not None:
        me._fail(where, exc)


def _on_train_batch_start(original: Callable, u: _Update, tracer: Callable) -> Callable:
    def on_train_batch_start(batch: Any, *args: Any, **kwargs: Any) -> Any:
        if u.on:
            try:
                session = u.session
                if u.live or u.saved or u.stepped is not None or session is None or session.closed:
                    _open(u, batch, tracer)  # a micro-batch of an open update, and the rare cases
                else:  # (_open's usual case inline, one call fewer: this runs once per update)
                    u.loss_before = None
                    session.open_update(u, perf_counter())
                    # (examples_in's usual case inline: a tuple or list whose first item is a batched tensor)
                    kind = type(batch)
                    shape = getattr(batch[0], "shape", None) if (kind is tuple or kind is list) and batch else None
                    u.examples = int(shape[0]) if shape else examples_in(batch)
            except Exception as exc:  # noqa: BLE001 - fail-open
                _fail(tracer, "on_train_batch_start", exc)
        result = original(batch, *args, **kwargs)
        if result is not None and result == -1 and u.live and u.loss is None:
            me = tracer()
            if me is not None:
                me._close(False)  # the module skips the rest of the epoch: no update ran
        return result

    return on_train_batch_start


def _training_step(original: Callable, u: _Update, tracer: Callable) -> Callable:
    def training_step(*args: Any, **kwargs: Any) -> Any:
        if not u.live or u.paused is not None:  # (paused: a validation_step calling training_step, mid-update)
            return original(*args, **kwargs)
        gpu = u.gpu
        if gpu is not None:
            gpu.open("forward")
        start = perf_counter()
        out = original(*args, **kwargs)
        u.fwd_ms = (u.fwd_ms or 0.0) + (perf_counter() - start) * 1000.0
        if gpu is not None:
            gpu.close_phase("forward")
        try:
            loss = out if hasattr(out, "detach") else out.get("loss") if isinstance(out, Mapping) else None
            if loss is not None and hasattr(loss, "detach"):
                before = u.loss_before
                if u.accumulate != 1 or before is not None:
                    loss = loss.detach() / u.accumulate  # what Lightning hands the batch end
                elif getattr(loss, "is_cpu", False):
                    # A CPU loss is read now, while torch's dispatch is warm from the forward pass, and the
                    # update no longer holds the tensor (and its autograd graph) until it ends; the record's
                    # loss is the same float (docs/trainers.md "Overhead"). Never on an accelerator: a sync.
                    try:
                        loss = loss.item()
                    except (RuntimeError, ValueError):  # not one element: the record's loss stays null
                        pass
                # An optimizer whose closure evaluates training_step again for one micro-batch (LBFGS): the
                # last evaluation is the micro-batch's loss, as Lightning hands the batch end; never their sum
                u.loss = loss if before is None else before + loss
        except Exception as exc:  # noqa: BLE001 - fail-open
            _fail(tracer, "training_step", exc)
        return out

    return training_step


def _backward(original: Callable, u: _Update, tracer: Callable) -> Callable:
    """The module's ``backward``: its time is the update's backward (support.timed_backward's, on ``u``)."""
    def backward(*args: Any, **kwargs: Any) -> Any:
        if not u.live or u.paused is not None:  # evaluation, or between updates, or a validation inside one
            return original(*args, **kwargs)
        gpu = u.gpu
        if gpu is not None:
            gpu.open("backward")
        start = perf_counter()
        out = original(*args, **kwargs)
        u.bwd_ms = (u.bwd_ms or 0.0) + (perf_counter() - start) * 1000.0
        if gpu is not None:
            gpu.close_phase("backward")
        return out

    return backward


def _on_before_optimizer_step(original: Callable, u: _Update, tracer: Callable) -> Callable:
    def on_before_optimizer_step(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        if u.live:
            try:
                if u.lr is None:
                    groups = getattr(optimizer, "param_groups", None)
                    if groups:
                        u.lr = groups[0].get("lr")  # before the scheduler steps: this update's lr
            except Exception as exc:  # noqa: BLE001 - fail-open
                _fail(tracer, "on_before_optimizer_step", exc)
            else:
                if u.gpu is not None:
                    u.gpu.open("optimizer")
                u.opt_start = perf_counter()
        return original(optimizer, *args, **kwargs)

    return on_before_optimizer_step


def _optimizer_step(original: Callable, u: _Update, tracer: Callable) -> Callable:
    def optimizer_step(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if u.live:
            try:
                now = perf_counter()
                start = u.opt_start
                if start is not None:
                    u.opt_ms = (u.opt_ms or 0.0) + (now - start) * 1000.0
                    if u.gpu is not None:
                        u.gpu.close_phase("optimizer")
                if u.to_scheduler:  # the update ends after the scheduler step that follows (_update_lr_schedulers)
                    u.opt_start = now if start is not None else None
                    u.stepped = now
                else:
                    u.stepped = None
                    u.session.end_update(u, now, True)
            except Exception as exc:  # noqa: BLE001 - fail-open
                _fail(tracer, "optimizer_step", exc)
        return out

    return optimizer_step


def _validation_run(original: Callable, u: _Update, tracer: Callable) -> Callable:
    """The fit's validation loop's ``run`` (the sanity check and every validation; the whole of it: the loader's
    iterator and workers, the eval and train modes, the hooks). Validation runs between updates, except where an
    int ``val_check_interval`` is not a multiple of ``accumulate_grad_batches``: then it runs between two
    micro-batches of an update, which is paused meanwhile (sdk/session.py ``pause_update``): its time goes to
    the update's input wait, as validation between two updates goes to the next one's, and its fetches are
    not data wait."""
    def run(*args: Any, **kwargs: Any) -> Any:
        paused = False
        if u.live and u.stepped is None:  # (an update whose optimizer stepped has ended: at u.stepped)
            try:
                u.session.pause_update(u, perf_counter())
                paused = True
            except Exception as exc:  # noqa: BLE001 - fail-open
                _fail(tracer, "validation", exc)
        sdk.not_steps_begin()  # a trace_step in validation (validation_step calling training_step) is no step
        try:
            return original(*args, **kwargs)
        finally:
            sdk.not_steps_end()
            if paused and u.live and u.paused is not None:
                try:
                    u.session.resume_update(u, perf_counter())
                except Exception as exc:  # noqa: BLE001 - fail-open
                    _fail(tracer, "validation", exc)

    return run


def _update_lr_schedulers(original: Callable, u: _Update, tracer: Callable) -> Callable:
    """The training epoch loop's scheduler step (Lightning runs it right after the batch's optimization, before
    the batch-end hooks): an update whose optimizer stepped ends when it returns, its time in the optimizer part."""
    def update_lr_schedulers(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if u.stepped is not None:
            try:
                now = perf_counter()
                u.stepped = None
                if u.live:
                    start = u.opt_start
                    if start is not None:
                        u.opt_ms = (u.opt_ms or 0.0) + (now - start) * 1000.0
                    u.session.end_update(u, now, True)
            except Exception as exc:  # noqa: BLE001 - fail-open
                _fail(tracer, "update_lr_schedulers", exc)
        return out

    return update_lr_schedulers


#: The LightningModule methods wrapped per fit, in the order Lightning calls them in an update.
_WRAPPERS: dict[str, Callable[[Callable, _Update, Callable], Callable]] = {
    "on_train_batch_start": _on_train_batch_start,
    "training_step": _training_step,
    "backward": _backward,
    "on_before_optimizer_step": _on_before_optimizer_step,
    "optimizer_step": _optimizer_step,
}

#: The training epoch loop's method that steps the step-interval schedulers after each batch's optimization.
_SCHEDULER_STEP = "update_lr_schedulers"


def _epoch_loop(pl_module: Any) -> Any:
    """The fit's training epoch loop when it has the scheduler step to wrap (else None: updates end with
    their ``optimizer_step``)."""
    try:
        loop = pl_module._trainer.fit_loop.epoch_loop
    except AttributeError:
        return None
    return loop if callable(getattr(loop, _SCHEDULER_STEP, None)) else None


#: Callback hooks Lightning calls on every batch that this callback has no use for. Each dispatch costs
#: Lightning several µs per callback (a profiler context and a formatted name), a large share of a small
#: step; Lightning's dispatcher skips a hook attribute that is not callable, so they are set to None.
_SKIPPED_HOOKS = ("on_before_backward", "on_after_backward", "on_before_zero_grad")
#: The callback's own batch hooks, set to None on the instance while the module's wrappers time the update.
_BATCH_HOOKS = ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end")


def _unmeasurable_phases(trainer: Any, pl_module: Any) -> Optional[str]:
    """Why forward/backward/optimizer cannot be split on this fit (None: they can)."""
    if not getattr(pl_module, "automatic_optimization", True):
        return (f"{NAME} with manual optimization: training_step runs backward and the optimizer itself; "
                "step time, loss and lr are kept")
    if getattr(pl_module, "_compiler_ctx", None) is not None:
        return f"{NAME} with torch.compile: the split is not verified for compiled modules; step time, loss and lr are kept"
    strategy = type(getattr(trainer, "strategy", None)).__name__
    if "DeepSpeed" in strategy or "FSDP" in strategy:
        return f"{NAME} with the {strategy}: its engine runs backward and the optimizer; step time, loss and lr are kept"
    return None


@functools.lru_cache(maxsize=None)
def _dispatcher_skips_none(namespace: str) -> bool:
    """Whether this Lightning's callback dispatcher skips a hook attribute that is not callable.

    Read once from the dispatcher's own source (``trainer/call.py``: ``if callable(fn)``); anything
    unexpected — another layout, no source on disk — answers False, so the hooks stay callable.
    """
    try:
        import importlib
        import inspect

        call = importlib.import_module(f"{namespace}.trainer.call")
        return "callable(fn)" in inspect.getsource(call._call_callback_hooks)
    except Exception:
        return False


def callback_class(namespace: str = "lightning.pytorch") -> type:
    """``TraceMLCallback`` for ``namespace`` (``lightning.pytorch`` or ``pytorch_lightning``; imports it)."""
    cls = _classes.get(namespace)
    if cls is None:
        import importlib

        base = importlib.import_module(NAMESPACES[namespace]).Callback
        cls = type("TraceMLCallback", (_Tracer, base), {
            "__module__": __name__,
            "__qualname__": "TraceMLCallback",
            "__doc__": "Records every optimizer update of a Lightning fit with traceml (docs/trainers.md).",
            "_traceml_namespace": namespace,
            # Unused per-batch hooks are set to None only where the dispatcher skips them (fail open: a
            # Lightning that would call None keeps the inherited no-op hooks and their dispatch cost).
            **(dict.fromkeys(_SKIPPED_HOOKS) if _dispatcher_skips_none(namespace) else {}),
        })
        _classes[namespace] = cls
    return cls


def __getattr__(name: str) -> Any:
    if name == "TraceMLCallback":
        return callback_class("lightning.pytorch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def attach(trainer: Any, namespace: str) -> bool:
    """Add a traceml callback to ``trainer`` unless it has one (True when one was added)."""
    if any(isinstance(cb, _Tracer) for cb in trainer.callbacks):
        return False
    callback = callback_class(namespace)()
    callback._auto = True
    # Before the checkpoint callbacks, where Lightning puts the callbacks it is given: a save at a batch end
    # is then work after the update, not part of its optimizer time.
    checkpoints = [i for i, cb in enumerate(trainer.callbacks) if any(cb is c for c in trainer.checkpoint_callbacks)]
    trainer.callbacks.insert(checkpoints[0] if checkpoints else len(trainer.callbacks), callback)
    return True


def activate(module: Any) -> None:
    """Patch ``module.Trainer.__init__`` (a Lightning trainer module) so every Trainer built gets the callback."""
    namespace = "pytorch_lightning" if module.__name__.startswith("pytorch_lightning") else "lightning.pytorch"
    attach_on_init(module.Trainer, lambda trainer: attach(trainer, namespace), NAME, "lightning-attached")
