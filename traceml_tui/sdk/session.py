"""One rank's recording session: the step clock and the rank's record stream.

Everything on the per-step path is plain attribute access and ``perf_counter``;
the step record goes through the write window (``sdk/window.py``), which writes
short updates' records a few at a time: the budget is ≤ 10 µs per traced step
without phase hooks (see tests/benchmarks/bench_sdk_overhead.py).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import uuid as uuid_mod
from collections import deque
from pathlib import Path
from threading import get_ident
from time import perf_counter
from typing import Any, Callable, Optional

from traceml_tui.core import atomic, jsonl, records
from traceml_tui.core.rundir import RunDir, validate_run_name
from traceml_tui.sdk import env
from traceml_tui.sdk import window as _window
from traceml_tui.sdk.errors import Refused

#: The step record is built with positional arguments on the per-step path (about 0.9k instructions fewer
#: than keywords); these are the field orders it relies on, checked once here.
_PHASES_ORDER = ("step", "input_wait", "h2d", "forward", "backward", "optimizer", "data_wait", "data_in_step")
_STEP_ORDER = ("v", "run", "rank", "attempt", "step", "ts", "cpu_ms", "gpu_ms", "loss", "lr", "grad_norm", "examples",
               "mem", "components", "metrics")
if records.Phases.__struct_fields__ != _PHASES_ORDER or records.Step.__struct_fields__ != _STEP_ORDER:
    raise ImportError("sdk/session.py builds step records positionally: update it to the new record fields")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_RSS_PERIOD_S = 1.0


def _rss_bytes() -> Optional[int]:
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def _as_float(value: Any) -> Optional[float]:
    """Convert a number or a one-element tensor to a finite float (None otherwise)."""
    if type(value) is float:  # the common cases, kept cheap: they run several times per step
        return value if value - value == 0.0 else None
    item = getattr(value, "item", None)
    if item is not None:
        try:
            value = item()
        except (RuntimeError, ValueError):
            return None
        if type(value) is float:  # a one-element float tensor
            return value if value - value == 0.0 else None
    return records.finite_or_none(value)


def _holds_device_tensor(values: dict[str, Any]) -> bool:
    """Whether an update's logged values hold a tensor off the CPU (inside ``components``/``metrics`` too).

    Plain numbers pass at the first test: this runs once per update.
    """
    for value in values.values():
        kind = type(value)
        if kind is float or kind is int or value is None:
            continue
        if _on_device(value):
            return True
    return False


def _on_device(value: Any, depth: int = 0) -> bool:
    """A torch tensor on an accelerator (or the meta device), or a dict/tuple/list holding one (3 levels)."""
    if getattr(value, "is_cpu", True) is False:
        return True
    kind = type(value)
    if depth < 3 and (kind is dict or kind is tuple or kind is list):
        return any(_on_device(v, depth + 1) for v in (value.values() if kind is dict else value))
    return False


def _mean_square(target: Any) -> Any:
    """Mean square of a target: a tensor stays a (lazy) tensor; a number is taken as already reduced."""
    if hasattr(target, "detach") and hasattr(target, "float"):
        return target.detach().float().pow(2).mean()
    return target


def detect_rank() -> tuple[int, int]:
    """(rank, world_size) from torch.distributed when initialized, else RANK/WORLD_SIZE, else (0, 1)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                return int(dist.get_rank()), int(dist.get_world_size())
        except (RuntimeError, ValueError):
            pass
    try:
        rank = int(os.environ.get("RANK", "0"))
    except ValueError:
        rank = 0
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        world = 1
    return rank, world


def last_recorded_step(run_dir: Path, rank: int) -> tuple[int, int]:
    """(highest attempt number, highest completed step) among one rank's existing step files.

    Returns (-1, 0) when the rank has no files yet. Only complete lines count.
    """
    best_attempt, best_step = -1, 0
    for stream in RunDir(run_dir).step_files(rank):
        best_attempt = max(best_attempt, stream.attempt)
        best_step = max(best_step, _last_step_in_file(stream.path))
    return best_attempt, best_step


#: Bytes of a step file's end read to find its newest step.
_TAIL_LIMIT = 1 << 20


def _read_tail(handle, limit: int = _TAIL_LIMIT) -> tuple[bytes, bool]:
    """The last ``limit`` bytes of an open file, and whether that is the whole file."""
    size = handle.seek(0, os.SEEK_END)
    chunk = min(size, limit)
    handle.seek(size - chunk)
    return handle.read(chunk), chunk == size


