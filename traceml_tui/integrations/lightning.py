"""Lightning ``Trainer.fit``: ``TraceMLCallback`` (docs/trainers.md).

``L.Trainer(callbacks=[TraceMLCallback()])`` for ``lightning.pytorch``
(:mod:`traceml_tui.integrations.pytorch_lightning` for the ``pytorch_lightning``
namespace) — or nothing at all under `traceml run`, whose bootstrap adds it to
every Lightning ``Trainer`` the script builds. Per rank, one step record per
optimizer update (``accumulate_grad_batches`` micro-batches fold in):

* the step envelope from the first micro-batch's ``on_train_batch_start`` to
  the ``on_train_batch_end`` of the batch whose optimizer stepped
  (``on_before_optimizer_step`` fires only at update boundaries); the training
  DataLoader fetch before it is the step's data wait, validation and
  sanity-check fetches are not;
* forward: the LightningModule's ``training_step`` (the forward pass and the
  loss); backward: its ``backward`` (Lightning calls it between the
  ``on_before_backward`` and ``on_after_backward`` hooks); optimizer:
  ``on_before_optimizer_step`` → the batch end (the update and a step-interval
  scheduler). Lightning runs forward and backward *inside*
  ``optimizer.step(closure)``, so torch's global optimizer hooks are kept out
  of these steps: they would count the closure as optimizer time;
* loss: the batch-end ``outputs["loss"]`` summed over the update (this rank's,
  already divided by the accumulation); lr before the scheduler steps; examples;
* validation-end metrics (never the sanity check) as eval records, and, when the
  run declares a ``hygiene:`` validation block, every checkpoint file a
  ``ModelCheckpoint`` wrote, once it exists, published to the backlog (rank 0).

Importing this module does not import Lightning; the class is built on first use
of ``TraceMLCallback``.
"""

from __future__ import annotations

import functools
import os
import weakref
from typing import Any, Optional

from traceml_tui import sdk
from traceml_tui.integrations.support import attach_on_init, eval_metrics, examples_in, guarded, unmeasured
from traceml_tui.sdk import env
from traceml_tui.sdk.phases import begin_phase, end_phase

NAME = "Lightning Trainer"
#: Namespace -> the module holding its ``Callback`` base class.
NAMESPACES = {"lightning.pytorch": "lightning.pytorch.callbacks", "pytorch_lightning": "pytorch_lightning.callbacks"}
_classes: dict[str, type] = {}


def _current() -> Any:
    return sdk._session.current


