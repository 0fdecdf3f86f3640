"""A trainer integration's reused update (sdk/session.py ``OpenUpdate``, ``Session.open_update``/``end_update``):
the same step records as a step state of its own per update, and no object kept per update."""

from __future__ import annotations

import json
import time
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceml_tui.sdk import session as session_mod
from traceml_tui.sdk.session import OpenUpdate, Session

from support.lanes import examples

_figure = st.one_of(st.none(), st.floats(0.0, 50.0))
_update = st.fixed_dictionaries({
    "gap_ms": st.floats(0.0, 30.0), "step_ms": st.floats(0.0, 30.0), "ok": st.booleans(),
    "loss": st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False)),
    "lr": st.one_of(st.none(), st.floats(0.0, 1.0)), "batch": st.one_of(st.none(), st.integers(0, 64)),
    "fwd": _figure, "bwd": _figure, "opt": _figure, "wait_s": st.one_of(st.none(), st.floats(0.0, 0.01)),
    "in_step_s": st.one_of(st.none(), st.floats(0.0, 0.01)),
    # what traceml.log stores beside the integration's figures (its loss is overridden by the integration's)
    "logged": st.one_of(st.just({}), st.fixed_dictionaries({}, optional={
        "loss": st.floats(0.0, 9.0), "examples": st.integers(0, 999), "metrics": st.just({"acc": 0.5}),
        "grad_norm": st.floats(0.0, 9.0)})),
})


def _replay(path: Path, updates: list[dict], reused: bool, max_steps: int | None, window: float, t0: float) -> bytes:
    session = Session(path, "u", rank=0, world_size=1, max_steps=max_steps, window_s=window)
    session._wall_offset = 1_000_000.0
    rss = iter(range(4096, 1 << 40, 4096))
    state = OpenUpdate()
    t = t0
    with mock.patch.object(session_mod, "_rss_bytes", lambda: next(rss)):  # the same figures for both sessions
        for u in updates:
            t += u["gap_ms"] / 1000.0
            if u["wait_s"] is not None:
                session.loader_wait(7, u["wait_s"])  # a fetch between updates: the next update's data wait
            if reused:
                session.open_update(state, t)
                assert session.current is state
                step = state
            else:
                step = session.begin(t)
            if u["in_step_s"] is not None:
                session.loader_wait(7, u["in_step_s"])
            step.fwd_ms, step.bwd_ms, step.opt_ms = u["fwd"], u["bwd"], u["opt"]
            step.values.update(u["logged"])
            t += u["step_ms"] / 1000.0
            if reused:
                state.loss, state.lr, state.examples = u["loss"], u["lr"], u["batch"]
                session.end_update(state, t, u["ok"])
            else:  # what the Lightning callback stored before the reused update
                for key, value in (("loss", u["loss"]), ("lr", u["lr"]), ("batch_size", u["batch"])):
                    if value is not None:
                        step.values[key] = value
                session.end(step, t, u["ok"])
        session.flush()
    data = session.path.read_bytes()
    session.close("completed")
    return data.split(b"\n", 1)[1]  # past the header (its uuid and clock differ)


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_update, max_size=30), st.sampled_from([None, 3]), st.sampled_from([0.0, 0.02]))
def test_a_reused_update_records_what_a_step_state_of_its_own_records(tmp_path, updates, max_steps, window) -> None:
    # the updates' timeline runs ahead of the real clock that stamps the writes (an hour on)
    t0 = time.perf_counter() + 3600.0
    case = tmp_path / f"case-{time.perf_counter_ns()}"
    reused = _replay(case / "reused", updates, True, max_steps, window, t0)
    assert reused == _replay(case / "own", updates, False, max_steps, window, t0)
    assert reused.count(b'"kind":"step"') == min(sum(u["ok"] for u in updates), max_steps or len(updates))


def test_an_ended_update_leaves_only_its_figures_held_and_the_state_ready_for_the_next(tmp_path) -> None:
    session = Session(tmp_path / "run", "u", rank=0, world_size=1, window_s=10.0)
    session.window.written_at = time.perf_counter()  # a write just happened: the next records are held
    state = OpenUpdate()
    t = time.perf_counter()
    for i in range(3):
        session.open_update(state, t + i)
        assert session.current is state and state.live
        state.fwd_ms, state.loss, state.lr, state.examples = 1.0, 0.5, 0.1, 8
        session.end_update(state, t + i + 0.5, True)
        assert session.current is None and not state.live
        assert (state.loss, state.lr, state.examples) == (None, None, None)  # the next update starts empty
    held = session.window.held
    assert len(held) == 3
    # one flat tuple of numbers per update: no step state, no values dict kept alive until the write
    assert all(type(entry) is tuple and all(type(v) in (int, float, type(None)) for v in entry) for entry in held)
    assert [entry[0] for entry in held] == [1, 2, 3]
    assert b'"kind":"step"' not in session.path.read_bytes()
    session.open_update(state, t + 10.0)
    session.end_update(state, t + 10.5, True)  # a window after the oldest held update's end: all four written
    assert session.window.held == []
    assert session.path.read_bytes().count(b'"kind":"step"') == 4
    session.close("completed")