def _last_step_in_file(path: Path) -> int:
    lines = jsonl.read_tail_lines(path, _TAIL_LIMIT)  # complete lines of the last MiB (core/jsonl.py)
    for record in jsonl.iter_records(reversed(lines), (records.Step, records.RankEnd)):
        if record.step:
            return record.step
    return 0


def examples_before(run_dir: Path, rank: int, step: int) -> Optional[int]:
    """Examples seen after update ``step - 1`` by one rank's earlier attempts (None: not recorded).

    A resume continues counting from there (seed 004: examples seen are
    cumulative across attempts), whether it starts right after the previous
    attempt's last record or re-runs from an earlier checkpoint. The newest
    attempt that recorded update ``step - 1`` is the one that counts.
    """
    if step <= 1:
        return None
    for stream in reversed(RunDir(run_dir).step_files(rank)):
        found, examples = _examples_at(stream.path, step - 1)
        if found:
            return examples
    return None


def _examples_at(path: Path, step: int) -> tuple[bool, Optional[int]]:
    """(whether the file records update ``step``, its ``examples``); the tail is read first."""
    try:
        with open(path, "rb") as handle:
            data, whole = _read_tail(handle)
            if not whole and _first_step(data) > step:  # resumed from far back: read the whole file
                handle.seek(0)
                data, whole = handle.read(), True
    except OSError:
        return False, None
    for record in jsonl.iter_records(reversed(jsonl.complete_lines(data, partial_head=not whole)), (records.Step,)):
        if record.step == step:
            return True, record.examples
    return False, None


def _first_step(data: bytes) -> int:
    """The first step recorded in a tail of a file (its first piece may be a partial line)."""
    record = next(jsonl.iter_records(jsonl.complete_lines(data, partial_head=True), (records.Step,)), None)
    return record.step if record is not None else 0


class _StepState:
    """Timestamps and values gathered during one traced step (CPU perf_counter seconds)."""

    __slots__ = (
        "start", "input_wait_ms", "data_wait", "data_in_step", "fwd_start", "fwd_ms", "bwd_start", "bwd_ms",
        "opt_start", "opt_ms", "values", "gpu", "opt_manual",
    )

    def __init__(self, start: float, input_wait_ms: Optional[float], data_wait: Optional[float]) -> None:
        self.start = start
        self.input_wait_ms = input_wait_ms
        self.data_wait = data_wait  # s in an instrumented loader's next() since the previous step ended
        self.data_in_step: Optional[float] = None  # s in an instrumented loader's next() inside this step
        self.fwd_start = None
        self.fwd_ms = None
        self.bwd_start = None
        self.bwd_ms = None
        self.opt_start = None
        self.opt_ms = None
        self.values: dict[str, Any] = {}
        self.gpu = None  # phases.GpuStepEvents when CUDA timing is active
        # The optimizer part is timed by the caller (phases.begin_phase/end_phase), not by torch's global
        # optimizer hooks: under a closure (Lightning, LBFGS) those would count forward and backward too.
        self.opt_manual = False


def _detached(state: _StepState, loss: Any, lr: Any, examples: Optional[int]) -> _StepState:
    """A copy of a reused step state for :meth:`Session.end`, its figures among its values; the state keeps none."""
    copy = _StepState(state.start, state.input_wait_ms, state.data_wait)
    copy.data_in_step, copy.fwd_ms, copy.bwd_ms, copy.opt_ms = state.data_in_step, state.fwd_ms, state.bwd_ms, state.opt_ms
    copy.gpu, copy.opt_manual = state.gpu, state.opt_manual
    values = copy.values
    if state.values:
        values.update(state.values)
        state.values.clear()
    if loss is not None:
        values["loss"] = loss
    if lr is not None:
        values["lr"] = lr
    if examples is not None:
        values["batch_size"] = examples
    state.gpu = None
    return copy