class _Tracer:
    """The callback's behaviour; :func:`callback_class` mixes it into Lightning's ``Callback``."""

    def __init__(self) -> None:
        self._traceml_off = False
        self._auto = False  # added by the import hook (stands down when the script added its own)
        self._step: Any = None  # the open sdk.trace_step of the current update
        self._phases = True
        self._module_ref: Any = None
        self._published: set[str] = set()
        self._saved = False  # a checkpoint save began; publish its file once it exists
        self._before_val: dict[str, Any] = {}
        self._boundary = False
        self._fitting = False  # set up for Trainer.fit (a separate trainer.validate() records nothing)
        self._reset()

    def _reset(self) -> None:
        self._loss: Any = None
        self._examples: Optional[int] = None
        self._lr: Any = None
        self._boundary = False

    def _traceml_abandon(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            step.__exit__(RuntimeError, None, None)
        self._unwrap()

    # -- forward and backward timing ----------------------------------------------------------
    def _wrap(self, pl_module: Any) -> None:
        """Time the module's ``training_step`` as forward and its ``backward`` as backward (instance wrappers).

        Wrapping the module's own methods costs one call each per micro-batch; Lightning's
        ``on_before_backward``/``on_after_backward`` callback hooks would cost a dispatch each (see
        ``_SKIPPED_HOOKS``). Lightning calls ``pl_module.backward`` between those two hooks.
        """
        tracer = weakref.ref(self)
        for name, phase in (("training_step", "forward"), ("backward", "backward")):
            if getattr(pl_module.__dict__.get(name), "_traceml_of", None) is not None:
                continue
            original = getattr(pl_module, name, None)
            if original is None:
                continue
            pl_module.__dict__[name] = _timed_method(original, phase, tracer)
        self._module_ref = weakref.ref(pl_module)

    def _unwrap(self) -> None:
        module = self._module_ref() if self._module_ref is not None else None
        if module is not None:
            for name in ("training_step", "backward"):
                if getattr(module.__dict__.get(name), "_traceml_of", None) is not None:
                    del module.__dict__[name]
        self._module_ref = None

    # -- checkpoints ----------------------------------------------------------------------------
    def _publish_saved(self, trainer: Any) -> None:
        """Publish the files the checkpoint callbacks wrote since the last look (they exist by now)."""
        if not self._saved:
            return
        self._saved = False
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
        sdk.init()
        self._fitting = True
        reason = _unmeasurable_phases(trainer, pl_module)
        self._phases = reason is None
        if reason is not None:
            unmeasured("forward backward optimizer", reason)
        else:
            self._wrap(pl_module)
        param = next(iter(pl_module.parameters()), None)
        if param is not None and param.is_cuda:
            sdk.current_run().enable_cuda()

    @guarded(NAME)
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._saved:
            self._publish_saved(trainer)
        if self._step is None:
            self._reset()
            step = sdk.trace_step(None)
            step.__enter__()
            self._step = step
            _current().opt_manual = True  # optimizer timed below, never by torch's hooks around the closure
        count = examples_in(batch)
        if count is not None:
            self._examples = count if self._examples is None else self._examples + count

    @guarded(NAME)
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._step is None:
            return
        self._boundary = True  # Lightning calls this only when the accumulated update is applied
        if self._lr is None:
            groups = getattr(optimizer, "param_groups", None)
            if groups:
                self._lr = groups[0].get("lr")  # before the scheduler steps: this update's lr
        if self._phases:
            begin_phase(_current(), "optimizer")

    @guarded(NAME)
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._step is None:
            return
        loss = outputs.get("loss") if type(outputs) is dict else outputs
        if loss is not None and hasattr(loss, "detach"):
            if loss.requires_grad:  # Lightning hands a detached copy; a custom output may not be
                loss = loss.detach()
            self._loss = loss if self._loss is None else self._loss + loss
        if not self._boundary:
            return  # a micro-batch of an update still accumulating
        if self._phases:
            end_phase(_current(), "optimizer")
        sdk.log(loss=self._loss, lr=self._lr, batch_size=self._examples)
        step, self._step = self._step, None
        self._reset()
        step.__exit__(None, None, None)

    @guarded(NAME)
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._publish_saved(trainer)
        if self._fitting and not trainer.sanity_checking:
            self._before_val = dict(trainer.callback_metrics)

    @guarded(NAME)
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
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
        self._saved = True  # the file is written after this hook returns

    @guarded(NAME)
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._publish_saved(trainer)
        self._traceml_abandon()
        session = sdk._session
        if session is not None and not session.closed:
            session.drain_gpu(block=True)  # every step is on disk before fit returns

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


def _timed_method(original: Any, phase: str, tracer: Any) -> Any:
    """``original`` (a bound method of the LightningModule) timed as ``phase`` of the open update, if any."""

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        me = tracer()
        state = _current() if me is not None and me._step is not None and me._phases else None
        if state is None:
            return original(*args, **kwargs)
        begin_phase(state, phase)
        try:
            return original(*args, **kwargs)
        finally:
            end_phase(state, phase)

    timed._traceml_of = original  # type: ignore[attr-defined]
    return timed


#: Callback hooks Lightning calls on every batch that this callback has no use for. Each dispatch costs
#: Lightning several µs per callback (a profiler context and a formatted name), a large share of a small
#: step; Lightning's dispatcher skips a hook attribute that is not callable, so they are set to None.
_SKIPPED_HOOKS = ("on_before_backward", "on_after_backward", "on_before_zero_grad")


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
