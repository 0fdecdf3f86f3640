"""Heavy QC through the backlog (seed 004; docs/qc.md, "Heavy QC through the backlog").

The validation backlog's machinery serves QC too — one implementation, two kinds. A QC request is a
validation-shaped request under ``qc/requests/`` (claims, receipts and failures beside it), handled by
:mod:`traceml_tui.hygiene.backlog` and :mod:`traceml_tui.hygiene.drain` with ``kind="qc"``, its state decided
by :func:`traceml_tui.core.state.decide_backlog` like every validation request's.

* When ``hygiene.qc.items.worker_qc`` is ``required``, publishing a checkpoint at a QC point (initialization,
  update 0, and every ``hygiene.qc.cadence`` updates) also writes its QC request: the same immutable
  checkpoint, bound to the QC config digest (the QC ``recipe`` and ``worker`` command, digested by the rule of
  :func:`traceml_tui.hygiene.config.validation_config_digest`).
* The launcher drains it with the declared QC worker (``traceml validate drain --kind qc``), retrying a failed
  request after its backoff and blocking one that failed ``max_attempts`` times (``hygiene.validation``'s
  settings: one set of retry rules for both kinds).
* :func:`worker_qc_report` is the one report of the QC backlog for every surface (the summary, ``traceml
  status --json``), its word decided by :func:`traceml_tui.core.state.decide_worker_qc`: ``passed`` only when
  at least one request exists and every request has its receipt; pending or failed QC is never passed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

from traceml_tui.core import artifacts, state
from traceml_tui.core import backlog as core_backlog
from traceml_tui.core.atomic import atomic_write_json
from traceml_tui.core.rundir import QC_BACKLOG, RunDir
from traceml_tui.hygiene import backlog

#: The backlog kind of heavy QC (``qc/requests`` …).
KIND = QC_BACKLOG
#: The words of :class:`traceml_tui.core.state.WorkerQcState`.
PASSED, PENDING, FAILED, NOT_REQUESTED = (state.WorkerQcState.PASSED.value, state.WorkerQcState.PENDING.value,
                                          state.WorkerQcState.FAILED.value, state.WorkerQcState.NOT_REQUESTED.value)


def declared_worker(qc: Optional[Mapping[str, Any]]) -> Optional[dict]:
    """``{recipe, worker, cadence}`` of a QC block whose ``worker_qc`` is required, else None."""
    if not core_backlog.requires_worker_qc(qc):
        return None
    assert isinstance(qc, Mapping)
    return {"recipe": qc.get("recipe"), "worker": list(qc["worker"]), "cadence": qc.get("cadence")}


def qc_config_digest(qc: Mapping[str, Any]) -> str:
    """The digest a QC request and its receipt are bound to: the QC recipe and worker command (docs/qc.md)."""
    from traceml_tui.hygiene.config import validation_config_digest

    return validation_config_digest({"validation": {"recipe": qc.get("recipe"), "worker": qc.get("worker")}})


def is_qc_point(step: int, cadence: Any) -> bool:
    """Whether ``step`` is a QC point: initialization (0) or a multiple of the QC cadence."""
    if step == 0:
        return True
    return isinstance(cadence, int) and not isinstance(cadence, bool) and cadence > 0 and step % cadence == 0


def manifest_qc(run_dir: Path) -> Optional[Mapping[str, Any]]:
    """The run manifest's normalized ``hygiene.qc`` block (None without one)."""
    try:
        manifest = artifacts.read_manifest(RunDir(run_dir).manifest)
    except OSError:
        return None
    if manifest is None or not isinstance(manifest.hygiene, dict):
        return None
    qc = manifest.hygiene.get("qc")
    return qc if isinstance(qc, Mapping) else None


def publish_qc_request(run_dir: Path, request: Mapping[str, Any],
                       qc: Optional[Mapping[str, Any]] = None) -> Optional[dict]:
    """Write the QC request of a just published checkpoint when it is a QC point; returns it (None: not one).

    ``request`` is the checkpoint's validation request (:func:`traceml_tui.hygiene.checkpoints.publish_request`):
    the QC request names the same checkpoint id, step and path (the checkpoint is immutable, so both workers
    read the same bytes). ``qc`` defaults to the run manifest's ``hygiene.qc``. Written once, atomically.
    """
    run_dir = Path(run_dir)
    qc = manifest_qc(run_dir) if qc is None else qc
    declared = declared_worker(qc)
    step = request.get("step")
    if declared is None or not isinstance(step, int) or not is_qc_point(step, declared["cadence"]):
        return None
    assert qc is not None  # declared_worker said so
    qc_request = {"checkpoint": request["checkpoint"], "step": step, "path": request["path"],
                  "config_digest": qc_config_digest(qc), "created": request.get("created")}
    backlog.ensure_dirs(run_dir, KIND)
    try:
        atomic_write_json(RunDir(run_dir).request(request["checkpoint"], KIND), qc_request, exclusive=True)
    except FileExistsError:
        return None  # already requested (never overwritten)
    return qc_request


def worker_qc_state(status: Mapping[str, Any]) -> str:
    """The word for a QC backlog (:func:`traceml_tui.hygiene.backlog.backlog_status` of ``kind="qc"``):
    :func:`traceml_tui.core.state.decide_worker_qc` over its requests' state words."""
    words = (state.BacklogState(row["state"]) for row in status.get("requests") or ())
    return state.decide_worker_qc(words).value


def worker_qc_report(run_dir: Path) -> dict[str, Any]:
    """The QC backlog as the summary and ``traceml status --json`` show it: :func:`traceml_tui.core.backlog.
    worker_qc_report` of its entries (the daemon side calls the same function), plus ``errors``.

    ``{state, requested, completed, counts, outstanding, errors}``: ``outstanding`` lists every request without
    a receipt (checkpoint, step, state, failures, last_error), so a failed QC is named, never hidden.
    """
    errors: list[str] = []
    entries = backlog.backlog_entries(Path(run_dir), errors=errors, kind=KIND)
    return {**core_backlog.worker_qc_report(entries, errors), "errors": errors}


def not_passed_line(report: Mapping[str, Any]) -> Optional[str]:
    """One line naming why worker QC did not pass (None when it passed)."""
    state = report.get("state")
    if state == PASSED:
        return None
    if state == NOT_REQUESTED:
        return "worker QC not passed: no QC request was written (no checkpoint published at a QC point)"
    rows = report.get("outstanding") or []
    damaged = core_backlog.damaged_requests(report.get("errors") or ())
    if damaged and not rows:
        return f"worker QC not passed ({state}): damaged QC request file(s): {', '.join(damaged[:3])}" + (
            f" and {len(damaged) - 3} more" if len(damaged) > 3 else "")
    named = ", ".join(
        f"{r.get('checkpoint')} {r.get('state')}" + (f" after {r.get('failures')} failed attempts (last: "
                                                      f"{r.get('last_error')})" if r.get("failures") else "")
        for r in rows[:3])
    more = f" and {len(rows) - 3} more" if len(rows) > 3 else ""
    return f"worker QC not passed ({state}): {named}{more}"


__all__ = ["FAILED", "KIND", "NOT_REQUESTED", "PASSED", "PENDING", "declared_worker", "is_qc_point", "manifest_qc",
           "not_passed_line", "publish_qc_request", "qc_config_digest", "worker_qc_report", "worker_qc_state"]
