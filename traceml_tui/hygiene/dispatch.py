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
from pathlib import Path
from typing import Optional, Sequence

from traceml_tui.core import artifacts
from traceml_tui.core.rundir import RunDir
from traceml_tui.core.state import DEFAULT_MAX_ATTEMPTS
from traceml_tui.hygiene import backlog


def load_effective_hygiene(run_dir: Path) -> Optional[dict]:
    """The effective ``hygiene`` config recorded by ``traceml run`` in ``manifest.json`` (None if absent)."""
    try:
        manifest = artifacts.decode_manifest(RunDir(run_dir).manifest.read_bytes())
    except OSError:
        return None
    if manifest is None or not isinstance(manifest.hygiene, dict):
        return None
    return manifest.hygiene


def has_unreceipted(run_dir: Path, max_attempts: int) -> bool:
    """Whether a request waits that a drainer may take (no receipt, not blocked)."""
    return any(backlog.claimable(run_dir, request["checkpoint"], max_attempts=max_attempts)
               for request in backlog.list_requests(run_dir))


class Dispatcher:
    """Starts drainers for ``run_dir`` running ``worker`` (argv with ``{checkpoint}``) as work appears."""

    def __init__(
        self,
        run_dir: Path,
        worker: Sequence[str],
        *,
        lease_s: float = 60.0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_runtime: Optional[float] = None,
        cwd: Optional[Path] = None,
        log_path: Optional[Path] = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.worker = list(worker)
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.max_runtime = max_runtime
        self.cwd = cwd
        self.log_path = log_path or RunDir(self.run_dir).drainer_log
        self.proc: Optional[subprocess.Popen] = None

    @classmethod
    def from_config(cls, run_dir: Path, hygiene_cfg: dict, **kwargs) -> "Dispatcher":
        validation = hygiene_cfg["validation"]
        return cls(run_dir, validation["worker"], lease_s=validation.get("lease_s", 60.0),
                   max_attempts=validation.get("max_attempts", DEFAULT_MAX_ATTEMPTS), **kwargs)

    def _command(self) -> list[str]:
        cmd = [sys.executable, "-m", "traceml_tui", "validate", "drain", str(self.run_dir),
               "--lease", str(self.lease_s), "--max-attempts", str(self.max_attempts)]
        if self.max_runtime is not None:
            cmd += ["--max-runtime", str(self.max_runtime)]
        return cmd + ["--", *self.worker]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def poke(self) -> bool:
        """Start a drainer if work is waiting and ours is not running; returns whether one started."""
        if self.running or not has_unreceipted(self.run_dir, self.max_attempts):
            return False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self._command(), cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        return True

    def drain_final(self, timeout: Optional[float] = None) -> int:
        """Wait for the running drainer, then drain whatever is left; returns the last exit code."""
        if self.proc is not None:
            self.proc.wait(timeout=timeout)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            done = subprocess.run(self._command(), cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                  timeout=timeout, check=False)
        return done.returncode
