"""Bringing an ended run's record up to date with validation drained after it (docs/hygiene.md).

Seed 004: validation "drains the final backlog after training stops", and the
newest completed checkpoint, the selected best and the stop must be visible.
With ``dispatcher: launcher`` the launcher drains before it finalizes; with
``dispatcher: external`` receipts keep arriving after the launcher wrote the
summary. So every drainer that finishes on an ended run calls
:func:`refresh_ended_run`, which does what the launcher's finalization does
for validation, in the same order: early stopping consumes the new receipts
(:func:`consume_final_receipts`, the launcher's own step), the curve is
redrawn, and the summary's ``validation`` section is rebuilt
(:func:`traceml_tui.summary.store.refresh_validation`). ``validate status``,
``final_summary.json``/``.txt``, ``early_stopping.json``, the curve and
``traceml watch`` (which reads the summary) then say the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from traceml_tui.core import artifacts
from traceml_tui.core.rundir import RunDir
from traceml_tui.core.state import summary_is_current


def consume_final_receipts(run_dir: Path, hygiene: dict) -> Optional[str]:
    """Let the script's early stopping consume the receipts drained after training; a warning or None.

    Once stopped, the decision's state is frozen: receipts of checkpoints after
    the stop are recorded in ``after_stop`` and change nothing. Only a run whose
    script used early stopping (``early_stopping.json`` exists) is touched, with
    the policy the run recorded (``hygiene``: its manifest's block).
    """
    if not RunDir(run_dir).early_stopping.is_file():
        return None
    try:
        from traceml_tui.hygiene.early_stopping import EarlyStopping

        EarlyStopping.from_config(run_dir, hygiene).update()
    except Exception as exc:  # noqa: BLE001 - the state stays as the script left it
        return f"early stopping did not consume the final receipts: {type(exc).__name__}: {exc}"
    return None


def refresh_ended_run(run_dir: Path, render_curve: Optional[Callable[[Path], None]] = None) -> Optional[list[str]]:
    """After a drain: on a run whose launcher has ended, update its record; returns warnings (None: not ended).

    Nothing happens while the manifest says ``running`` (the launcher finalizes
    it itself) or without a manifest (a script run without ``traceml run``
    has no summary). One refresher at a time (a lock under ``validation/``):
    two drainers finishing together must not consume receipts twice.
    """
    from traceml_tui.hygiene import backlog

    run_dir = Path(run_dir)
    layout = RunDir(run_dir)
    try:
        manifest = artifacts.decode_manifest(layout.manifest.read_bytes())
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
        from traceml_tui.summary.store import refresh_validation

        try:
            refresh_validation(run_dir, artifacts.to_builtins(manifest))
        except Exception as exc:  # noqa: BLE001 - the receipts are safe; the summary is derived from them
            warnings.append(f"final summary not refreshed: {type(exc).__name__}: {exc}")
    finally:
        backlog.release_lock(lock, fd)
    return warnings
