"""A validation worker is a backlog drainer, not a one-checkpoint job (seed 004).

On start it discovers every pending request (including those left by
interrupted workers), claims one atomically, runs the worker command on it
(in its own process group, with a parent-death signal: core/lifeline.py),
records a receipt or a failure, then rescans from the start so work is taken in
checkpoint order as new requests arrive. It exits when no claimable work
remains or when its runtime limit nears.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from traceml_tui.core import lifeline, state
from traceml_tui.core.jsonsafe import NestingError, loads_bounded
from traceml_tui.core.rundir import VALIDATION
from traceml_tui.core.signals import shielded
from traceml_tui.hygiene import backlog
from traceml_tui.hygiene.checkpoints import resolve_checkpoint_path


@dataclass
class DrainResult:
    completed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    reason: str = "no_work"  # no_work | runtime_limit


class DigestMismatch(Exception):
    """A request bound to another validation config than the one this drainer runs (nothing was claimed)."""

    def __init__(self, checkpoint: str, requested: str, actual: str) -> None:
        self.checkpoint, self.requested, self.actual = checkpoint, requested, actual
        super().__init__(
            f"{checkpoint} was requested for validation config {requested}, but this worker's recipe and command "
            f"have {actual}; refused (--recipe-override runs it and records the override in its receipt)"
        )


def substitute(argv: list[str], *, checkpoint: Path, step: object, run_dir: Path) -> list[str]:
    """Fill ``{checkpoint}``, ``{step}`` and ``{run_dir}`` in each argument (plain text replace)."""
    values = {"{checkpoint}": str(checkpoint), "{step}": str(step), "{run_dir}": str(run_dir)}
    out = []
    for arg in argv:
        for key, value in values.items():
            arg = arg.replace(key, value)
        out.append(arg)
    return out


def parse_metrics(stdout: str) -> dict[str, Optional[float]]:
    """Metrics from the LAST nonempty stdout line, which must be a JSON object of numbers.

    Raises ``ValueError`` with a one-line reason otherwise. Non-finite numbers
    become ``None`` (never a fabricated value).
    """
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("worker printed nothing; its last stdout line must be a JSON object of metrics")
    try:
        value = loads_bounded(lines[-1])
    except NestingError:
        raise ValueError("last stdout line is JSON nested too deeply; it must be a flat JSON object of metrics") from None
    except ValueError:
        raise ValueError("last stdout line is not JSON; it must be a JSON object of metrics") from None
    if not isinstance(value, dict) or not value:
        raise ValueError("last stdout line must be a nonempty JSON object of metrics")
    metrics: dict[str, Optional[float]] = {}
    for key, item in value.items():
        if item is None:
            metrics[key] = None
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            metrics[key] = float(item) if math.isfinite(item) else None
        else:
            raise ValueError(f"metric {key!r} is not a number")
    return metrics


class _Heartbeat(threading.Thread):
    """Rewrites our claim every lease/3 seconds so other hosts see we are alive."""

    def __init__(self, run_dir: Path, claim: dict, interval: float, kind: str = VALIDATION) -> None:
        super().__init__(daemon=True, name="traceml-claim-heartbeat")
        self.run_dir, self.claim, self.interval, self.kind = run_dir, claim, interval, kind
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            try:
                if not backlog.heartbeat(self.run_dir, self.claim, self.kind):
                    return
            except OSError:
                pass  # a transient filesystem error must not kill the worker

    def stop(self) -> None:
        self.stop_event.set()
        self.join()


def _kill_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _run_worker(
    argv: list[str], timeout: Optional[float], on_start: Optional[Callable[[subprocess.Popen], None]] = None
) -> tuple[Optional[int], str, str]:
    """Run the command; returns (exit code or None on timeout, stdout, stderr tail).

    The worker leads its own process group (so it and its children can be
    stopped together) and gets SIGTERM if this drainer dies, even by SIGKILL
    (``core/lifeline.py``). ``on_start`` sees the process once it runs.
    """
    try:
        proc = subprocess.Popen(lifeline.wrap(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    except OSError as exc:
        return 127, "", f"cannot start worker: {exc.strerror or exc}"
    try:
        if on_start is not None:
            on_start(proc)
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err
    except BaseException:  # e.g. Ctrl-C: the worker's group does not see the terminal's signal
        _kill_group(proc, signal.SIGTERM)
        raise
    return proc.returncode, out, err


def _error_line(code: int, stderr: str, reason: str = "") -> str:
    tail = [line.strip() for line in stderr.splitlines() if line.strip()]
    detail = reason or (tail[-1] if tail else "")
    return f"exit code {code}" + (f": {detail}" if detail else "")


def drain(
    run_dir: Path,
    command: list[str],
    *,
    max_runtime: Optional[float] = None,
    lease_s: float = state.DEFAULT_LEASE_S,
    max_attempts: int = state.DEFAULT_MAX_ATTEMPTS,
    retry_backoff_s: float = state.DEFAULT_RETRY_BACKOFF_S,
    worker_timeout_s: float = state.DEFAULT_WORKER_TIMEOUT_S,
    on_receipt: Optional[Callable[[dict], None]] = None,
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr),
    config_digest: Optional[str] = None,
    override: bool = False,
    kind: str = VALIDATION,
) -> DrainResult:
    """Drain ``run_dir``'s validation backlog with ``command`` until no claimable work is left.

    ``kind="qc"`` drains the QC backlog (``qc/requests`` …, docs/qc.md) by the same rules: one
    implementation, two kinds.

    A request with ``max_attempts`` failures is blocked (reported, not retried
    automatically); one this worker already failed is not retried in the same
    session, and a failed one is taken only once its retry backoff has passed
    (``retry_backoff_s``, doubling per failure: :func:`traceml_tui.core.state.retry_ready_at`).
    A request backing off is not ready work: other ready requests are taken
    meanwhile, and the next drainer (the dispatcher starts one once the backoff
    has passed) retries it. ``on_receipt`` runs after each receipt (e.g. to refresh the curve).

    A worker still running after ``worker_timeout_s`` (or when the runtime
    limit cuts it off) has its process group killed, and that counts as a
    failed attempt: a worker that never returns cannot hold the backlog
    (docs/hygiene.md). After a runtime-limit cut the drainer stops.

    Each worker runs in its own process group with a parent-death signal, and
    the claim records that group: a drainer recovering the claim after this
    one died stops whatever is left of the worker first. Recovery lock files
    nobody holds are removed on the way in and out.

    ``config_digest`` is the digest of what this drainer runs (the recipe and
    the command with its placeholders, :func:`traceml_tui.hygiene.config.validation_config_digest`).
    A request bound to another digest raises :class:`DigestMismatch` before
    it is claimed; with ``override`` it is run and its receipt records
    ``override: {config_digest}`` (the digest actually run).
    """
    run_dir = Path(run_dir)
    backlog.clean_locks(run_dir, kind)
    started = time.monotonic()
    owner = backlog.current_owner()
    result = DrainResult()
    tried: set[str] = set()
    slowest = 0.0

    def remaining() -> Optional[float]:
        return None if max_runtime is None else max_runtime - (time.monotonic() - started)

    while True:
        left = remaining()
        # Stop before starting work that would likely be cut off by the allocation limit.
        if left is not None and left <= max(1.0, slowest):
            result.reason = "runtime_limit"
            return result
        took = None
        for request in backlog.open_requests(run_dir, kind, skip=tried):
            ckpt = request["checkpoint"]
            if ckpt in tried or not backlog.claimable(run_dir, ckpt, max_attempts=max_attempts,
                                                      backoff_s=retry_backoff_s, kind=kind):
                continue
            requested = request.get("config_digest")
            if config_digest is not None and requested and requested != config_digest and not override:
                raise DigestMismatch(ckpt, requested, config_digest)
            claim = backlog.try_claim(run_dir, ckpt, owner, lease_s, kind)
            if claim is None:
                continue
            # Someone may have finished (or failed) it between our scan and our claim.
            if not backlog.claimable(run_dir, ckpt, max_attempts=max_attempts, backoff_s=retry_backoff_s, kind=kind):
                backlog.release_claim(run_dir, claim, kind)
                continue
            took = (request, claim)
            break
        if took is None:
            backlog.clean_locks(run_dir, kind)
            result.reason = "no_work"
            return result
        request, claim = took
        ckpt = request["checkpoint"]
        tried.add(ckpt)
        beat = _Heartbeat(run_dir, claim, max(0.2, lease_s / 3.0), kind)

        def record_worker(proc: subprocess.Popen, claim: dict = claim, beat: _Heartbeat = beat) -> None:
            # The claim names the worker's process group before the heartbeat starts rewriting it,
            # so whoever recovers this claim after we die can make sure the worker is gone.
            claim["worker"] = backlog.worker_identity(proc.pid)
            try:
                backlog.heartbeat(run_dir, claim, kind)
            except OSError:
                pass  # the heartbeat thread writes it again
            with shielded():  # (core/signals.py: a signal sent to the drainer goes to the main thread)
                beat.start()

        t0 = time.monotonic()
        try:
            argv = substitute(
                command,
                checkpoint=resolve_checkpoint_path(run_dir, request),
                step=request.get("step"),
                run_dir=run_dir.resolve(),
            )
            left = remaining()
            by_limit = left is not None and left < worker_timeout_s
            code, out, err = _run_worker(argv, max(0.1, left) if by_limit else worker_timeout_s, record_worker)
            if code is None:
                # Its process group is killed. Either way it is a failed attempt (docs/hygiene.md):
                # a request that never finishes must become failed, then blocked, so later ones
                # proceed, instead of being taken first by every drainer forever.
                took_s = time.monotonic() - t0
                if by_limit:
                    error = f"cut off by the drainer's runtime limit after {took_s:.0f} s"
                    result.interrupted.append(ckpt)
                else:
                    error = f"timed out after {worker_timeout_s:g} s (hygiene.validation.timeout_s)"
                    result.failed.append(ckpt)
                backlog.write_failure(run_dir, ckpt, error, kind)
                log(f"traceml validate: {ckpt}: failed ({error})")
            elif code != 0:
                backlog.write_failure(run_dir, ckpt, _error_line(code, err), kind)
                result.failed.append(ckpt)
                log(f"traceml validate: {ckpt}: failed ({_error_line(code, err)})")
            else:
                try:
                    metrics = parse_metrics(out)
                except ValueError as exc:
                    backlog.write_failure(run_dir, ckpt, _error_line(code, err, str(exc)), kind)
                    result.failed.append(ckpt)
                    log(f"traceml validate: {ckpt}: failed ({exc})")
                else:
                    try:
                        requested = request.get("config_digest")
                        overridden = config_digest is not None and bool(requested) and requested != config_digest
                        receipt = backlog.write_receipt(
                            run_dir, request, metrics,
                            override={"config_digest": config_digest} if overridden else None, kind=kind)
                    except FileExistsError:
                        receipt = None  # completed elsewhere meanwhile; keep the first result
                    if receipt is not None:
                        result.completed.append(ckpt)
                        log(f"traceml validate: {ckpt}: completed {json.dumps(metrics, sort_keys=True)}")
                        if on_receipt is not None:
                            on_receipt(receipt)
        finally:
            if beat.is_alive():
                beat.stop()
            backlog.release_claim(run_dir, claim, kind)
        slowest = max(slowest, time.monotonic() - t0)
        if result.interrupted:
            result.reason = "runtime_limit"
            return result
