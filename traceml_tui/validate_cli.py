"""`traceml validate drain|status`: the validation backlog from the command line.

    traceml validate drain RUN_DIR [--kind validation|qc] [--max-runtime S] [--lease S] [--max-attempts N]
                           [--retry-backoff S] [--timeout S] [--no-curve] [--recipe NAME] [--recipe-override]
                           -- CMD ...{checkpoint}...
    traceml validate status RUN_DIR [--kind validation|qc] [--json]

``--kind qc`` serves the QC backlog (``qc/requests`` …, docs/qc.md) with the same drainer and the same
rules: one implementation, two kinds. Its recipe is ``hygiene.qc.recipe``; no learning curve is drawn.

`drain` exits 0 when no claimable work is left or its runtime limit nears
(failures are recorded in the backlog, not in the exit code); 2 on bad usage
or a RUN_DIR that is not a run directory,
and 2 when a request is bound to another validation config than the recipe and
command it runs (nothing claimed, no receipt; ``--recipe-override`` runs it and
records the override in the receipt).
`status` prints the backlog (text or ``--json``) and exits 0; 1 when a backlog
file is damaged (one line each on stderr, every other file still reported).

After a drain on an ended run the run's record is brought up to date
(:func:`refresh_ended_run`): seed 004 says validation "drains the final backlog
after training stops", and the newest completed checkpoint, the selected best
and the stop must be visible. With ``dispatcher: launcher`` the launcher drains
before it finalizes; with ``dispatcher: external`` receipts keep arriving after
the launcher wrote the summary, so every drainer that finishes on an ended run
does what the launcher's finalization does for validation, in the same order
(docs/hygiene.md).

The command sits above the floors it drives, beside the dispatcher: the backlog,
the drainer and early stopping are hygiene's, the summary is built from hygiene,
and refreshing an ended run's record uses both. Living in either package would
make one of them import the other upward (docs/contracts.md, "arrows").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from traceml_tui.core.cliargs import EXIT_USAGE, RaisingParser, UsageError, positive_seconds, seconds, usage_line
from traceml_tui.core.freshness import eval_lag
from traceml_tui.core.jsonsafe import dumps_valid
from traceml_tui.core.rundir import run_dir_problem
from traceml_tui.core.state import DEFAULT_MAX_ATTEMPTS

#: The backlogs ``--kind`` names (core/rundir.py ``BACKLOG_ROOTS``).
BACKLOG_KINDS = ("validation", "qc")
#: ``validate status`` found a damaged backlog file (reported on stderr, the other files on stdout).
EXIT_DAMAGED = 1

USAGE = ("usage: traceml validate drain RUN_DIR [--kind validation|qc] [options] -- CMD ... | "
         "traceml validate status RUN_DIR [--kind validation|qc] [--json]")


def _fail(message: str, code: int = 2) -> int:
    print(f"traceml validate: {message}", file=sys.stderr)
    return code


def _usage(message: str, prog: Optional[str] = None) -> int:
    print(usage_line(prog or "traceml validate", message), file=sys.stderr)
    return EXIT_USAGE


def _attempts(text: str) -> int:
    """``--max-attempts``: a whole number, at least 1 (0 would block every request before its first try)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def _lease(text: str) -> float:
    """``--lease``: seconds above zero, at most what a claim may record (core/hygiene_files.py ``MAX_SECONDS``)."""
    from traceml_tui.core.hygiene_files import MAX_SECONDS

    value = positive_seconds(text)
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is more than {MAX_SECONDS:g} seconds")
    return value