class OpenUpdate(_StepState):
    """A trainer integration's step state: one object per callback, reused by every update it times.

    :meth:`Session.open_update` resets it and makes it the current step (the loader's data wait, ``traceml.log``
    and the phase hooks see it as any step state); :meth:`Session.end_update` hands its figures to the write
    window as one flat tuple and keeps no object. An update then touches the same few memory lines every time
    instead of a new step state and values dict: a trainer's own working set evicts every line traceml
    touches between two updates, so each distinct line is a cache miss per update (docs/trainers.md,
    "The second-level cache"). ``loss``, ``lr`` and ``examples`` (the update's examples, as ``batch_size``)
    are the integration's figures; ``live`` says an update is open, ``paused`` since when work that is not its
    own runs inside it (:meth:`Session.pause_update`).
    """

    __slots__ = ("live", "loss", "lr", "examples", "paused")

    def __init__(self) -> None:
        super().__init__(0.0, None, None)
        self.live = False
        self.loss: Any = None
        self.lr: Any = None
        self.examples: Optional[int] = None
        self.paused: Optional[float] = None  # perf_counter when the open update was paused (None: running)
        self.opt_manual = True  # the caller times the optimizer part, never torch's hooks around a closure


class Session:
    """The recording state of one rank for one attempt."""

    def __init__(
        self,
        run_dir: Path,
        run_name: str,
        *,
        rank: int,
        world_size: int,
        start_step: Optional[int] = None,
        max_steps: Optional[int] = None,
        window_s: Optional[float] = None,
    ) -> None:
        # The attributes every update reads or writes come first: an instance's attribute values are stored in
        # the order they are first set, so these share one or two memory lines (docs/trainers.md, "The
        # second-level cache").
        self.closed = False
        self.thread: Optional[int] = get_ident()  # the thread whose loader waits count (None once closed)
        self.current: Optional[_StepState] = None
        # The loader iterator that produced data_pending, held (not its id(): a validation loop's iterator,
        # freed, leaves its address to the next epoch's training iterator, which would then add the
        # validation fetches to its data wait); released when the next step begins.
        self.data_source: Any = None
        self.data_pending: Optional[float] = None  # loader wait (s) since the previous step ended
        self.prev_end: Optional[float] = None
        self.carry: dict[str, Any] = {}  # values logged outside a step join the next one
        self.cuda = False
        self.next_step = 1
        self.max_steps = max_steps
        self.window: Any = None
        self.run_dir = run_dir
        self.run_name = run_name
        self.rank = rank
        self.world_size = world_size
        last_attempt, last_step = last_recorded_step(run_dir, rank)
        self.attempt = last_attempt + 1
        if start_step is None:
            start_step = last_step + 1
        if start_step > last_step + 1:
            raise ValueError(
                f"start_step {start_step} would leave a gap: the history of rank {rank} ends at step {last_step}"
            )
        if start_step < 1:
            raise ValueError("start_step must be at least 1")
        self.next_step = start_step
        self.path = RunDir(run_dir).steps_file(rank, self.attempt)
        self.fd = atomic.open_append(self.path)
        node_rank = os.environ.get(env.NODE_RANK)
        header = records.Header(
            v=records.RECORD_VERSION,
            run=run_name,
            rank=rank,
            attempt=self.attempt,
            uuid=uuid_mod.uuid4().hex,
            ts=time.time(),
            node_rank=int(node_rank) if node_rank and node_rank.isdigit() else None,
            world_size=world_size,
        )
        atomic.append_line(self.fd, records.encode(header))
        # cumulative across attempts: a resume counts on from the previous attempts' record of the update before
        self.examples: Optional[int] = examples_before(run_dir, rank, start_step)
        self.pending: deque = deque()  # steps waiting for their CUDA events
        self._torch: Any = None
        self.gpu_prev_end: Any = None  # CUDA event at the end of the previous step (GPU input wait)
        self.hooked_model: Any = None
        self.unmeasured: set[str] = set()  # streams already reported dark (one record per stream per session)
        # the step records' writer (sdk/window.py); its lock also keeps the watchdog's writes off a descriptor
        # that close() is closing (never taken twice per step)
        self.window = _window.WriteWindow(self.fd, self._record, _window.window_s() if window_s is None else window_s)
        self._mem = records.Memory()  # the last step's memory figures (RSS is sampled once a second)
        self._rss_at = -_RSS_PERIOD_S
        self.watchdog: Any = None  # sdk.watchdog.Watchdog, started by traceml.init()
        self.failed = False
        self.interrupted = False  # the uncaught exception was a KeyboardInterrupt (Ctrl-C)
        # perf_counter → wall clock, so records carry wall time without a second clock read per step
        self._wall_offset = time.time() - time.perf_counter()

    # -- step clock ---------------------------------------------------------------------------
    def enable_cuda(self) -> None:
        """Time steps on the GPU too (CUDA events); called once a traced model is on CUDA."""
        if not self.cuda:
            import torch

            self._torch = torch
            self.cuda = True

    def loop_started(self) -> None:
        """A trainer's training loop starts (each ``fit``/``train``): its first update's input wait is unknown, as
        a session's first step's is, not the time since another loop's last step (model building, a test run)."""
        self.prev_end = None
        self.gpu_prev_end = None
        self.data_pending = self.data_source = None

    def loader_wait(self, source: Any, seconds: float) -> None:
        """Credit one timed loader ``next()`` (``sdk/loader.py``) to the step it fed.

        Inside a traced step it is that step's; between steps only the loader that
        produced the last batch counts (a switch to another loader starts over).
        """
        state = self.current
        if state is not None:
            state.data_in_step = seconds if state.data_in_step is None else state.data_in_step + seconds
        elif self.data_source is source:
            self.data_pending += seconds  # type: ignore[operator]
        else:
            self.data_source = source
            self.data_pending = seconds

    def begin(self, now: float) -> _StepState:
        wait = (now - self.prev_end) * 1000.0 if self.prev_end is not None else None
        state = _StepState(now, wait, self.data_pending)
        if self.data_pending is not None:
            self.data_pending = self.data_source = None
        if self.carry:
            state.values.update(self.carry)
            self.carry.clear()
        if self.cuda:
            from traceml_tui.sdk.phases import GpuStepEvents

            state.gpu = GpuStepEvents(self._torch, self.gpu_prev_end)
        self.current = state
        return state

    def end(self, state: _StepState, now: float, ok: bool) -> None:
        self.current = None
        self.prev_end = now
        if state.gpu is not None:
            state.gpu.close()  # also for a failed step: the next step's input wait starts here
            self.gpu_prev_end = state.gpu.end
        if not ok:
            return
        step = self.next_step
        self.next_step += 1
        if self.max_steps is not None and step > self.max_steps:
            return
        if state.gpu is not None:
            self.pending.append((step, now, state))
            self.drain_gpu(block=False, now=now)
            return
        values = state.values
        for value in values.values():
            # (_holds_device_tensor inline: plain numbers, what the trainer integrations hand over, need no call)
            kind = type(value)
            if kind is not float and kind is not int and value is not None:
                break
        else:
            values = None
        if values and _holds_device_tensor(values):
            # Read now, on this thread, as before the window: a held record is built by whichever thread writes
            # it (the watchdog thread, the SIGTERM handler), and reading a tensor on an accelerator waits for
            # the device — behind a hung collective, forever, with the window's lock held (docs/run.md, "SDK").
            self.window.flush(now)  # the held updates first: ``examples`` counts on in step order
            self.window.add(now, self._build(step, now, state, None))
        else:  # built when written (sdk/window.py)
            self.window.add(now, (step, now, state.start, state.input_wait_ms, state.data_wait, state.data_in_step,
                                  state.fwd_ms, state.bwd_ms, state.opt_ms, None, None, None, state.values))

    def open_update(self, state: OpenUpdate, now: float) -> None:
        """Open an update on a trainer integration's reused step state (:meth:`begin` without a new object)."""
        prev = self.prev_end
        state.start = now
        state.input_wait_ms = (now - prev) * 1000.0 if prev is not None else None
        pending = state.data_wait = self.data_pending
        if pending is not None:
            self.data_pending = self.data_source = None
        state.data_in_step = state.fwd_ms = state.bwd_ms = state.opt_start = state.opt_ms = None
        state.fwd_start = state.bwd_start = None
        if self.carry:
            state.values.update(self.carry)
            self.carry.clear()
        if self.cuda:
            from traceml_tui.sdk.phases import GpuStepEvents

            state.gpu = GpuStepEvents(self._torch, self.gpu_prev_end)
        state.live = True
        self.current = state

    def pause_update(self, state: OpenUpdate, now: float) -> None:
        """Work that is no part of the open update starts inside it (a trainer's validation run between two
        micro-batches of an accumulated update): the update's clock stops until :meth:`resume_update`.

        Meanwhile there is no current step: loader fetches are not the update's (nor the next update's data
        wait: :meth:`resume_update` drops them), ``traceml.log`` values wait for the resume, the phase hooks
        time nothing.
        """
        state.paused = now
        self.current = None
        if state.gpu is not None:
            state.gpu.open("paused")

    def resume_update(self, state: OpenUpdate, now: float) -> None:
        """The update :meth:`pause_update` paused goes on: the paused time leaves its traced envelope for its input
        wait (the between-steps part, core/steptime.py), so that it reads as if that work had run before the
        update began, as the same work run between two updates does. The parts still sum to the step time; the
        first update of a loop, whose input wait is unknown, leaves the paused time out of the step time."""
        paused = now - state.paused if state.paused is not None else 0.0
        state.paused = None
        state.start += paused
        if state.input_wait_ms is not None:
            state.input_wait_ms += paused * 1000.0
        # an open update leaves nothing pending (open_update took it): what is pending now was fetched while paused
        self.data_pending = self.data_source = None
        if self.carry:  # logged while paused: the update's, as values logged before an update are
            state.values.update(self.carry)
            self.carry.clear()
        if state.gpu is not None:
            state.gpu.close_phase("paused")
        self.current = state

    def end_update(self, state: OpenUpdate, now: float, ok: bool) -> None:
        """End the update :meth:`open_update` opened (``ok``: it counts as a step) at ``now``.

        Its figures (phases, ``loss``, ``lr``, ``examples`` as the update's batch size) go to the write window
        as one flat tuple, the state is cleared for the next update and no object is kept: the record is built
        when written, exactly as :meth:`end`'s. An update with CUDA events, values logged through
        ``traceml.log`` or a tensor off the CPU takes :meth:`end`'s path with a copy of the state.
        """
        state.live = False
        loss, lr, examples = state.loss, state.lr, state.examples
        state.loss = state.lr = state.examples = None
        if state.gpu is not None or state.values or (
                loss is not None and type(loss) is not float and _on_device(loss)) or (
                lr is not None and type(lr) is not float and _on_device(lr)):
            self.end(_detached(state, loss, lr, examples), now, ok)
            return
        self.current = None
        self.prev_end = now
        if not ok:
            return
        step = self.next_step
        self.next_step = step + 1
        if self.max_steps is not None and step > self.max_steps:
            return
        self.window.add(now, (step, now, state.start, state.input_wait_ms, state.data_wait, state.data_in_step,
                              state.fwd_ms, state.bwd_ms, state.opt_ms, loss, lr, examples))

    def drain_gpu(self, *, block: bool, now: Optional[float] = None) -> None:
        """Hand the steps whose CUDA events completed (all of them when ``block``) to the write window.

        Their records are built here, on the training thread (the CUDA memory figures are its device's);
        ``block`` also writes every held record (:meth:`flush`).
        """
        while self.pending:
            step, end, state = self.pending[0]
            if not block and not state.gpu.ready():
                break
            self.pending.popleft()
            record = self._build(step, end, state, state.gpu.resolve())
            if record is not None:
                self.window.add(perf_counter() if now is None else now, record)
        if block:
            self.window.flush(perf_counter())

    def flush(self, *, wait_gpu: bool = True) -> None:
        """Write every step record this rank holds now (``wait_gpu``: after waiting for the GPU steps' events).

        For whoever needs the steps on disk at a point: ``traceml.finish()``, a trainer callback before its
        ``train()``/``fit()`` returns, a recovery save, the exit and exception paths.
        """
        if self.pending:
            try:
                self.drain_gpu(block=wait_gpu)
            except Exception:  # noqa: BLE001 - a CUDA error must not keep the CPU steps off the disk
                pass
        self.window.flush(perf_counter())

    def _build(self, step: int, now: float, state: _StepState, gpu: Optional[records.Phases]) -> records.Step:
        """One update's step record from its step state (:meth:`_record`)."""
        return self._record(step, now, state.start, state.input_wait_ms, state.data_wait, state.data_in_step,
                            state.fwd_ms, state.bwd_ms, state.opt_ms, None, None, None, state.values, gpu)

    def _record(self, step: int, now: float, start: float, input_wait_ms: Optional[float], data_wait: Optional[float],
                data_in_step: Optional[float], fwd_ms: Optional[float], bwd_ms: Optional[float],
                opt_ms: Optional[float], loss: Any = None, lr: Any = None, batch_size: Optional[int] = None,
                values: Optional[dict[str, Any]] = None, gpu: Optional[records.Phases] = None) -> records.Step:
        """One update's step record; in step order (``examples`` counts on from the previous record).

        The write window's builder: a held entry is this call's arguments. ``loss``, ``lr`` and ``batch_size``
        are a trainer integration's figures (:meth:`end_update`); ``values`` what ``traceml.log`` stored (an
        integration's figure wins over a logged one, a logged ``examples`` over ``batch_size``). No helper
        called for a value that was not logged, one Memory object reused until its figures change (RSS is
        read once a second).
        """
        if data_wait is not None:
            data_wait *= 1000.0
        if data_in_step is not None:
            data_in_step *= 1000.0
        cpu = records.Phases((now - start) * 1000.0, input_wait_ms, None, fwd_ms, bwd_ms, opt_ms, data_wait,
                             data_in_step)  # (_PHASES_ORDER)
        if gpu is not None:  # loader waits are CPU measurements; steptime caps them to the GPU gap/envelope
            gpu.data_wait = data_wait
            gpu.data_in_step = data_in_step
        mem = self._mem
        if now - self._rss_at >= _RSS_PERIOD_S:
            self._rss_at = now
            rss = _rss_bytes()
            if rss != mem.rss:
                mem = self._mem = records.Memory(rss=rss)
        if self.cuda:
            torch = sys.modules.get("torch")
            if torch is not None:
                mem = self._mem = records.Memory(rss=mem.rss, cuda_peak_allocated=int(torch.cuda.max_memory_allocated()),
                                                 cuda_peak_reserved=int(torch.cuda.max_memory_reserved()))
        examples = self.examples
        if values:
            if loss is None:
                loss = values.get("loss")
            if lr is None:
                lr = values.get("lr")
            if "examples" in values:
                examples = values["examples"]
                batch_size = None
            elif batch_size is None:
                batch_size = values.get("batch_size")
            grad_norm, components, metrics = values.get("grad_norm"), values.get("components"), values.get("metrics")
        else:
            grad_norm = components = metrics = None
        if batch_size is not None:
            examples = (examples or 0) + batch_size
        record = records.Step(  # (_STEP_ORDER)
            records.RECORD_VERSION, self.run_name, self.rank, self.attempt, step, now + self._wall_offset, cpu,
            gpu, None if loss is None else _as_float(loss), None if lr is None else _as_float(lr),
            None if grad_norm is None else _as_float(grad_norm), examples, mem,
            _components(components) if components else None, _metrics(metrics) if metrics else None,
        )
        # counted on once the record is built: a build that raised, or that a SIGTERM handler on this thread
        # repeated (it writes the held records: sdk/window.py), counts its examples once
        self.examples = examples
        return record

    # -- other records ------------------------------------------------------------------------
    @property
    def last_step(self) -> int:
        return self.next_step - 1

    def write(self, record: records.Record) -> None:
        """Append one record (eval, checkpoint, unmeasured…) after the step records the window holds.

        Nothing is written once the session is closed (after ``rank_end``, or in a forked child).
        """
        self.window.write(records.encode(record), perf_counter())

    def write_aside(self, record: records.Record) -> bool:
        """Append one record from another thread (the hang watchdog); False when the session is closed.

        The held step records first, then it, in one ``os.write`` loop under the
        window's lock (the training thread writes under it too), which also keeps
        it off a descriptor that :meth:`close` is closing (a closed descriptor's
        number may be reused).
        """
        return self.window.write(records.encode(record), perf_counter())

    def close(self, status: str, exit_code: Optional[int] = None, *, wait_gpu: bool = True) -> None:
        """Write ``rank_end``; ``wait_gpu=False`` emits only the steps whose CUDA events already completed."""
        if self.closed:
            return
        try:
            self.drain_gpu(block=wait_gpu)
        except Exception:  # noqa: BLE001 - a CUDA error at exit must not hide the rank_end record
            pass
        line = records.encode(records.RankEnd(
            v=records.RECORD_VERSION,
            run=self.run_name,
            rank=self.rank,
            attempt=self.attempt,
            step=self.last_step if self.max_steps is None else min(self.last_step, self.max_steps),
            ts=time.time(),
            status=status,
            exit_code=exit_code,
        ))
        # rank_end (after every step record the window holds) and the closed flags under one hold of the
        # window's lock: a hang the watchdog thread records, or a SIGTERM handled on this thread, after it is
        # written finds the session closed, so nothing follows rank_end in the file (and no second rank_end)
        with self.window.lock:
            if self.closed:
                return
            self.window.write(line, perf_counter())
            self.window.closed = self.closed = True
        if self.watchdog is not None:
            self.watchdog.stop()
        with self.window.lock:
            os.close(self.fd)
        self.thread = None


