"""Data wait measured where it happens: the loader's ``next()`` (sdk/loader.py), in real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.core import records, steptime

#: Every script can ``nap(key, seconds)``: a sleep whose real length (a loaded machine oversleeps) is kept under
#: ``key`` and written to ``took.json`` at exit, so the tests compare each figure with what really happened;
#: ``Sleepy(n, s, key)`` is a dataset of ``n`` one-element tensors, each fetched by such a nap.
_PRELUDE = """import atexit, json, time
import traceml_tui as traceml
took = {}
def nap(key, seconds):
    start = time.perf_counter()
    time.sleep(seconds)
    took.setdefault(key, []).append((time.perf_counter() - start) * 1000.0)
atexit.register(lambda: open("took.json", "w").write(json.dumps(took)))
class Sleepy:
    def __init__(self, n, s, key): self.n, self.s, self.key = n, s, key
    def __len__(self): return self.n
    def __getitem__(self, i):
        import torch
        nap(self.key, self.s)
        return torch.ones(1)
"""


def _took(folder: Path) -> dict[str, list[float]]:
    """The naps of the script run in ``folder``, in ms, by key."""
    return json.loads((folder / "took.json").read_text())


def _script(tmp_path: Path, body: str, **env_extra: str) -> list[records.Step]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "script.py"
    path.write_text(_PRELUDE + body)
    env = dict(os.environ, TRACEML_RUN_DIR=str(tmp_path / "run"), TRACEML_RUN_NAME="run", OMP_NUM_THREADS="1")
    env.pop("TRACEML_TIME_DATALOADER", None)
    env.update(env_extra)
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = (tmp_path / "run" / "ranks" / "rank_0" / "steps-0.jsonl").read_bytes()
    return [r for r in map(records.decode, data.splitlines()) if isinstance(r, records.Step)]


def _check_sum(steps: list[records.Step]) -> None:
    for step in steps:
        parts = steptime.step_parts(step.cpu_ms)
        assert all(v >= 0 for v in parts.parts())
        assert sum(parts.parts()) == pytest.approx(parts.whole, rel=1e-9)


def test_wrap_loader_times_next_and_the_rest_of_the_gap_is_between_steps(tmp_path: Path) -> None:
    body = """
def batches():
    for i in range(6):
        nap("load", 0.06)  # loading (the margins below are 40–60 ms: a loaded machine preempts for 10–20)
        yield i
for batch in traceml.wrap_loader(batches()):
    with traceml.trace_step():
        pass
    nap("log", 0.04)  # e.g. logging, outside the loader
"""
    steps = _script(tmp_path, body)
    took = _took(tmp_path)
    assert len(steps) == 6
    _check_sum(steps)
    for step in steps[1:]:  # step s was fed batch s - 1, loaded after the logging that followed step s - 1
        load, log = took["load"][step.step - 1], took["log"][step.step - 2]
        assert load <= step.cpu_ms.data_wait < load + log  # the fetch, and none of the logging
        parts = steptime.step_parts(step.cpu_ms)
        assert log <= parts.between_steps < log + load  # the logging, and none of the fetch
        assert parts.data_wait == pytest.approx(step.cpu_ms.data_wait)


def test_plain_dataloader_is_timed_without_code_changes_and_can_opt_out(tmp_path: Path) -> None:
    body = """
import torch
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self): return 24
    def __getitem__(self, i):
        nap("item", 0.015)  # a batch of four: 60 ms, so twice it is far from one plus a preemption
        return torch.ones(2)
loader = DataLoader(Slow(), batch_size=4, num_workers=0)
for batch in loader:
    with traceml.trace_step():
        pass
"""

    def fetches(folder: Path) -> list[float]:  # each batch's four item loads
        items = _took(folder)["item"]
        return [sum(items[i:i + 4]) for i in range(0, len(items), 4)]

    steps = _script(tmp_path / "on", body)
    _check_sum(steps)
    assert steps[0].cpu_ms.input_wait is None
    fetch = fetches(tmp_path / "on")
    for step in steps[1:]:  # step s was fed batch s - 1 (counted twice would be at least twice the fetch)
        assert fetch[step.step - 1] <= step.cpu_ms.data_wait < 2 * fetch[step.step - 1]
        assert step.cpu_ms.data_wait <= step.cpu_ms.input_wait
    off = _script(tmp_path / "off", body, TRACEML_TIME_DATALOADER="0")
    fetch = fetches(tmp_path / "off")
    assert all(s.cpu_ms.data_wait is None for s in off)
    assert all(steptime.step_parts(s.cpu_ms).between_steps >= fetch[s.step - 1] for s in off[1:])


def test_a_validation_loader_between_steps_is_between_steps_and_a_wrapped_dataloader_counts_once(tmp_path: Path) -> None:
    body = """
