"""What every trainer integration shares: the kill switch, one-time notices, unmeasured streams, fail-open.

A trainer integration must never stop training (docs/trainers.md, "Fail-open"):
every callback entry point runs through :func:`guarded`, which turns an
exception into one stderr line and an ``unmeasured`` report, and switches the
callback off for the rest of the run.
"""

from __future__ import annotations

import functools
import os
import sys
from time import perf_counter
from typing import Any, Callable, TypeVar

from traceml_tui.sdk import env

F = TypeVar("F", bound=Callable[..., Any])

_said: set[str] = set()


def auto_attach_enabled() -> bool:
    """Whether the bootstrap attaches trainer callbacks (``TRACEML_AUTO_ATTACH``, default on)."""
    return os.environ.get(env.AUTO_ATTACH, "1").strip().lower() not in ("0", "false", "no", "off")


def is_rank_zero() -> bool:
    """Rank 0 of the run (torch.distributed when up, else ``RANK``), as the SDK decides it."""
    from traceml_tui.sdk.session import detect_rank

    return detect_rank()[0] == 0


def say(message: str, *, key: str | None = None, all_ranks: bool = False) -> None:
    """One ``traceml: …`` line on stderr, once per process per ``key`` (rank 0 only unless ``all_ranks``)."""
    key = key or message
    if key in _said:
        return
    _said.add(key)
    if all_ranks or is_rank_zero():
        print(f"traceml: {message}", file=sys.stderr, flush=True)


def unmeasured(streams: str, reason: str) -> None:
    """Name streams the integration cannot measure (``"forward backward"``: several, space-separated).

    Each goes through ``traceml_tui.sdk.report_unmeasured``: one record per
    stream per rank (what the summary and ``traceml status`` show) and, on rank
    0, the one stderr line. ``all``: nothing could be attached.
    """
    try:
        from traceml_tui import sdk

        for stream in streams.split():
            sdk.report_unmeasured(stream, reason)
    except Exception:  # noqa: BLE001 - reporting a gap must not open another one
        pass


def guarded(integration: str) -> Callable[[F], F]:
    """Decorate a callback method: an exception switches the callback off and is reported, never raised.

    The instance's ``_traceml_off`` attribute is the switch; a switched-off
    callback's methods return at once.
    """

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self._traceml_off:
                return None
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - fail-open: training goes on without traceml
                fail_open(self, integration, method.__name__, exc)
                return None

        return wrapper  # type: ignore[return-value]

    return decorate


def fail_open(callback: Any, integration: str, where: str, exc: Exception) -> None:
    """Switch ``callback`` off after ``exc`` escaped traceml's work in ``where``, and report it (never raises)."""
    callback._traceml_off = True
    try:
        callback._traceml_abandon()
    except Exception:  # noqa: BLE001
        pass
    unmeasured("all", f"{integration} callback failed in {where} "
                        f"({type(exc).__name__}: {str(exc)[:200]}); training continues untraced")


def attach_on_init(trainer_cls: type, attach: Callable[[Any], bool], name: str, key: str) -> None:
    """Wrap ``trainer_cls.__init__`` so every trainer built gets the traceml callback (once; fail-open).

    ``attach(trainer)`` adds the callback and says whether it did (False: the script added one itself);
    rank 0 then prints "``name`` detected: traceml callback added" once. A failure is reported as the
    ``all`` stream unmeasured and the trainer works on without traceml.
    """
    original = trainer_cls.__init__
    if getattr(original, "_traceml_of", None) is not None:
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - replaces the constructor
        original(self, *args, **kwargs)
        try:
            if attach(self):
                say(f"{name} detected: traceml callback added", key=key)
        except Exception as exc:  # noqa: BLE001 - fail-open: the Trainer works without traceml
            unmeasured("all", f"adding the traceml callback to the {name} failed ({type(exc).__name__}: "
                                f"{str(exc)[:200]}); training continues untraced")

    __init__._traceml_of = original  # type: ignore[attr-defined]
    trainer_cls.__init__ = __init__


