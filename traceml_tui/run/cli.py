"""`traceml run SCRIPT …`: parse and validate everything before anything starts.

Every refusal is one line on stderr and a non-zero exit, and happens before
the manifest is written or a process is spawned.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Mapping, Optional

from traceml_tui.core import lease as core_lease
from traceml_tui.core.cliargs import EXIT_USAGE, OneLineParser
from traceml_tui.core.rundir import validate_run_name
from traceml_tui.run.options import LaunchError, LaunchOptions

EXIT_REFUSED = 1

__all__ = ["EXIT_REFUSED", "EXIT_USAGE", "LaunchError", "LaunchOptions", "build_parser", "main", "parse_options",
           "split_script_args"]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="traceml run",
        description="Launch a training script under traceml (one process, DDP or multi-node).",
        epilog="Everything after --args is passed to the script unchanged.",
    )
    parser.add_argument("script", help="training script (Python file)")
    parser.add_argument("--run-name", help="fresh name of this run (default: <script>-<timestamp>)")
    parser.add_argument("--logs-dir", help="folder holding run directories (default: traceml.yaml logs_dir, else ./logs)")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="processes (ranks) on this node")
    parser.add_argument("--nnodes", type=int, help="number of nodes, one launcher per node (default 1; under srun: "
                                                   "the step's node count)")
    parser.add_argument("--node-rank", type=int, help="this node's rank, 0..nnodes-1 (default 0; under srun: SLURM_NODEID)")
    parser.add_argument("--master-addr", help="rendezvous address, multi-node (default 127.0.0.1; under srun: the "
                                              "step's first host)")
    parser.add_argument("--master-port", type=int, help="rendezvous port, multi-node (under srun: derived from the job id)")
    parser.add_argument("--trace-max-steps", type=int, help="record at most this many steps per rank")
    parser.add_argument("--finalize-timeout", type=float, help="seconds node 0 waits for node outcomes (default 60)")
    parser.add_argument("--resume", action="store_true", help="continue an existing unguarded run directory as a new attempt")
    parser.add_argument("--no-auto-attach", action="store_true",
                        help="run the script as is: no traceml callback on Hugging Face / Lightning trainers "
                             "(also TRACEML_AUTO_ATTACH=0)")
    return parser


def split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split off everything after ``--args`` (or a bare ``--``) as the script's own arguments."""
    for marker in ("--args", "--"):
        if marker in argv:
            index = argv.index(marker)
            return argv[:index], argv[index + 1 :]
    return argv, []


def _apply_slurm(ns: argparse.Namespace, environ: Mapping[str, str]) -> None:
    """Fill the topology flags left out from Slurm's step variables; refuse flags that contradict them."""
    from traceml_tui.run.slurm import SlurmError, step_of

    try:
        step = step_of(environ)
    except SlurmError as exc:
        raise LaunchError(f"Slurm: {exc}") from None
    if step is None:
        ns.nnodes = 1 if ns.nnodes is None else ns.nnodes
        ns.node_rank = 0 if ns.node_rank is None else ns.node_rank
        ns.master_addr = ns.master_addr or "127.0.0.1"
        return
    for flag, given, slurm, source in (("--nnodes", ns.nnodes, step.nnodes, "SLURM_STEP_NUM_NODES"),
                                       ("--node-rank", ns.node_rank, step.node_rank, "SLURM_NODEID")):
        if given is not None and given != slurm:
            raise LaunchError(f"{flag} {given} contradicts Slurm's {source}={slurm}; leave {flag} out under srun")
    ns.nnodes, ns.node_rank = step.nnodes, step.node_rank
    ns.master_addr = ns.master_addr or step.master_addr
    if ns.master_port is None and step.nnodes > 1:
        ns.master_port = step.master_port
    ns.run_name = ns.run_name or step.run_name  # the same on every node of the step, as multi-node needs


