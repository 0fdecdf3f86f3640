"""The validated options of `traceml run` and its refusal type.

Shared by the command line (:mod:`traceml_tui.run.cli`) and the launcher
(:mod:`traceml_tui.run.launch`), which otherwise do not import each other's
internals: the launcher never imports the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from traceml_tui.core.lease import DEFAULT_LEASE_S


class LaunchError(Exception):
    """A refusal before launch; ``str()`` is the one line shown to the user."""


@dataclass(frozen=True)
class LaunchOptions:
    """Validated command line of `traceml run`."""

    script: Path
    script_args: tuple[str, ...]
    run_name: str
    logs_dir: Path
    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: Optional[int]
    trace_max_steps: Optional[int]
    finalize_timeout: float
    resume: bool = False
    # The name is <script>-<timestamp>, not the user's: a clash picks the next free one instead of refusing.
    default_name: bool = False
    # Ranks start through traceml_tui.integrations.bootstrap, which attaches trainer callbacks (docs/trainers.md).
    auto_attach: bool = True
    # Seconds of the launcher lease (core/lease.py; TRACEML_LAUNCHER_LEASE_S): beats every lease_s / 6.
    lease_s: float = DEFAULT_LEASE_S

    @property
    def run_dir(self) -> Path:
        return self.logs_dir / self.run_name

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node