def examples_in(batch: Any) -> int | None:
    """Examples in one batch: the leading size of its first tensor (a tensor, a mapping or a sequence)."""
    kind = type(batch)
    # the usual batches, once per micro-batch, kept to plain look-ups: (inputs, targets), and a Hugging Face
    # collator's dict (a dict has no ``shape``: looking one up would raise and catch an AttributeError)
    if kind is list or kind is tuple or kind is dict:
        for value in (batch.values() if kind is dict else batch):
            shape = getattr(value, "shape", None)
            found = (int(shape[0]) if len(shape) else None) if shape is not None else examples_in(value)
            if found is not None:
                return found
        return None
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if isinstance(batch, dict) or hasattr(batch, "values") and hasattr(batch, "keys"):
        for value in batch.values():
            found = examples_in(value)
            if found is not None:
                return found
        return None
    if isinstance(batch, (list, tuple)):
        for value in batch:
            found = examples_in(value)
            if found is not None:
                return found
    return None


#: What a trainer reports with its evaluation metrics that is speed or position, not a result.
_NOT_RESULTS = frozenset({"runtime", "samples_per_second", "steps_per_second", "epoch"})


def eval_metrics(metrics: Any, *prefixes: str) -> dict[str, Any]:
    """A trainer's evaluation metrics as eval-record metrics: numbers only, the split prefix dropped.

    ``eval_loss`` (Hugging Face) and ``val_loss`` / ``val/loss`` (Lightning's
    usual names) become ``loss``, the name the learning curve and early
    stopping read (docs/trainers.md); timing and epoch entries are left out.
    """
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = str(key)
        for prefix in prefixes:
            if name.startswith(prefix) and len(name) > len(prefix):
                name = name[len(prefix):]
                break
        if name in _NOT_RESULTS or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) or getattr(value, "ndim", None) == 0:
            out[name] = value
    return out


def open_session() -> Any:
    """The rank's recording session for a trainer's next update: the SDK's (started when there is none yet), or
    None once it is closed (the rank ended: nothing more is recorded)."""
    from traceml_tui import sdk

    session = sdk._session
    if session is None:
        session = sdk.init()
    return None if session.closed else session


def _timed_phase(original: Callable, tracer: Callable, phase: str) -> Callable:
    """A wrapper of a method that runs one phase of an update (``"forward"`` or ``"backward"``): inside an update
    it adds its time to that phase and opens and closes the phase on the GPU; outside one it only calls the
    method. ``tracer`` returns the callback (or None), whose ``_state`` is the update in progress."""
    forward = phase == "forward"

    def timed(*args: Any, **kwargs: Any) -> Any:
        me = tracer()
        state = me._state if me is not None else None
        if state is None:  # evaluation, or between updates
            return original(*args, **kwargs)
        gpu = state.gpu
        if gpu is not None:
            gpu.open(phase)
        start = perf_counter()
        out = original(*args, **kwargs)
        elapsed = (perf_counter() - start) * 1000.0
        if forward:
            state.fwd_ms = (state.fwd_ms or 0.0) + elapsed
        else:
            state.bwd_ms = (state.bwd_ms or 0.0) + elapsed
        if gpu is not None:
            gpu.close_phase(phase)
        return out

    return timed


def timed_forward(original: Callable, tracer: Callable) -> Callable:
    """A wrapper of the method that runs forward and the loss (the Hugging Face ``Trainer.compute_loss``)."""
    return _timed_phase(original, tracer, "forward")


def timed_backward(original: Callable, tracer: Callable) -> Callable:
    """A wrapper of the method that runs backward (the Hugging Face ``Accelerator.backward``): its time is the
    update's backward, the autograd pass with DDP's all-reduce. (Lightning's wrappers time its module's
    ``backward`` on their reused update object instead: integrations/lightning.py, docs/trainers.md.)"""
    return _timed_phase(original, tracer, "backward")