def _components(raw: Any) -> Optional[dict[str, records.Component]]:
    if not raw:
        return None
    out: dict[str, records.Component] = {}
    for name, spec in raw.items():
        weight: Any = 1.0
        if isinstance(spec, dict):
            value = spec.get("value")
            target_ms = spec.get("target_ms", spec.get("target"))
            weight = spec.get("weight", 1.0)
        elif isinstance(spec, (tuple, list)):
            value = spec[0]
            target_ms = spec[1] if len(spec) > 1 else None
            if len(spec) > 2:
                weight = spec[2]
        else:
            value, target_ms = spec, None
        v = _as_float(value)
        t = _as_float(target_ms)
        w = _as_float(weight)
        w = 1.0 if w is None else w
        ratio = v / t if (v is not None and t is not None and t > 0.0) else None
        out[str(name)] = records.Component(
            value=v,
            weight=w,
            weighted=None if v is None else v * w,
            target_ms=t,
            ratio=ratio,
        )
    return out


def _metrics(raw: Any) -> Optional[dict[str, Optional[float]]]:
    if not raw:
        return None
    return {str(k): _as_float(v) for k, v in raw.items()}


def resolve_run(run_name: Optional[str], logs_dir: Optional[str]) -> tuple[Path, str]:
    """Run directory and name: the launcher's (environment) or ``./logs/<run-name>``.

    Outside the launcher the name must pass :func:`traceml_tui.core.rundir.validate_run_name`
    (``ValueError`` otherwise), exactly as ``traceml run --run-name`` requires.
    """
    launched = os.environ.get(env.RUN_DIR)
    if launched:
        path = Path(launched)
        return path, os.environ.get(env.RUN_NAME) or path.name
    if not run_name:
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
        run_name = run_id if run_id and run_id != "none" else time.strftime("run-%Y%m%d-%H%M%S")
    validate_run_name(run_name)  # the launcher's rule: one plain folder under the logs folder
    return Path(logs_dir or "logs") / run_name, run_name


