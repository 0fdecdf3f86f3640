"""SDK functions for qualitative and numerical QC: the input batch grid, exemplar galleries and field statistics.

All follow the run's QC cadence (``hygiene.qc.cadence`` in the manifest of a
``traceml run``, or ``cadence=`` here): a call records at the first call for a
name (the initialization reference) and then whenever the current update count
is a multiple of the cadence; other calls return ``None`` at once, so a
training loop may call them every step.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from traceml_tui.core import records

# The QC modules (and numpy/matplotlib behind them) load on first use, so that
# importing the SDK stays cheap for scripts that never call these functions.

# (session id, kind, name) → last recorded step; keeps one decision per step and name
_recorded: dict[tuple[int, str, str], int] = {}
_qc_cache: dict[int, dict] = {}


def _session() -> Any:
    from traceml_tui import sdk

    return sdk.current_run() or sdk.init()


def _manifest_qc(session: Any) -> dict:
    """The run's declared ``hygiene.qc`` block from its manifest (``{}`` outside ``traceml run``)."""
    key = id(session)
    if key not in _qc_cache:
        from traceml_tui.core import artifacts
        from traceml_tui.core.rundir import RunDir

        block: dict = {}
        try:
            manifest = artifacts.read_manifest(RunDir(session.run_dir).manifest)
        except (OSError, TypeError):
            manifest = None
        if manifest is not None:
            raw = manifest.hygiene_block.get("qc")
            block = raw if isinstance(raw, dict) else {}
        _qc_cache[key] = block
    return _qc_cache[key]


def _manifest_cadence(session: Any) -> Optional[int]:
    raw = _manifest_qc(session).get("cadence")
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else None


def _declared_factor(session: Any) -> float:
    raw = _manifest_qc(session).get("collapse_factor")
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and 0.0 < raw < 1.0:
        return float(raw)
    return 0.1


def _due(session: Any, kind: str, name: str, step: int, cadence: Optional[int]) -> bool:
    key = (id(session), kind, name)
    last = _recorded.get(key)
    if last is not None and step == last:
        return False  # already recorded at this step
    if last is None:
        return True  # the first QC point is the reference (initialization)
    every = cadence if cadence is not None else _manifest_cadence(session)
    return every is None or step % every == 0


