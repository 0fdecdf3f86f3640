"""Phase timing through torch hooks: forward, backward and optimizer.

CPU timings come from ``perf_counter`` in the hooks. On CUDA the same hooks
record CUDA events on the current stream; they are resolved later (when the
step's last event has completed), so the hot path never synchronizes.

Backward is timed from the moment autograd reaches the model's output (a
tensor hook) to the end of the backward pass (an autograd engine callback,
the mechanism DDP itself uses to finish gradient reduction).
"""

from __future__ import annotations

import weakref
from time import perf_counter
from typing import Any, Callable, Optional

from traceml_tui.core import records

_hooked_models: "weakref.WeakSet[Any]" = weakref.WeakSet()
_optimizer_hooks_installed = False


class GpuStepEvents:
    """CUDA events of one step; resolved into :class:`records.Phases` once complete."""

    __slots__ = ("torch", "start", "end", "prev_end", "pairs", "_open")

    def __init__(self, torch: Any, prev_end: Any) -> None:
        self.torch = torch
        self.prev_end = prev_end
        self.start = self._event()
        self.end = None
        self.pairs: dict[str, list[tuple[Any, Any]]] = {}
        self._open: dict[str, Any] = {}

    def _event(self) -> Any:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def open(self, phase: str) -> None:
        self._open[phase] = self._event()

    def close_phase(self, phase: str) -> None:
        begin = self._open.pop(phase, None)
        if begin is not None:
            self.pairs.setdefault(phase, []).append((begin, self._event()))

    def close(self) -> None:
        self.end = self._event()

    def ready(self) -> bool:
        return self.end is None or bool(self.end.query())

    def resolve(self) -> records.Phases:
        def total(phase: str) -> Optional[float]:
            pairs = self.pairs.get(phase)
            if not pairs:
                return None
            return float(sum(a.elapsed_time(b) for a, b in pairs))

        wait = float(self.prev_end.elapsed_time(self.start)) if self.prev_end is not None else None
        step = float(self.start.elapsed_time(self.end))
        paused = total("paused")  # work that was no part of the step (Session.pause_update): in the gap instead
        if paused:
            step -= paused
            if wait is not None:
                wait += paused
        return records.Phases(
            step=step,
            input_wait=wait,
            forward=total("forward"),
            backward=total("backward"),
            optimizer=total("optimizer"),
        )


def attach(model: Any, current: Callable[[], Any]) -> bool:
    """Install timing hooks on ``model`` (once) and on all optimizers (once per process).

    ``current`` returns the in-flight step state or None. Returns True when the
    model lives on a CUDA device (GPU timing applies).
    """
    import torch
    import torch.optim.optimizer as torch_optimizer

    global _optimizer_hooks_installed
    param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    on_cuda = bool(param is not None and param.is_cuda)
    if model in _hooked_models:
        return on_cuda
    _hooked_models.add(model)
    engine = torch.autograd.Variable._execution_engine

    def forward_pre(_module: Any, _inputs: Any) -> None:
        state = current()
        if state is None:
            return
        state.fwd_start = perf_counter()
        if state.gpu is not None:
            state.gpu.open("forward")

    def forward_post(_module: Any, _inputs: Any, output: Any) -> None:
        state = current()
        if state is None or state.fwd_start is None:
            return
        if state.gpu is not None:
            state.gpu.close_phase("forward")
        state.fwd_ms = (state.fwd_ms or 0.0) + (perf_counter() - state.fwd_start) * 1000.0
        state.fwd_start = None
        tensor = _first_grad_tensor(output)
        if tensor is not None:
            grad_fn = tensor.grad_fn
            # A pre-hook on the output's autograd node is the cheapest way to see backward
            # reach the model (Tensor.register_hook costs several µs of Python per step).
            if grad_fn is not None:
                grad_fn.register_prehook(backward_start)
            else:
                tensor.register_hook(backward_start)

    def backward_start(_grad: Any) -> None:
        state = current()
        if state is None or state.bwd_start is not None:
            return
        state.bwd_start = perf_counter()
        if state.gpu is not None:
            state.gpu.open("backward")
        engine.queue_callback(backward_tail)

    def backward_tail() -> None:
        # Final callbacks run in queue order and callbacks queued while they run go
        # last; re-queueing once puts the end mark after DDP's own finalizer, which
        # waits for the gradient all-reduce that belongs to backward.
        engine.queue_callback(backward_end)

    def backward_end() -> None:
        state = current()
        if state is None or state.bwd_start is None:
            return
        if state.gpu is not None:
            state.gpu.close_phase("backward")
        state.bwd_ms = (state.bwd_ms or 0.0) + (perf_counter() - state.bwd_start) * 1000.0
        state.bwd_start = None

    model.register_forward_pre_hook(forward_pre)
    model.register_forward_hook(forward_post)

    if not _optimizer_hooks_installed:
        _optimizer_hooks_installed = True

        def optimizer_pre(_opt: Any, _args: Any, _kwargs: Any) -> None:
            state = current()
            if state is None or state.opt_manual:
                return
            state.opt_start = perf_counter()
            if state.gpu is not None:
                state.gpu.open("optimizer")

        def optimizer_post(_opt: Any, _args: Any, _kwargs: Any) -> None:
            state = current()
            if state is None or state.opt_manual or state.opt_start is None:
                return
            if state.gpu is not None:
                state.gpu.close_phase("optimizer")
            state.opt_ms = (state.opt_ms or 0.0) + (perf_counter() - state.opt_start) * 1000.0
            state.opt_start = None

        torch_optimizer.register_optimizer_step_pre_hook(optimizer_pre)
        torch_optimizer.register_optimizer_step_post_hook(optimizer_post)
    return on_cuda


#: The step-state attributes of a phase timed by the caller: (start mark, accumulated milliseconds).
_PHASE_FIELDS = {
    "forward": ("fwd_start", "fwd_ms"),
    "backward": ("bwd_start", "bwd_ms"),
    "optimizer": ("opt_start", "opt_ms"),
}


def begin_phase(state: Any, phase: str) -> None:
    """Open ``phase`` (forward, backward or optimizer) of the in-flight step ``state`` at this moment.

    For integrations whose framework announces the phases itself (trainer
    callbacks, docs/trainers.md) instead of the module and optimizer hooks
    above. The same fields and CUDA events as the hooks: a phase opened and
    closed several times in one step (gradient accumulation) adds up.
    """
    start_field, _ = _PHASE_FIELDS[phase]
    setattr(state, start_field, perf_counter())
    if state.gpu is not None:
        state.gpu.open(phase)


def end_phase(state: Any, phase: str) -> None:
    """Close ``phase`` of ``state`` opened by :func:`begin_phase` (no-op when it is not open)."""
    start_field, ms_field = _PHASE_FIELDS[phase]
    start = getattr(state, start_field)
    if start is None:
        return
    if state.gpu is not None:
        state.gpu.close_phase(phase)
    setattr(state, ms_field, (getattr(state, ms_field) or 0.0) + (perf_counter() - start) * 1000.0)
    setattr(state, start_field, None)


def _first_grad_tensor(output: Any) -> Any:
    """The first tensor in a model output that requires grad (tensor, tuple/list, dict, dataclass-like)."""
    if getattr(output, "requires_grad", False) and hasattr(output, "register_hook"):
        return output
    if isinstance(output, dict):
        items = list(output.values())
    elif isinstance(output, (list, tuple)):
        items = list(output)
    else:
        return None
    for item in items:
        found = _first_grad_tensor(item)
        if found is not None:
            return found
    return None