#: Every session this process registered, oldest first, with its ``after`` and the pid that made it: ``init()``
#: after ``finish()`` starts another session, and the exit, exception and SIGTERM hooks (installed once per
#: process) act on each one this process owns. Per-session hooks piled up, and the SIGTERM handler, installed
#: only over the default action, kept pointing at the first (closed) session, so a second session's rank ended
#: by SIGTERM left no ``rank_end``.
_REGISTERED: list[tuple[Session, Optional[Callable[[Session], Any]], int]] = []
#: The pid whose exception and exit hooks are installed (a forked child that starts a session installs its own).
_hooks_pid: Optional[int] = None


def _owned_sessions() -> list[Session]:
    """This process's registered sessions, oldest first (a forked child owns none of its parent's)."""
    pid = os.getpid()
    return [session for session, _after, owner in _REGISTERED if owner == pid]


def register_exit(session: Session, after: Optional[Callable[[Session], Any]] = None) -> None:
    """Write ``rank_end`` at interpreter exit, then call ``after(session)`` (also after ``finish()``).

    An uncaught exception marks the rank ``failed`` (``interrupted`` for a
    KeyboardInterrupt). Otherwise the process
    ``exited`` with a code the SDK cannot see (``sys.exit(n)`` never reaches an
    exception hook), so ``exit_code`` stays null rather than a guessed 0; the
    launcher records the real code in the manifest. A forked child inherits the
    session but is not its writer: it never writes to the rank's file. The
    hooks are installed once per process and serve every session it starts
    (:data:`_REGISTERED`).
    """
    global _hooks_pid
    pid = os.getpid()
    _REGISTERED.append((session, after, pid))
    if _hooks_pid != pid:
        _hooks_pid = pid
        _install_exception_and_exit_hooks(pid)
    _end_on_sigterm()