def log_field_stats(
    name: str,
    values: Any,
    *,
    space: str = "linear",
    bounds: Optional[tuple[Optional[float], Optional[float]]] = None,
    quantiles: tuple[float, float] = (5.0, 95.0),
    collapse_factor: Optional[float] = None,
    step: Optional[int] = None,
    cadence: Optional[int] = None,
) -> Optional[dict]:
    """Record one latent/parameter field's distribution at the QC cadence.

    ``values``: the field (tensor or array, any shape). ``space="log"`` for a
    log-parameterized coordinate: statistics are computed on ``log(values)``.
    ``bounds=(lo, hi)`` in natural units gives the bound occupancy.
    ``collapse_factor`` is predeclared (default: ``hygiene.qc.collapse_factor``
    of the run's traceml.yaml, else 0.1): a spread (``p_high - p_low`` in the
    field's space) below it times the initial spread fails the run's QC.
    Returns the recorded statistics, or ``None`` when this step is off-cadence.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("field name must be a nonempty string")
    if collapse_factor is not None and not (
        isinstance(collapse_factor, (int, float)) and 0.0 < float(collapse_factor) < 1.0
    ):
        raise ValueError("collapse_factor must be between 0 and 1")
    session = _session()
    if collapse_factor is None:
        collapse_factor = _declared_factor(session)
    at = session.last_step if step is None else int(step)
    if not _due(session, "field", name, at, cadence):
        return None
    from traceml_tui.hygiene import field_qc as _field_qc

    stats = _field_qc.compute_field_stats(values, space=space, bounds=bounds, quantiles=quantiles)
    session.write(
        records.FieldStats(
            v=records.RECORD_VERSION,
            run=session.run_name,
            rank=session.rank,
            attempt=session.attempt,
            step=at,
            ts=time.time(),
            name=name,
            space=space,
            median=stats["median"],
            p_low=stats["p_low"],
            p_high=stats["p_high"],
            occupancy=stats["occupancy"],
            q_low=stats["q_low"],
            q_high=stats["q_high"],
            lower=stats["lower"],
            upper=stats["upper"],
            count=stats["count"],
            factor=float(collapse_factor),
        )
    )
    _recorded[(id(session), "field", name)] = at
    return stats


def log_batch_grid(
    batch: Any,
    *,
    roles: Optional[Sequence[str]] = None,
    name: str = "inputs",
    batch_id: Optional[str] = None,
    step: Optional[int] = None,
    cadence: Optional[int] = None,
    all_ranks: bool = False,
    sources: Optional[Sequence[Any]] = None,
    eligible: Optional[int] = None,
    distance: Optional[Callable[[Any, Any], float]] = None,
) -> Optional[Path]:
    """Save one image (paged when large) of one complete batch in the run directory.

    ``batch``: a mapping ``{role: (B, ...)}``, a list of arrays named by
    ``roles``, or one array (``(B, V, ...)`` with ``roles`` naming the V
    views). ``batch_id`` names the fixed QC batch. Only rank 0 saves unless
    ``all_ranks``. Returns the layout JSON path, or ``None`` when off-cadence.
    The JSON holds the grid's health measures: ``sources`` are the members'
    source ids (default: their content), ``eligible`` the sources the QC
    batch draws from, ``distance(a, b)`` a declared distance between members
    (default: pixel space); docs/qc.md.
    """
    session = _session()
    if session.rank != 0 and not all_ranks:
        return None
    at = session.last_step if step is None else int(step)
    if not _due(session, "grid", name, at, cadence):
        return None
    from traceml_tui.hygiene import batch_grid as _grid

    grid_name = name if session.rank == 0 else f"{name}.rank{session.rank}"
    path = _grid.save_batch_grid(session.run_dir, batch, step=at, name=grid_name, roles=roles, batch_id=batch_id,
                                 sources=sources, eligible=eligible, distance=distance)
    _recorded[(id(session), "grid", name)] = at
    return path


def log_gallery(
    groups: Mapping[str, Sequence[Any]],
    *,
    name: str = "gallery",
    rows: int = 16,
    eligible: Optional[Mapping[str, int]] = None,
    selection: Optional[str] = None,
    distance: Optional[Callable[[Any, Any], float]] = None,
    step: Optional[int] = None,
    cadence: Optional[int] = None,
    all_ranks: bool = False,
) -> Optional[Path]:
    """Save a grouped exemplar gallery at the QC cadence: one group per column, sources down the rows.

    ``groups``: ``{group: [example, …]}`` in column order; an example is
    ``{"source": id, "image": array, "score": float?, "coords": [numbers]?}``
    or ``(source, image[, score])``. At least ``rows`` (>= 16) examples per
    group when that many sources are eligible; pages hold every group's
    column; an empty group keeps its column ("0 available"); a source given
    twice in a group is refused (``ValueError``). ``eligible``: a group's
    eligible source count when only some are given; ``selection``: how the
    examples were chosen (recorded). Under a bound ``hygiene.qc.roster`` the
    sidecar lists the sources shown from outside it. Only rank 0 saves unless ``all_ranks``.
    Returns the sidecar JSON's path, or ``None`` when off-cadence (docs/qc.md).
    """
    session = _session()
    if session.rank != 0 and not all_ranks:
        return None
    at = session.last_step if step is None else int(step)
    if not _due(session, "gallery", name, at, cadence):
        return None
    from traceml_tui.hygiene import gallery as _gallery

    gallery_name = name if session.rank == 0 else f"{name}.rank{session.rank}"
    roster = _manifest_qc(session).get("roster")  # the bound QC roster: the sidecar names sources outside it
    path = _gallery.save_gallery(session.run_dir, groups, step=at, name=gallery_name, rows=rows, eligible=eligible,
                                 distance=distance, selection=selection,
                                 roster=roster if isinstance(roster, dict) else None)
    _recorded[(id(session), "gallery", name)] = at
    return path