def _drain(argv: list[str]) -> int:
    if "--" in argv:
        split = argv.index("--")
        opts, command = argv[:split], argv[split + 1:]
    else:
        opts, command = argv, []
    parser = RaisingParser(prog="traceml validate drain", add_help=True)
    parser.add_argument("run_dir")
    parser.add_argument("--kind", choices=BACKLOG_KINDS, default="validation",
                        help="the backlog to drain: validation (default) or qc (heavy QC, docs/qc.md)")
    parser.add_argument("--max-runtime", type=positive_seconds, default=None, help="seconds this worker may run")
    # Unset options take the run's declared hygiene.validation settings (backlog.declared_validation),
    # so a manual drainer retries, leases and times out exactly as every other surface counts.
    parser.add_argument("--lease", type=_lease, default=None,
                        help="claim lease in seconds, heartbeat every lease/3 (default: the run's declared lease_s)")
    parser.add_argument("--max-attempts", type=_attempts, default=None,
                        help="failures after which a request is blocked (default: the run's declared max_attempts)")
    parser.add_argument("--retry-backoff", type=seconds, default=None,
                        help="seconds before the first retry of a failed request, doubling per failure "
                             "(default: the run's declared retry_backoff_s)")
    parser.add_argument("--timeout", type=positive_seconds, default=None,
                        help="seconds one worker may run before it is killed and counted as failed "
                             "(default: the run's declared timeout_s)")
    parser.add_argument("--no-curve", action="store_true", help="do not refresh learning_curve.png after receipts")
    parser.add_argument("--recipe", default=None,
                        help="the validation recipe this command implements (default: the run's declared recipe)")
    parser.add_argument("--recipe-override", action="store_true",
                        help="run requests bound to another validation config; each receipt records the override")
    args = parser.parse_args(opts)
    if not command:
        return _usage("drain needs a worker command after `--` (with a {checkpoint} placeholder)", "traceml validate drain")
    if not any("{checkpoint}" in arg for arg in command):
        return _usage("the worker command must contain a {checkpoint} placeholder", "traceml validate drain")
    run_dir = Path(args.run_dir)
    problem = run_dir_problem(run_dir, backlog=True)
    if problem is not None:
        return _fail(problem)

    from traceml_tui.hygiene.backlog import declared_validation
    from traceml_tui.hygiene.config import validation_config_digest
    from traceml_tui.hygiene.dispatch import load_effective_hygiene
    from traceml_tui.hygiene.drain import DigestMismatch, drain

    # The digest of what this drainer actually runs: the recipe and the command with its placeholders.
    # Without a recipe (none declared in the manifest, no --recipe) there is nothing to bind to: no check.
    # QC requests are bound to hygiene.qc's recipe and worker, digested by the same rule (hygiene/qc_backlog.py).
    declared = (load_effective_hygiene(run_dir) or {}).get(args.kind) or {}
    recipe = args.recipe if args.recipe is not None else declared.get("recipe")
    digest = validation_config_digest({"validation": {"recipe": recipe, "worker": command}}) if recipe else None

    settings = declared_validation(run_dir)
    state = {"last_render": 0.0, "dirty": False}

    qc = args.kind != "validation"

    def refresh(_receipt: dict) -> None:
        state["dirty"] = True
        # Throttled: a burst of quick validations should not spend its time rendering.
        if time.monotonic() - state["last_render"] >= 10.0:
            _render(run_dir)
            state["last_render"], state["dirty"] = time.monotonic(), False

    try:
        result = drain(
            run_dir,
            command,
            max_runtime=args.max_runtime,
            lease_s=args.lease if args.lease is not None else settings["lease_s"],
            max_attempts=args.max_attempts if args.max_attempts is not None else int(settings["max_attempts"]),
            retry_backoff_s=args.retry_backoff if args.retry_backoff is not None else settings["retry_backoff_s"],
            worker_timeout_s=args.timeout if args.timeout is not None else settings["timeout_s"],
            on_receipt=None if args.no_curve or qc else refresh,
            config_digest=digest,
            override=args.recipe_override,
            kind=args.kind,
        )
    except DigestMismatch as exc:
        _after_drain(run_dir, state["dirty"], args.kind)
        return _fail(str(exc))
    _after_drain(run_dir, state["dirty"], args.kind)
    print(
        f"drained: {len(result.completed)} completed, {len(result.failed)} failed, "
        f"{len(result.interrupted)} interrupted; stopped: {result.reason}"
    )
    return 0


def _after_drain(run_dir: Path, dirty: bool, kind: str = "validation") -> None:
    """Refresh the curve; on an ended run also its record (early stopping, summary: :func:`refresh_ended_run`).

    After a QC drain only the summary's ``qc`` section is refreshed (:func:`refresh_ended_qc`)."""
    if kind != "validation":
        for line in refresh_ended_qc(run_dir) or ():
            print(f"traceml validate: warning: {line}", file=sys.stderr)
        return
    warnings = refresh_ended_run(run_dir, _render if dirty else None)
    if warnings is None and dirty:
        _render(run_dir)
    for line in warnings or ():
        print(f"traceml validate: warning: {line}", file=sys.stderr)


def refresh_ended_run(run_dir: Path, render_curve: Optional[Callable[[Path], None]] = None) -> Optional[list[str]]:
    """After a drain: on a run whose launcher has ended, update its record; returns warnings (None: not ended).

    Early stopping consumes the new receipts (the launcher's own step), the curve is redrawn
    (``render_curve``), and the summary's ``validation`` section is rebuilt by the launcher's builder.

    Nothing happens while the manifest says ``running`` (the launcher finalizes
    it itself) or without a manifest (a script run without ``traceml run``
    has no summary). One refresher at a time (a lock under ``validation/``):
    two drainers finishing together must not consume receipts twice.
    """
    from traceml_tui.core import artifacts
    from traceml_tui.core.rundir import RunDir
    from traceml_tui.core.state import summary_is_current
    from traceml_tui.hygiene import backlog
    from traceml_tui.hygiene.finalize import consume_final_receipts
    from traceml_tui.summary.store import refresh_validation

    run_dir = Path(run_dir)
    layout = RunDir(run_dir)
    try:
        manifest = artifacts.read_manifest(layout.manifest)
    except OSError:
        return None
    if manifest is None or not summary_is_current(manifest.status):
        return None
    warnings = []
    lock = layout.record_lock
    fd = backlog.hold_lock(lock)
    try:
        hygiene = manifest.hygiene if isinstance(manifest.hygiene, dict) else {}
        problem = consume_final_receipts(run_dir, hygiene)
        if problem is not None:
            warnings.append(problem)
        if render_curve is not None:
            render_curve(run_dir)  # the best checkpoint and the stop it marks may have changed
        try:
            refresh_validation(run_dir, artifacts.to_builtins(manifest))
        except Exception as exc:  # noqa: BLE001 - the receipts are safe; the summary is derived from them
            warnings.append(f"final summary not refreshed: {type(exc).__name__}: {exc}")
    finally:
        backlog.release_lock(lock, fd)
    return warnings