def _install_exception_and_exit_hooks(owner_pid: int) -> None:
    previous_hook = sys.excepthook

    def _excepthook(exc_type, exc, tb):  # type: ignore[no-untyped-def]
        if os.getpid() == owner_pid:
            for session in _owned_sessions():
                session.failed = True
                session.interrupted = issubclass(exc_type, KeyboardInterrupt)
                if not session.closed:
                    try:  # the held step records go to disk now: a crash during the teardown keeps them
                        session.flush(wait_gpu=False)
                    except Exception:  # noqa: BLE001 - the traceback matters more
                        pass
        if issubclass(exc_type, Refused):  # an SDK refusal is its one line, not a traceback (sdk/errors.py)
            print(str(exc), file=sys.stderr)
            return
        previous_hook(exc_type, exc, tb)

    sys.excepthook = _excepthook

    def _at_exit() -> None:
        if os.getpid() != owner_pid:
            return
        owned = [(session, after) for session, after, owner in list(_REGISTERED) if owner == owner_pid]
        # Every session closed before any ``after``: two sessions of one run folder (init() after finish())
        # share its summary, which must see the second one's steps and rank_end (written once: the first
        # ``after`` to find every rank ended writes it).
        for session, _after in owned:
            if not session.closed:
                if session.failed:
                    session.close("interrupted" if session.interrupted else "failed", 1)
                else:
                    session.close("exited", None)
        for session, after in owned:
            if after is not None:
                after(session)  # e.g. the summary of a run without a launcher (sdk/direct.py); it never raises

    atexit.register(_at_exit)
    if not _fork_hook_installed and hasattr(os, "register_at_fork"):
        _install_fork_hook()