import torch
from torch.utils.data import DataLoader
train = traceml.wrap_loader(DataLoader(Sleepy(8, 0.04, "train"), batch_size=1))  # wrapped and patched: timed once
val = DataLoader(Sleepy(5, 0.02, "val"), batch_size=1)
for i, batch in enumerate(train):
    with traceml.trace_step():
        pass
    if i % 2 == 1:
        for v in val:  # evaluation between steps: not the training loop's data wait
            pass
"""
    steps = _script(tmp_path, body)
    _check_sum(steps)
    took = _took(tmp_path)["train"]
    for step in steps[1:]:  # step s was fed batch s - 1, fetched after step s - 1 ended
        fetch = took[step.step - 1]
        # one training batch, counted once (twice would be at least twice the fetch)
        assert fetch <= step.cpu_ms.data_wait < 1.8 * fetch
    after_eval = [s for s in steps[1:] if s.step % 2 == 1]
    assert after_eval and all(steptime.step_parts(s.cpu_ms).between_steps >= 80.0 for s in after_eval)


def test_a_validation_loop_before_the_next_epoch_is_not_that_epochs_data_wait(tmp_path: Path) -> None:
    """Epochs of a hand-written loop, each followed by a plain ``for`` over a validation DataLoader. CPython
    gives the next epoch's training iterator the address of the validation iterator just freed, so a session
    that knew the loader that fed the wait by its ``id()`` added the validation fetches to the next epoch's
    first data wait (about 200 ms here); it holds the iterator itself."""
    body = """
import torch
from torch.utils.data import DataLoader
train = DataLoader(Sleepy(2, 0.0, "train"), batch_size=1)
val = DataLoader(Sleepy(4, 0.05, "val"), batch_size=1)
for epoch in range(3):
    for batch in train:
        with traceml.trace_step():
            pass
    for v in val:
        pass
"""
    steps = _script(tmp_path, body)
    _check_sum(steps)
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 6]
    for s in steps:  # every fetch of the training loader is instant; 4 × 50 ms of validation would show
        assert s.cpu_ms.data_wait is None or s.cpu_ms.data_wait < 50.0, (s.step, s.cpu_ms.data_wait)
    assert all(steptime.step_parts(s.cpu_ms).between_steps >= 150.0 for s in steps if s.step in (3, 5))


def test_next_inside_the_traced_step_is_data_in_step_and_other_threads_are_ignored(tmp_path: Path) -> None:
    body = """
import threading
def slow(key):
    while True:
        nap(key, 0.05)  # twice a fetch is 50 ms more than one: more than a loaded machine preempts for
        yield 1
it = iter(traceml.wrap_loader(slow("main")))
other = traceml.wrap_loader(slow("other"))
stop = False
def background():
    for _ in other:  # another thread's loader (a prefetcher): never this loop's data wait
        if stop:
            break
thread = threading.Thread(target=background)
thread.start()
for _ in range(4):
    with traceml.trace_step():
        next(it)
stop = True
thread.join()
"""
    steps = _script(tmp_path, body)
    took = _took(tmp_path)
    _check_sum(steps)
    assert took["other"]  # the other thread's loader did wait meanwhile
    for step in steps:  # this loop's own fetch, once; never the other thread's
        fetch = took["main"][step.step - 1]
        assert fetch <= step.cpu_ms.data_in_step < 2 * fetch
        assert step.cpu_ms.data_wait is None
        parts = steptime.step_parts(step.cpu_ms)
        assert parts.data_wait == pytest.approx(step.cpu_ms.data_in_step)
        assert parts.residual < step.cpu_ms.step - step.cpu_ms.data_in_step + 1e-6


def test_trace_loader_times_the_loader_iterated_inside_the_block(tmp_path: Path) -> None:
    body = """
class Batches:
    def __iter__(self):
        for i in range(4):
            nap("load", 0.05)
            yield i
loader = Batches()
with traceml.trace_loader(loader):
    for batch in loader:
        with traceml.trace_step():
            pass
assert type(loader) is Batches  # restored
listed = [1, 2, 3]
with traceml.trace_loader(listed) as timed:  # a builtin: the returned iterable is the timed one
    for batch in timed:
        time.sleep(0.001)
        with traceml.trace_step():
            pass
"""
    steps = _script(tmp_path, body)
    load = _took(tmp_path)["load"]
    _check_sum(steps)
    assert all(load[s.step - 1] <= s.cpu_ms.data_wait < 2 * load[s.step - 1] for s in steps[1:4])
    assert all(s.cpu_ms.data_wait is not None for s in steps[4:])
