"""Early stopping consumes the receipts drained after training (docs/hygiene.md).

Seed 004: validation "drains the final backlog after training stops". The
launcher's finalization (``run/launch.py``) and, for ``dispatcher: external``,
every drainer finishing on an ended run
(:func:`traceml_tui.validate_cli.refresh_ended_run`, which also rebuilds
the summary's ``validation`` section) call :func:`consume_final_receipts`
first, so ``early_stopping.json`` says what the receipts say.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from traceml_tui.core.rundir import RunDir


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