_fork_hook_installed = False


def _install_fork_hook() -> None:
    global _fork_hook_installed
    _fork_hook_installed = True

    def _in_child() -> None:
        for session, _after, _owner in _REGISTERED:
            session.closed = True  # one writer per file: the fork's copy must stay silent
            session.window.closed = True  # (its held records are the parent's to write)
            session.window.lock = threading.RLock()  # another thread of the parent may have held it at the fork

    os.register_at_fork(after_in_child=_in_child)


def close_at_script_end(session: Session, code: object = None) -> bool:
    """Write ``rank_end`` as the script's body ends (``traceml run``'s bootstrap calls it); True if written.

    ``code`` is the script's ``SystemExit`` code (None or 0: it returned): ``completed``, or ``exited`` with the
    code (a text code exits 1, as Python does). At exit the SDK could only say ``exited`` without a code, and a
    process that then crashes while shutting down (gloo aborting at interpreter exit) would leave no sign that its
    training had ended; written here, before the interpreter tears anything down, the record says so
    (core/state.py ``crashed_in_teardown``, docs/run.md "Failure forensics"). Left to the exit handler when the
    session is closed or not this process's, after an uncaught exception, or while another non-daemon thread
    runs (it may still be training: Python waits for it before exit).
    """
    if session.closed or session.failed:
        return False
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return False
    if code is None or code == 0:
        session.close("completed", None)
    else:
        session.close("exited", code if isinstance(code, int) and not isinstance(code, bool) else 1)
    return True