def parse_options(argv: list[str], config_logs_dir: Optional[str] = None, config_timeout: Optional[float] = None,
                  environ: Optional[Mapping[str, str]] = None) -> LaunchOptions:
    """Parse and check the command line (usage errors exit 2; bad values raise LaunchError).

    ``environ`` (default: none) supplies Slurm's variables: under ``srun`` the
    topology and run name come from them when the flags are left out.
    """
    own, script_args = split_script_args(argv)
    ns = build_parser().parse_args(own)
    _apply_slurm(ns, environ or {})
    script = Path(ns.script)
    if not script.exists():
        raise LaunchError(f"training script not found: {ns.script}")
    if not script.is_file():
        raise LaunchError(f"training script is not a file: {ns.script}")
    if not os.access(script, os.R_OK):
        raise LaunchError(f"training script is not readable: {ns.script}")
    if ns.nproc_per_node < 1:
        raise LaunchError(f"--nproc-per-node must be at least 1 (got {ns.nproc_per_node})")
    if ns.nnodes < 1:
        raise LaunchError(f"--nnodes must be at least 1 (got {ns.nnodes})")
    if not 0 <= ns.node_rank < ns.nnodes:
        raise LaunchError(f"--node-rank must be in 0..{ns.nnodes - 1} for --nnodes {ns.nnodes} (got {ns.node_rank})")
    if ns.master_port is not None and not 1 <= ns.master_port <= 65535:
        raise LaunchError(f"--master-port must be 1-65535 (got {ns.master_port})")
    if ns.nnodes > 1 and ns.master_port is None:
        raise LaunchError("--master-port is required with --nnodes > 1 (every launcher must use the same one)")
    if ns.nnodes > 1 and not ns.run_name:
        raise LaunchError("--run-name is required with --nnodes > 1 (every launcher must use the same one)")
    if ns.trace_max_steps is not None and ns.trace_max_steps < 1:
        raise LaunchError(f"--trace-max-steps must be at least 1 (got {ns.trace_max_steps})")
    timeout = ns.finalize_timeout if ns.finalize_timeout is not None else (config_timeout or 60.0)
    if not timeout > 0 or timeout != timeout or timeout == float("inf"):
        raise LaunchError(f"--finalize-timeout must be a positive number of seconds (got {ns.finalize_timeout})")
    if ns.run_name is not None and not ns.run_name:
        raise LaunchError("--run-name must not be empty")
    run_name = ns.run_name or f"{script.stem}-{__import__('time').strftime('%Y%m%d-%H%M%S')}"
    try:
        validate_run_name(run_name)  # the one name rule (the SDK's init() applies it too)
    except ValueError as exc:
        raise LaunchError(f"--run-name: {exc}") from None
    logs_dir = Path(ns.logs_dir or config_logs_dir or "logs")
    try:
        lease_s = core_lease.lease_from_env(environ or {})
    except core_lease.LeaseConfigError as exc:
        raise LaunchError(str(exc)) from None
    return LaunchOptions(
        script=script,
        script_args=tuple(script_args),
        run_name=run_name,
        logs_dir=logs_dir,
        nproc_per_node=ns.nproc_per_node,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        trace_max_steps=ns.trace_max_steps,
        finalize_timeout=float(timeout),
        resume=bool(ns.resume),
        default_name=not ns.run_name,
        auto_attach=not ns.no_auto_attach,
        lease_s=lease_s,
    )


def main(argv: list[str]) -> int:
    """Entry point of `traceml run`; returns the training command's exit code."""
    from traceml_tui.guard.config import ConfigError, check_trace_max_steps, find_config, load_config

    if argv and argv[0] in ("-h", "--help"):
        build_parser().print_help()
        return 0
    try:
        config_path = find_config(Path.cwd())
        config = load_config(config_path)
        options = parse_options(argv, config.logs_dir, config.finalize_timeout_sec, os.environ)
        if config.guard is not None:
            check_trace_max_steps(config.guard, options.trace_max_steps)
            if options.resume:
                raise LaunchError("--resume is not allowed for a guarded run: choose a fresh --run-name")
        hygiene = None
        if config.require_validation and config.hygiene is None:
            raise ConfigError(config.path, "require_validation",
                              "is true but no hygiene: block declares validation (docs/hygiene.md)")
        if config.hygiene is not None:
            from traceml_tui.hygiene.config import HygieneConfigError, parse_hygiene

            try:
                hygiene = parse_hygiene(config.hygiene)
            except HygieneConfigError as exc:  # said like every other traceml.yaml error: file, field, rule
                raise ConfigError(config.path, exc.path, exc.problem) from None
    except (ConfigError, LaunchError) as exc:
        print(f"traceml run: {exc}", file=sys.stderr)
        return EXIT_REFUSED

    from traceml_tui.run.launch import Launcher

    launcher = Launcher(options, config, hygiene)
    try:
        launcher.prepare()
    except LaunchError as exc:
        print(f"traceml run: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return launcher.run()
