"""The Lightning callback's wrappers on a module's methods, driven in Lightning's order without Lightning (its
import costs seconds; the real fits are tests/test_lightning_*.py): each update is one step record, the
wrappers share one reused update object, and a callback collected with its wrappers still on the module
records nothing more (traceml_tui/integrations/lightning.py)."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace
from typing import Any

import pytest

from traceml_tui import sdk
from traceml_tui.integrations import lightning as pl_adapter
from traceml_tui.sdk.session import Session


class _Loss:
    """A CPU loss as training_step returns it (what the wrapper reads: ``detach``, ``is_cpu``, ``item``)."""

    is_cpu = True

    def __init__(self, value: float) -> None:
        self.value = value

    def detach(self) -> "_Loss":
        return self

    def item(self) -> float:
        return self.value


class _EpochLoop:
    def update_lr_schedulers(self, interval: str, update_plateau_schedulers: bool) -> None:
        return None


class _Module:
    automatic_optimization = True

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=_EpochLoop()))

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.calls.append("start")

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.calls.append("forward")
        return _Loss(0.25 * (batch_idx + 1))

    def backward(self, loss: Any) -> None:
        self.calls.append("backward")

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.calls.append("before optimizer")

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, closure: Any = None) -> None:
        self.calls.append("optimizer")

    def parameters(self) -> Any:
        return iter(())


def _update(module: _Module, i: int) -> None:
    """One update as Lightning calls the module (forward and backward inside the optimizer's closure)."""
    batch = (SimpleNamespace(shape=(4, 2)), SimpleNamespace(shape=(4, 1)))
    optimizer = SimpleNamespace(param_groups=[{"lr": 0.5}])
    module.on_train_batch_start(batch, i)
    module.training_step(batch, i)
    module.backward(None)
    module.on_before_optimizer_step(optimizer)
    module.optimizer_step(0, i, optimizer, None)
    module._trainer.fit_loop.epoch_loop.update_lr_schedulers("step", update_plateau_schedulers=False)


@pytest.fixture
def session(tmp_path, monkeypatch):
    run = Session(tmp_path / "run", "run", rank=0, world_size=1, window_s=0.0)
    monkeypatch.setattr(sdk, "_session", run)
    monkeypatch.setattr(pl_adapter, "_dispatcher_skips_none", lambda namespace: False)  # (imports Lightning)
    yield run
    run.close("completed")


def _wrapped(module: _Module) -> Any:
    tracer = pl_adapter._Tracer()
    trainer = SimpleNamespace(callbacks=[tracer], world_size=1, accumulate_grad_batches=1, strategy=None)
    tracer.setup(trainer, module, "fit")
    assert "training_step" in module.__dict__ and not tracer._traceml_off
    return tracer


def test_each_update_is_one_step_on_one_reused_update_object(session) -> None:
    module = _Module()
    tracer = _wrapped(module)
    seen = []
    for i in range(3):
        _update(module, i)
        seen.append(session.current)
    assert session.last_step == 3 and seen == [None] * 3
    assert module.calls[:6] == ["start", "forward", "backward", "before optimizer", "optimizer"] + ["start"]
    module.on_train_batch_start((SimpleNamespace(shape=(4, 2)),), 3)
    assert session.current is tracer._u  # the same object every update: no step state per update
    rows = [line for line in session.path.read_text().splitlines() if '"kind":"step"' in line]
    assert len(rows) == 3 and '"loss":0.5' in rows[1] and '"examples":12' in rows[2] and '"lr":0.5' in rows[0]


def test_a_collected_callback_leaves_wrappers_that_record_nothing(session) -> None:
    module = _Module()
    tracer = _wrapped(module)
    _update(module, 0)
    module.on_train_batch_start((SimpleNamespace(shape=(4, 2)),), 1)  # an update open when the callback goes
    gone = weakref.ref(tracer)
    del tracer
    gc.collect()
    assert gone() is None and session.current is None
    before = len(module.calls)
    _update(module, 1)
    assert session.last_step == 1  # the wrappers pass through: the module's own methods still run
    assert module.calls[before:] == ["start", "forward", "backward", "before optimizer", "optimizer"]


class _ValLoop:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.current: list[Any] = []

    def run(self) -> list:
        self.current.append(self.session.current)  # what a validation fetch or traceml.log would see
        return []


def test_a_validation_between_two_micro_batches_pauses_the_update(session) -> None:
    """An int val_check_interval that is not a multiple of accumulate_grad_batches: Lightning's validation loop
    runs between two micro-batches of an update, which is paused meanwhile (its time is not the update's)."""
    module = _Module()
    val_loop = _ValLoop(session)
    module._trainer.fit_loop.epoch_loop.val_loop = val_loop
    tracer = pl_adapter._Tracer()
    trainer = SimpleNamespace(callbacks=[tracer], world_size=1, accumulate_grad_batches=2, strategy=None,
                              fit_loop=module._trainer.fit_loop)
    tracer.setup(trainer, module, "fit")
    assert "run" in val_loop.__dict__ and tracer._val_ref() is val_loop
    val_loop.run()  # a sanity check: no update open, nothing paused
    batch = (SimpleNamespace(shape=(4, 2)),)
    module.on_train_batch_start(batch, 0)
    module.backward(None)  # (the first micro-batch: no optimizer step)
    u = tracer._u
    start = u.start
    val_loop.run()  # the validation inside the update
    assert val_loop.current == [None, None] and session.current is u and u.paused is None
    assert not tracer._traceml_off
    assert u.start > start  # the envelope starts later by the paused time
    tracer.teardown(trainer, module, "fit")
    assert "run" not in val_loop.__dict__  # the validation loop's own run again


def test_without_a_validation_loop_to_wrap_the_validation_hooks_pause_the_update(session) -> None:
    module = _Module()
    tracer = _wrapped(module)  # (a trainer with no fit_loop: nothing to wrap)
    assert tracer._val_ref is None
    trainer = SimpleNamespace(sanity_checking=False, callback_metrics={}, checkpoint_callbacks=())
    module.on_train_batch_start((SimpleNamespace(shape=(4, 2)),), 0)
    u = tracer._u
    tracer.on_validation_start(trainer, module)
    assert session.current is None and u.paused is not None and u.live
    tracer.on_validation_end(trainer, module)
    assert session.current is u and u.paused is None and not tracer._traceml_off
