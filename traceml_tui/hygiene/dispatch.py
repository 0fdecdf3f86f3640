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

import json
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from traceml_tui.hygiene import backlog


def load_effective_hygiene(run_dir: Path) -> Optional[dict]:
    """The effective ``hygiene`` config recorded by ``traceml run`` in ``manifest.json`` (None if absent)."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    hygiene = manifest.get("hygiene") if isinstance(manifest, dict) else None
    return hygiene if isinstance(hygiene, dict) else None


def has_unreceipted(run_dir: Path, max_attempts: int) -> bool:
    for request in backlog.list_requests(run_dir):
        ckpt = request["checkpoint"]
        if not backlog.receipt_path(run_dir, ckpt).exists() and backlog.failure_count(run_dir, ckpt) < max_attempts:
            return True
    return False


class Dispatcher:
    """Starts drainers for ``run_dir`` running ``worker`` (argv with ``{checkpoint}``) as work appears."""

    def __init__(
        self,
        run_dir: Path,
        worker: Sequence[str],
        *,
        lease_s: float = 60.0,
        max_attempts: int = 3,
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
        self.log_path = log_path or self.run_dir / "validation" / "drainer.log"
        self.proc: Optional[subprocess.Popen] = None

    @classmethod
    def from_config(cls, run_dir: Path, hygiene_cfg: dict, **kwargs) -> "Dispatcher":
        validation = hygiene_cfg["validation"]
        return cls(run_dir, validation["worker"], lease_s=validation.get("lease_s", 60.0),
                   max_attempts=validation.get("max_attempts", 3), **kwargs)

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
