"""What a training script imports (``import traceml_tui as traceml``).

* :func:`init` — optional under ``traceml run``; elsewhere records go to ``./logs/<run-name>``.
* :func:`trace_step` — ``with traceml.trace_step(model): …`` around one optimizer step.
* :func:`wrap_loader`, :func:`trace_loader` — time the loader that feeds the loop (data wait,
  ``sdk/loader.py``); a plain ``torch.utils.data.DataLoader`` is timed without either.
* :func:`log` — loss, lr, grad norm, examples and scale-free loss components of the current step.
* :func:`log_eval`, :func:`publish_checkpoint`, :func:`finish`, :func:`current_run`.
* :func:`report_unmeasured` — name a stream this rank cannot measure, and why (fail-open).
* :func:`declare_input` — an input's relative name and digest in the run's provenance bundle.
* :func:`log_batch_grid`, :func:`log_gallery`, :func:`log_field_stats` — input batch grid, exemplar
  galleries and latent field QC (``sdk/qc.py``).
* :func:`save_recovery`, :func:`restore_recovery` — rolling recovery saves a resume continues from
  (``sdk/recovery.py``); :func:`record_split` — a split's membership in provenance (``sdk/split.py``).

torch is never imported here; phase hooks import it only when a model is passed.
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from time import perf_counter
from typing import Any, Optional

from traceml_tui.core import records
from traceml_tui.sdk import direct, env
from traceml_tui.sdk import watchdog as _watchdog
from traceml_tui.sdk.qc import log_batch_grid, log_field_stats, log_gallery  # noqa: F401 - re-exported
from traceml_tui.sdk.session import Session, _mean_square, detect_rank, register_exit, resolve_run

_session: Optional[Session] = None

from traceml_tui.sdk import loader as _loader  # noqa: E402 - it reads _session through this module
from traceml_tui.sdk.loader import trace_loader, wrap_loader  # noqa: E402,F401 - re-exported


def _current_state() -> Any:
    session = _session
    return session.current if session is not None else None


def init(
    run_name: Optional[str] = None,
    *,
    logs_dir: Optional[str] = None,
    start_step: Optional[int] = None,
    time_dataloader: Optional[bool] = None,
) -> Session:
    """Start recording for this rank and return the session (idempotent).

    Under ``traceml run`` the run directory comes from the launcher. A process
    that finds earlier attempt files for its rank starts a new attempt
    (``steps-<n>.jsonl``) that continues at the next step; pass ``start_step``
    when resuming from an older checkpoint (it may repeat steps, which the newer
    attempt supersedes, but may not leave a gap). ``time_dataloader=False`` (or
    ``TRACEML_TIME_DATALOADER=0``) leaves plain DataLoaders untimed.

    Outside the launcher ``run_name`` must be a plain name (``ValueError``
    otherwise; the rule of ``traceml run --run-name``). A rank that torchrun
    started under ``traceml run`` gets SIGTERM if torchrun dies (Linux).
    """
    global _session
    if _session is not None and not _session.closed:
        return _session
    run_dir, name = resolve_run(run_name, logs_dir)
    if os.environ.get(env.RUN_DIR) and os.environ.get("TORCHELASTIC_RUN_ID"):
        # A rank torchrun started under `traceml run`: torchrun stops its ranks when it gets a
        # signal, but not when it is SIGKILLed; then the kernel's parent-death signal does.
        from traceml_tui.core.lifeline import set_parent_death_signal

        set_parent_death_signal()
    rank, world = detect_rank()
    max_steps_env = os.environ.get(env.TRACE_MAX_STEPS)
    max_steps = int(max_steps_env) if max_steps_env and max_steps_env.isdigit() else None
    _session = Session(run_dir, name, rank=rank, world_size=world, start_step=start_step, max_steps=max_steps)
    register_exit(_session, after=direct.write_summary_at_exit)
    hang = _watchdog.enabled()
    if hang or _session.window.window_s > 0:
        # a thread that sleeps until a step overruns (sdk/watchdog.py) and writes the step records the write
        # window holds once the rank stops stepping (sdk/window.py): nothing per step
        _session.watchdog = _watchdog.Watchdog(_session, hang=hang).start()
    if not _loader.enabled(time_dataloader):
        _loader.decline_dataloader()
    return _session


def current_run() -> Optional[Session]:
    """The active session, or None before :func:`init`."""
    return _session


class trace_step:  # noqa: N801 - used as a context manager, reads like a function
    """Time one optimizer step: ``with traceml.trace_step(model): …``.

    Measures the input wait since the previous step ended (and the part of it
    spent in an instrumented loader, ``sdk/loader.py``), the step envelope
    and, when ``model`` is given, forward/backward/optimizer phases. A step
    whose body raises is not recorded as completed.

    A ``trace_step`` opened inside a step already traced (an outer
    ``trace_step``, or the update a trainer integration traces: ``traceml run``
    attaches one to Hugging Face and Lightning) is ignored, with one line on
    stderr: the run is traced once (docs/trainers.md). Recorded, each update
    became two steps, one of them a phantom of a fraction of a millisecond.
    """

    __slots__ = ("_model", "_state", "_session")

    def __init__(self, model: Any = None) -> None:
        self._model = model

    def __enter__(self) -> "trace_step":
        if _not_steps:  # inside a trainer's validation (a validation_step calling training_step): no step
            self._state = None
            _say_nested_once()
            return self
        session = _session if _session is not None else init()
        self._session = session
        if session.current is not None:
            self._state = None  # nested: the step already open is the one recorded
            _say_nested_once()
            return self
        if not _loader.dataloader_done:
            _loader.install_dataloader()
        model = self._model
        if model is not None and (session.hooked_model is None or session.hooked_model() is not model):
            from traceml_tui.sdk import phases

            if phases.attach(model, _current_state):
                session.enable_cuda()
            # The common case (same model every step) skips attach. A weak reference: keeping a
            # DDP model alive until interpreter shutdown makes its reducer abort at teardown.
            session.hooked_model = weakref.ref(model)
        self._state = session.begin(perf_counter())
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self._state is not None:
            self._session.end(self._state, perf_counter(), exc_type is None)
        return False


_said_nested = False
#: How deep the process is in a trainer's work that is no training step (its validation loop: a trainer
#: integration says so with :func:`not_steps_begin` / :func:`not_steps_end`); ``trace_step`` records nothing there.
_not_steps = 0


def not_steps_begin() -> None:
    """A trainer's work that is no training step begins (its validation): ``trace_step`` is ignored until
    :func:`not_steps_end`. A Lightning ``validation_step`` that calls a ``training_step`` wrapped in ``trace_step``
    recorded a phantom step per validation batch."""
    global _not_steps
    _not_steps += 1


def not_steps_end() -> None:
    """The work :func:`not_steps_begin` began has ended."""
    global _not_steps
    _not_steps = max(0, _not_steps - 1)


def _say_nested_once() -> None:
    global _said_nested
    if not _said_nested:
        _said_nested = True
        print("traceml: trace_step inside a step already traced (an outer trace_step, or the update a trainer "
              "integration traces) or inside a trainer's validation is ignored: the run is traced once",
              file=sys.stderr, flush=True)


def _global_grad_norm(session: Any) -> Any:
    """The global gradient norm of the traced model for ``log(grad_norm="auto")`` (None: no gradient yet)."""
    model = session.hooked_model() if session.hooked_model is not None else None
    if model is None:
        raise ValueError("grad_norm='auto' needs the model: wrap the step in traceml.trace_step(model)")
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return None  # nothing to measure: not recorded, never a fabricated 0
    import torch

    total_norm = getattr(torch.nn.utils, "get_total_norm", None)
    if total_norm is not None:
        return total_norm(grads, norm_type=2.0).detach()
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach()) for g in grads]))


def log(
    *,
    loss: Any = None,
    lr: Any = None,
    grad_norm: Any = None,
    examples: Optional[int] = None,
    batch_size: Optional[int] = None,
    components: Optional[dict[str, Any]] = None,
    metrics: Optional[dict[str, Any]] = None,
) -> None:
    """Attach values to the current step's record (or the next step's, outside one).

    ``grad_norm="auto"`` computes the global L2 norm of the traced model's
    gradients (the model given to ``trace_step(model)``) once, with torch's
    fused total-norm (per-tensor norms in one foreach kernel, then one
    ``torch.linalg.vector_norm``), as a tensor: no device sync until the record
    is written. Call it after ``backward()`` and before the next ``zero_grad``.

    ``examples`` is the cumulative count of training examples seen; or pass
    ``batch_size`` and the SDK accumulates it. ``components`` maps a loss
    component name to ``(value, target[, weight])``: a tensor ``target`` is the
    component's own target and its mean square is computed lazily (no extra
    device sync); a number is taken as the target's mean square already.
    Tensors are converted to floats only when the record is written.
    """
    session = _session if _session is not None else init()
    values = session.current.values if session.current is not None else session.carry
    if loss is not None:
        # A tensor that needs no grad (a trainer's detached copy) is kept as is: no extra op per step.
        values["loss"] = loss.detach() if getattr(loss, "requires_grad", False) else loss
    if lr is not None:
        values["lr"] = lr
    if grad_norm is not None:
        if isinstance(grad_norm, str) and grad_norm != "auto":
            raise ValueError(f"grad_norm must be a number, a tensor or 'auto', not {grad_norm[:20]!r}")
        values["grad_norm"] = _global_grad_norm(session) if isinstance(grad_norm, str) else grad_norm
    if examples is not None:
        if int(examples) < 0:
            raise ValueError(f"examples must be a count of examples seen (>= 0), not {examples!r}")
        values["examples"] = int(examples)
    if batch_size is not None:
        if int(batch_size) < 0:
            raise ValueError(f"batch_size must be >= 0, not {batch_size!r}")
        values["batch_size"] = int(batch_size)
    if components:
        prepared = {}
        for name, spec in components.items():
            if isinstance(spec, (tuple, list)) and len(spec) >= 2:
                value = spec[0].detach() if hasattr(spec[0], "detach") else spec[0]
                prepared[name] = (value, _mean_square(spec[1]), *spec[2:])
            else:
                prepared[name] = spec
        values["components"] = prepared
    if metrics:
        values["metrics"] = dict(metrics)


def log_eval(
    metrics: dict[str, Any],
    *,
    checkpoint: Optional[str] = None,
    split: str = "val",
    role: str = "eval",
    step: Optional[int] = None,
    status: str = "completed",
) -> None:
    """Record an evaluation observation (``status``: completed, pending or failed)."""
    if status not in ("completed", "pending", "failed"):
        raise ValueError(f"status must be completed, pending or failed, not {status!r}")
    session = _session if _session is not None else init()
    session.write(
        records.Eval(
            v=records.RECORD_VERSION,
            run=session.run_name,
            rank=session.rank,
            attempt=session.attempt,
            step=session.last_step if step is None else int(step),
            ts=time.time(),
            role=role,
            checkpoint=checkpoint,
            split=split,
            metrics={str(k): records.finite_or_none(getattr(v, "item", lambda v=v: v)()) for k, v in metrics.items()},
            status=status,
        )
    )


def publish_checkpoint(path_or_state: Any, *, step: Optional[int] = None) -> str:
    """Publish an immutable checkpoint and a durable validation request (rank 0 writes).

    ``path_or_state`` is a checkpoint file or folder already written (a
    relative path is read from the current folder; it is copied into the run's
    ``checkpoints/``, a folder such as Hugging Face's ``checkpoint-N/`` as a
    folder with read-only files, docs/hygiene.md) or a state object saved with
    ``torch.save``. Returns the checkpoint id on every rank.
    """
    from traceml_tui.hygiene import checkpoints

    session = _session if _session is not None else init()
    step = session.last_step if step is None else int(step)
    checkpoint_id = checkpoints.checkpoint_id(step)
    if session.rank == 0:
        _refuse_stale_publish(session.run_dir, step)
        request = checkpoints.publish_request(
            session.run_dir,
            path_or_state,
            step=step,
            config_digest=os.environ.get(env.VALIDATION_DIGEST, ""),
        )
        checkpoint_id = request["checkpoint"]
        session.write(
            records.Checkpoint(
                v=records.RECORD_VERSION,
                run=session.run_name,
                rank=session.rank,
                attempt=session.attempt,
                step=step,
                ts=time.time(),
                id=checkpoint_id,
                path=request["path"],
            )
        )
    return checkpoint_id


def _refuse_stale_publish(run_dir: Any, step: int) -> None:
    """A scientific checkpoint is published once per update, in order: one behind or at the last is refused.

    docs/hygiene.md, "Publishing checkpoints": a resumed script that re-reaches an
    update already published (or never restored its step) must not label another
    state with it.
    """
    from traceml_tui.hygiene import checkpoints
    from traceml_tui.sdk.errors import Refused

    last = checkpoints.last_published_step(run_dir)
    if last is not None and step <= last:
        raise Refused(f"publish_checkpoint: update {step} is not ahead of the run's last published checkpoint "
                      f"(update {last}); a checkpoint is published once per update, in order")


def record_split(name: str, members: Any, *, policy: str) -> dict:
    """Record a data split in the run's provenance on the first run; check it on every later call.

    ``members`` are the split's member ids (indices, file names...), in any
    order; ``policy`` says in words how the split is made. The first call writes
    ``provenance/splits/<name>.json`` (name, policy, count, digest and ids; rank
    0 writes); a resumed attempt's call recomputes the membership and raises
    :class:`traceml_tui.sdk.split.SplitChanged` (one line, nothing written) when
    it differs, so call it before training starts. Returns the record.
    """
    from traceml_tui.sdk import split

    session = _session if _session is not None else init()
    return split.record(session.run_dir, name, members, policy=policy, write=session.rank == 0)


def report_unmeasured(stream: str, reason: str) -> None:
    """Record that this rank does not measure ``stream``, and why; never raises.

    For integrations that attach themselves and cannot measure everything: a
    part of the step (``input_wait``, ``forward``, ``backward``, ``optimizer``),
    a value (``loss``, ``lr``, ``grad_norm``, ``examples``), ``eval``,
    ``checkpoints``, or ``all`` when nothing could be attached. Writes one
    ``unmeasured`` record per stream per rank session (a repeat is ignored) and,
    on rank 0, prints the one line every surface uses
    (:func:`traceml_tui.core.coverage.unmeasured_line`) on stderr. Works before
    :func:`init` (it starts the session like :func:`log`); after
    :func:`finish` it does nothing. Both strings are cut to the record's bounds.
    """
    try:
        from traceml_tui.core import coverage

        session = _session if _session is not None else init()
        name = coverage.clip_stream(stream)
        if session.closed or not name or name in session.unmeasured:
            return
        text = coverage.clip_reason(reason)
        session.write(
            records.Unmeasured(
                v=records.RECORD_VERSION,
                run=session.run_name,
                rank=session.rank,
                attempt=session.attempt,
                ts=time.time(),
                stream=name,
                reason=text,
            )
        )
        session.unmeasured.add(name)
        if session.rank == 0:
            print(f"traceml: {coverage.unmeasured_line(name, text)}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - fail-open: a report about missing data must never stop training
        return


def declare_input(path: "str | os.PathLike[str]") -> dict:
    """Record the identity of an input of this run (a data file or folder) and return it.

    Appends one line to the run's ``provenance/declared_inputs.jsonl``: the
    input's path relative to the repository holding the current folder (else
    relative to the current folder; an input outside both is named by its file
    name alone), its SHA-256 (a folder's: over its regular files), size, and
    this rank and attempt. The same rank declaring the same unchanged input
    again (a resumed attempt) appends nothing. The whole input is read once:
    declare a dataset's manifest or archive rather than millions of files.
    """
    from traceml_tui.core import inputs
    from traceml_tui.core.rundir import RunDir

    session = _session if _session is not None else init()
    entry = inputs.identity(path, inputs.identity_base(os.getcwd()))
    entry.update(rank=session.rank, attempt=session.attempt, ts=time.time())
    inputs.declare(RunDir(session.run_dir).declared_inputs, entry)
    return entry


def save_recovery(
    *,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    extras: Optional[dict] = None,
    every: Optional[int] = None,
    keep: Optional[int] = None,
    force: bool = False,
) -> Optional[str]:
    """Write a recovery save after the current update when the recovery cadence says so.

    Call it after every update, outside ``trace_step``: it saves only when the
    update is a multiple of ``hygiene.recovery.every`` (or ``every=`` when the
    run declares no such block; ``force=True`` saves now). A save holds the
    model, optimizer and scheduler states, the session's step, attempt and
    examples, the Python/NumPy/torch CPU (and CUDA) RNG states and ``extras``
    (e.g. a loader generator's state and the position in the epoch). It is
    written atomically; only the newest ``keep`` saves of this rank stay, and
    an older one is removed only when nothing refers to it. A recovery save
    never publishes a checkpoint or a validation request. Returns the save's
    path relative to the run directory, or None when the cadence skipped it.
    """
    from traceml_tui.sdk import recovery

    session = _session if _session is not None else init()
    return recovery.save(session, model=model, optimizer=optimizer, scheduler=scheduler, extras=extras,
                         every=every, keep=keep, force=force)


def restore_recovery(*, model: Any = None, optimizer: Any = None, scheduler: Any = None) -> Any:
    """Restore the newest complete recovery save of this rank; None when there is none (a fresh run).

    Call it once the model, optimizer and scheduler exist and before the first
    ``trace_step``. It loads their states, the RNG states and the session's
    counters: this attempt's records continue at the save's update + 1 (they
    supersede the repeated updates of the interrupted attempt). Returns a
    :class:`traceml_tui.sdk.recovery.Recovered` (``step``, ``extras``, ``path``).
    """
    from traceml_tui.sdk import recovery

    session = _session if _session is not None else init()
    return recovery.restore(session, model=model, optimizer=optimizer, scheduler=scheduler)


def finish(status: str = "completed", exit_code: Optional[int] = None) -> None:
    """Write every step record (waiting for pending GPU timings), then this rank's ``rank_end`` record."""
    if _session is not None and not _session.closed:
        _session.close(status, exit_code)