def test_a_paused_update_moves_the_paused_time_to_its_input_wait_and_drops_the_fetches_in_between(tmp_path) -> None:
    """``pause_update``/``resume_update`` (a Lightning validation between two micro-batches of an update): the
    paused time leaves the traced envelope for the input wait, the loader fetches while paused are no update's
    data wait, a value logged while paused joins the update."""
    session = Session(tmp_path / "run", "u", rank=0, world_size=1, window_s=0.0)
    state = OpenUpdate()
    t = time.perf_counter() + 3600.0
    session.open_update(state, t)
    session.end_update(state, t + 0.010, True)  # update 1 ends at t + 10 ms
    session.open_update(state, t + 0.011)  # update 2: 1 ms gap
    session.loader_wait(7, 0.001)  # its first micro-batch's fetch: inside it
    session.pause_update(state, t + 0.015)
    assert session.current is None and state.live
    session.loader_wait(8, 0.2)  # the validation's fetches
    session.loader_wait(8, 0.2)
    session.carry["metrics"] = {"acc": 0.5}  # what traceml.log stores while no step is current
    session.resume_update(state, t + 0.515)
    assert session.current is state and state.paused is None and not session.carry
    assert session.data_pending is None and session.data_source is None
    session.loader_wait(7, 0.002)  # the second micro-batch's fetch
    session.end_update(state, t + 0.520, True)
    session.open_update(state, t + 0.521)  # update 3: no validation fetch in its data wait
    assert state.data_wait is None
    session.end_update(state, t + 0.522, False)
    session.flush()
    rows = [json.loads(line) for line in session.path.read_text().splitlines() if '"kind":"step"' in line]
    session.close("completed")
    cpu = rows[1]["cpu_ms"]
    assert cpu["step"] == pytest.approx(9.0, abs=1e-6)  # 509 ms less the 500 ms paused
    assert cpu["input_wait"] == pytest.approx(501.0, abs=1e-6)  # the 1 ms gap and the 500 ms paused
    assert cpu["data_in_step"] == pytest.approx(3.0, abs=1e-6)
    assert rows[1]["metrics"] == {"acc": 0.5}


def test_a_paused_update_of_the_first_step_leaves_the_paused_time_out(tmp_path) -> None:
    session = Session(tmp_path / "run", "u", rank=0, world_size=1, window_s=0.0)
    state = OpenUpdate()
    t = time.perf_counter() + 3600.0
    session.open_update(state, t)
    session.pause_update(state, t + 0.005)
    session.resume_update(state, t + 0.505)
    session.end_update(state, t + 0.510, True)
    session.flush()
    row = next(json.loads(line) for line in session.path.read_text().splitlines() if '"kind":"step"' in line)
    session.close("completed")
    assert row["cpu_ms"]["input_wait"] is None  # unknown, as any first step's
    assert row["cpu_ms"]["step"] == pytest.approx(10.0, abs=1e-6)


class _Event:
    """A CUDA event on a fake clock: ``elapsed_time`` in ms between two recorded times."""

    clock = 0.0

    def __init__(self, enable_timing: bool = True) -> None:
        self.at: float | None = None

    def record(self) -> None:
        self.at = _Event.clock

    def elapsed_time(self, other: "_Event") -> float:
        return (other.at - self.at) * 1000.0

    def query(self) -> bool:
        return True


def test_a_paused_update_on_the_gpu_moves_the_paused_time_to_its_input_wait() -> None:
    from types import SimpleNamespace

    from traceml_tui.sdk.phases import GpuStepEvents

    torch = SimpleNamespace(cuda=SimpleNamespace(Event=_Event))
    _Event.clock = 1.0
    prev_end = _Event()
    prev_end.record()
    _Event.clock = 1.002
    events = GpuStepEvents(torch, prev_end)  # the update starts 2 ms after the previous one's end
    _Event.clock = 1.010
    events.open("paused")
    _Event.clock = 1.410
    events.close_phase("paused")
    _Event.clock = 1.415
    events.close()
    phases = events.resolve()
    assert phases.step == pytest.approx(13.0) and phases.input_wait == pytest.approx(402.0)
