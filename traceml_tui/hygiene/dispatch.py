"""Automatic dispatch of validation drainers (seed 004: "a timer or equivalent
automatic dispatcher restarts draining when new work arrives … and drains the
final backlog after training stops").

:class:`Dispatcher` keeps at most one ``traceml validate drain`` process of its
own running for a run directory: :meth:`poke` starts one when unreceipted
requests exist and none is running; :meth:`drain_final` waits for it and runs
a last drain so nothing published before the stop is left behind. Drainers
coordinate through claims, so several dispatchers (or manual drainers) on other
nodes are safe.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from traceml_tui.core import artifacts
from traceml_tui.core.rundir import VALIDATION, RunDir
from traceml_tui.core.signals import unshielded
from traceml_tui.core.state import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BACKOFF_S,
    DEFAULT_WORKER_TIMEOUT_S,
)
from traceml_tui.hygiene import backlog


def load_effective_hygiene(run_dir: Path) -> Optional[dict]:
    """The effective ``hygiene`` config recorded by ``traceml run`` in ``manifest.json`` (None if absent)."""
    try:
        manifest = artifacts.read_manifest(RunDir(run_dir).manifest)
    except OSError:
        return None
    if manifest is None or not isinstance(manifest.hygiene, dict):
        return None
    return manifest.hygiene


def has_unreceipted(run_dir: Path, max_attempts: int, backoff_s: float = DEFAULT_RETRY_BACKOFF_S,
                    kind: str = VALIDATION) -> bool:
    """Whether a request waits that a drainer may take now (no receipt, not blocked, not backing off)."""
    return any(backlog.claimable(run_dir, request["checkpoint"], max_attempts=max_attempts, backoff_s=backoff_s,
                                 kind=kind)
               for request in backlog.open_requests(run_dir, kind))


def next_retry_s(run_dir: Path, max_attempts: int, backoff_s: float = DEFAULT_RETRY_BACKOFF_S,
                 kind: str = VALIDATION) -> Optional[float]:
    """Seconds until the soonest unclaimed request may be taken (0: now); None: nothing left for us.

    Requests claimed by another drainer are that drainer's (its worker has its own timeout).
    """
    waits = [backlog.retry_wait(run_dir, request["checkpoint"], max_attempts=max_attempts, backoff_s=backoff_s,
                                kind=kind)
             for request in backlog.open_requests(run_dir, kind)
             if backlog.read_claim(run_dir, request["checkpoint"], kind=kind) is None]
    known = [w for w in waits if w is not None]
    return min(known) if known else None


class Dispatcher:
    """Starts drainers for ``run_dir`` running ``worker`` (argv with ``{checkpoint}``) as work appears."""

    def __init__(
        self,
        run_dir: Path,
        worker: Sequence[str],
        *,
        lease_s: float = DEFAULT_LEASE_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S,
        worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
        max_runtime: Optional[float] = None,
        cwd: Optional[Path] = None,
        log_path: Optional[Path] = None,
        kind: str = VALIDATION,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.worker = list(worker)
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.retry_backoff_s = retry_backoff_s
        self.worker_timeout_s = worker_timeout_s
        self.max_runtime = max_runtime
        self.cwd = cwd
        self.kind = kind  # validation, or qc: the QC backlog (docs/qc.md), drained by the same drainer
        self.log_path = log_path or RunDir(self.run_dir).drainer_log_of(kind)
        self.proc: Optional[subprocess.Popen] = None

    @classmethod
    def from_config(cls, run_dir: Path, hygiene_cfg: dict, **kwargs) -> "Dispatcher":
        validation = hygiene_cfg["validation"]
        return cls(run_dir, validation["worker"], lease_s=validation.get("lease_s", DEFAULT_LEASE_S),
                   max_attempts=validation.get("max_attempts", DEFAULT_MAX_ATTEMPTS),
                   retry_backoff_s=validation.get("retry_backoff_s", DEFAULT_RETRY_BACKOFF_S),
                   worker_timeout_s=validation.get("timeout_s", DEFAULT_WORKER_TIMEOUT_S), **kwargs)

    @classmethod
    def for_qc(cls, run_dir: Path, hygiene_cfg: dict, **kwargs) -> Optional["Dispatcher"]:
        """The QC backlog's dispatcher (docs/qc.md) when ``hygiene.qc`` requires worker QC, else None.

        The declared QC worker, with the retry, lease and timeout settings of ``hygiene.validation``: one set
        of backlog rules for both kinds.
        """
        from traceml_tui.hygiene.qc_backlog import KIND, declared_worker

        declared = declared_worker(hygiene_cfg.get("qc"))
        if declared is None:
            return None
        validation = hygiene_cfg.get("validation") or {}
        return cls(run_dir, declared["worker"], lease_s=validation.get("lease_s", DEFAULT_LEASE_S),
                   max_attempts=validation.get("max_attempts", DEFAULT_MAX_ATTEMPTS),
                   retry_backoff_s=validation.get("retry_backoff_s", DEFAULT_RETRY_BACKOFF_S),
                   worker_timeout_s=validation.get("timeout_s", DEFAULT_WORKER_TIMEOUT_S), kind=KIND, **kwargs)

    def _command(self) -> list[str]:
        cmd = [sys.executable, "-m", "traceml_tui", "validate", "drain", str(self.run_dir),
               "--lease", str(self.lease_s), "--max-attempts", str(self.max_attempts),
               "--retry-backoff", str(self.retry_backoff_s), "--timeout", str(self.worker_timeout_s)]
        if self.max_runtime is not None:
            cmd += ["--max-runtime", str(self.max_runtime)]
        if self.kind != VALIDATION:
            cmd += ["--kind", self.kind]
        return cmd + ["--", *self.worker]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def poke(self) -> bool:
        """Start a drainer if work is waiting and ours is not running; returns whether one started."""
        # A request backing off after a failure is not ready work: starting a drainer for it every
        # second would only burn its attempts (docs/hygiene.md "Retries").
        if self.running or not has_unreceipted(self.run_dir, self.max_attempts, self.retry_backoff_s, self.kind):
            return False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # (poked from the launcher's shielded dispatch thread: the drainer must not inherit its blocked signals)
        with open(self.log_path, "ab") as log, unshielded():
            self.proc = subprocess.Popen(self._command(), cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        return True

    def drain_final(self, timeout: Optional[float] = None) -> int:
        """Wait for the running drainer, then drain whatever is left; returns the last exit code.

        Bounded without ``timeout`` too: every worker attempt ends within its
        ``timeout_s`` (killed and counted as failed), a request gets at most
        ``max_attempts`` of them, and backoffs are capped (docs/hygiene.md).
        """
        if self.proc is not None:
            self.proc.wait(timeout=timeout)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            with open(self.log_path, "ab") as log:
                done = subprocess.run(self._command(), cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=log, timeout=timeout, check=False)
            # A request that failed and has attempts left is retried once its backoff has passed, so a
            # transient failure near the end is not left behind; a blocked one is not waited for.
            wait = next_retry_s(self.run_dir, self.max_attempts, self.retry_backoff_s, self.kind)
            if done.returncode != 0 or wait is None:
                return done.returncode
            time.sleep(wait)