def refresh_ended_qc(run_dir: Path) -> Optional[list[str]]:
    """After a QC drain on an ended run: its summary's worker QC judged again from the QC backlog now.

    None while the run is running or without a manifest (as :func:`refresh_ended_run`); one refresher at a time.
    """
    from traceml_tui.core import artifacts
    from traceml_tui.core.rundir import RunDir
    from traceml_tui.core.state import summary_is_current
    from traceml_tui.hygiene import backlog
    from traceml_tui.summary.store import refresh_worker_qc

    layout = RunDir(run_dir)
    try:
        manifest = artifacts.read_manifest(layout.manifest)
    except OSError:
        return None
    if manifest is None or not summary_is_current(manifest.status):
        return None
    fd = backlog.hold_lock(layout.record_lock)
    try:
        refresh_worker_qc(Path(run_dir), artifacts.to_builtins(manifest))
    except Exception as exc:  # noqa: BLE001 - the receipts are safe; the summary is derived from them
        return [f"final summary not refreshed: {type(exc).__name__}: {exc}"]
    finally:
        backlog.release_lock(layout.record_lock, fd)
    return []


def _render(run_dir: Path) -> None:
    try:
        from traceml_tui.hygiene.curve import render_learning_curve

        render_learning_curve(run_dir)
    except Exception as exc:  # the curve is derived; a render error must not lose a receipt
        print(f"traceml validate: curve not refreshed: {exc}", file=sys.stderr)


def _status(argv: list[str]) -> int:
    parser = RaisingParser(prog="traceml validate status")
    parser.add_argument("run_dir")
    parser.add_argument("--kind", choices=BACKLOG_KINDS, default="validation",
                        help="the backlog to report: validation (default) or qc (heavy QC, docs/qc.md)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--max-attempts", type=_attempts, default=None,
                        help="failures after which a request is blocked (default: the run's declared value, else "
                             f"{DEFAULT_MAX_ATTEMPTS})")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    problem = run_dir_problem(run_dir, backlog=True)
    if problem is not None:
        return _fail(problem)
    from traceml_tui.hygiene.backlog import backlog_status

    status = backlog_status(run_dir, max_attempts=args.max_attempts, kind=args.kind)
    if args.json:
        keys = ("requests", "newest_completed", "latest_requested", "counts", "outstanding", "errors")
        print(dumps_valid({k: status[k] for k in keys}, indent=2))
    else:
        print(format_status(status))
    # A damaged backlog file: one line each, the rest still reported above, and a non-zero exit (docs/hygiene.md).
    for line in status["errors"]:
        _fail(f"damaged backlog file {line}")
    return EXIT_DAMAGED if status["errors"] else 0


def format_status(status: dict) -> str:
    """Plain-text backlog report: newest completed checkpoint, lag, outstanding requests, failures."""
    lines = []
    newest = status["newest_completed"]
    latest = status["latest_requested"]
    if newest is None:
        lines.append("newest completed: none")
    else:
        metrics = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(newest["metrics"].items()))
        lines.append(f"newest completed: {newest['checkpoint']} (step {newest['step']}) {metrics}".rstrip())
    if latest is not None:
        # how far the newest request is ahead of the newest result (core/freshness.py, the one lag rule)
        lag = eval_lag(latest["step"], newest["step"]) if newest is not None else None
        lines.append(f"latest requested: {latest['checkpoint']} (step {latest['step']})" + (f", eval lag {lag} updates" if lag is not None else ""))
    counts = status["counts"]  # BacklogState words in attention order (core.state.BACKLOG_ORDER)
    summary = ", ".join(f"{n} {word}" for word, n in counts.items() if n)
    lines.append(f"requests: {summary or 'none'}")
    outstanding = status["outstanding"]
    lines.append(f"outstanding: {len(outstanding)}")
    for row in outstanding:
        extra = f" ({row['failures']} failed: {row['last_error']})" if row["failures"] else ""
        if row.get("retry_at"):
            extra += f", retry in {max(1, round(row['retry_at'] - time.time()))} s"
        lines.append(f"  {row['checkpoint']:<20} step {row['step']!s:<8} {row['state']}{extra}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Entry point of `traceml validate`."""
    if not argv:  # a usage error: on stderr, like every other one
        return _usage(f"give a subcommand — {USAGE}")
    if argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    sub, rest = argv[0], argv[1:]
    try:
        if sub == "drain":
            return _drain(rest)
        if sub == "status":
            return _status(rest)
    except UsageError as exc:
        return _usage(str(exc), exc.prog)
    return _usage(f"unknown subcommand {sub!r} (drain or status)")