#: ``rank_end`` status of a rank ended by SIGTERM (its launcher, torchrun tearing the ranks down, a scheduler).
TERMINATED = "terminated"


def _end_on_sigterm() -> None:
    """On SIGTERM, write ``rank_end`` ``terminated`` (exit code 143), then die of SIGTERM as before.

    SIGTERM's default action skips ``atexit``, so a rank torchrun stops (a
    peer failed, or the launcher died and torchrun got its parent-death signal)
    would leave no end record and read as the rank that failed first
    (docs/contracts.md, rank state rule). Installed only when SIGTERM has its
    default action and only from the main thread (a session started later from
    the main thread installs it then); a handler the script installs later
    replaces it. The handler ends every open session of this process (the one
    ``init()`` started after a ``finish()`` too). GPU steps still in flight are
    not waited for: a hung collective must not keep a terminated process alive.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGTERM)
        if current is _terminated or current is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, _terminated)
    except (ValueError, OSError):  # not the main thread of the main interpreter
        return


def _terminated(signum: int, _frame: Any) -> None:
    """The SIGTERM handler :func:`_end_on_sigterm` installs."""
    for session in _owned_sessions():
        if session.closed:
            continue
        try:  # an exception already on its way out (then SIGTERM at shutdown) keeps the rank failed
            if session.failed and not session.interrupted:
                session.close("failed", 1, wait_gpu=False)
            else:
                session.close(TERMINATED, 128 + signum, wait_gpu=False)
        except Exception:  # noqa: BLE001 - dying as asked matters more than the record
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)

