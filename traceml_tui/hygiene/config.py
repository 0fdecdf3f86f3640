"""The ``hygiene:`` block of ``traceml.yaml``: validation and normalization.

Seed 004 requires the launcher to refuse a run *before* expensive execution
when the loss-history schema/output, the curve cadence, the validation recipe,
cadence and worker binding, or the early-stopping policy are absent. This
module is pure: it takes the already-parsed YAML value and returns a
normalized dict (the "effective config" recorded in the manifest) or raises
:class:`HygieneConfigError` whose message is one line naming the field path.

Shape (all cadences are in optimizer updates)::

    hygiene:
      history:
        schema: 1                    # step record version (traceml_tui.core.records.RECORD_VERSION)
        output: ranks                # the append-only history's folder: always ranks (the run directory layout)
        components: [mse]            # optional: the loss components the run logs (planned Trackio keys)
        metrics: [r2]                # optional: the training task metrics it logs
      curve:
        cadence: 50                  # re-render learning_curve.png every N updates
      validation:
        recipe: regression-holdout-v1
        cadence: 100                 # publish a checkpoint + request every N updates
        first_evaluation: 0          # first checkpoint step (0 = at initialization)
        worker: [python, validate.py, --checkpoint, "{checkpoint}"]
        dispatcher: launcher         # or external (optional; default launcher)
        metrics: [r2, mse, mse_ratio]  # optional: the metrics the worker reports (planned Trackio keys)
      early_stopping:
        metric: r2
        direction: max               # min | max
        min_delta: 0.001
        patience: 3                  # completed eligible evaluations
        warmup: 200                  # updates before evaluations become eligible
        max_budget: 5000             # hard cap in updates
        # or: enabled: false + reason: "exact reproduction of …"
      qc:
        cadence: 100
        owner: vanguard-hal          # optional together: owner, output, roster, items (hygiene/qc_block.py)
        output: qc
        roster: {name: val-fixed-64, members: [case-001, …], selection: "…"}
        items: {batch_grid: required, field_stats: required, galleries: required,
                worker_qc: {inapplicable: "…"}}
      recovery:                      # optional: rolling recovery saves (traceml.save_recovery)
        every: 50                    # recovery cadence in updates, apart from validation.cadence
        keep: 2                      # saves kept per rank (referenced ones are never removed)
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from pathlib import PurePosixPath
from typing import Any

from traceml_tui.core.hygiene_files import INT64_MAX, MAX_SECONDS
from traceml_tui.core.records import RECORD_VERSION
from traceml_tui.core.rundir import LEARNING_CURVE, RANKS
from traceml_tui.core.state import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BACKOFF_S,
    DEFAULT_WORKER_TIMEOUT_S,
)
from traceml_tui.guard.contract import show_key, show_value  # user values in messages: one line, <= 80 chars
from traceml_tui.hygiene import qc_block

DIRECTIONS = ("min", "max")
SECTIONS = ("history", "curve", "validation", "early_stopping", "qc", "recovery")
CURVE_FILE = LEARNING_CURVE  # relative to the run directory
WORKER_PLACEHOLDERS = ("{checkpoint}", "{step}", "{run_dir}")
#: ``hygiene.validation.dispatcher``: who drains the backlog. ``launcher`` (the default): `traceml run`
#: starts the declared worker as a drainer while training runs and drains the rest after it;
#: ``external``: drainers are started elsewhere (a scheduler's timer, another node).
DISPATCH_LAUNCHER = "launcher"
DISPATCH_EXTERNAL = "external"
DISPATCHERS = (DISPATCH_LAUNCHER, DISPATCH_EXTERNAL)


class HygieneConfigError(ValueError):
    """A malformed ``hygiene:`` block; ``str()`` is one line: ``<field path>: <problem>``."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


def _mapping(value: Any, path: str) -> dict:
    if value is None:
        raise HygieneConfigError(path, "required")
    if not isinstance(value, dict):
        raise HygieneConfigError(path, f"must be a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise HygieneConfigError(path, f"keys must be strings, got {show_value(key)}")
    return value


def _required(block: dict, key: str, path: str) -> Any:
    if key not in block or block[key] is None:
        raise HygieneConfigError(f"{path}.{key}", "required")
    return block[key]


def _int(value: Any, path: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HygieneConfigError(path, f"must be an integer, got {show_value(value)}")
    if value < minimum:
        raise HygieneConfigError(path, f"must be >= {minimum}, got {show_value(value)}")
    if value > INT64_MAX:  # it is written into manifests, claims and the index: SQLite's integer range
        raise HygieneConfigError(path, f"must fit in a signed 64-bit integer, got {show_value(value)}")
    return int(value)


def _number(value: Any, path: str, *, minimum: float, maximum: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HygieneConfigError(path, f"must be a number, got {show_value(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond a double
        number = math.inf
    if not math.isfinite(number) or number < minimum or number > maximum:
        bound = f" and <= {maximum:g}" if math.isfinite(maximum) else ""
        raise HygieneConfigError(path, f"must be a finite number >= {minimum:g}{bound}, got {show_value(value)}")
    return number


def _text(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise HygieneConfigError(path, "must be a nonempty string")
    return value.strip()


def _unknown_keys(block: dict, allowed: tuple[str, ...], path: str) -> None:
    for key in block:
        if key not in allowed:
            raise HygieneConfigError(f"{path}.{show_key(key)}", f"unknown key (allowed: {', '.join(allowed)})")


def _relative_path(value: Any, path: str) -> str:
    text = _text(value, path)
    pure = PurePosixPath(text)
    if pure.is_absolute() or ".." in pure.parts:
        # Outputs must stay inside the run directory (seed 004: the experiment's
        # output directory is authoritative) and artifacts hold no absolute paths.
        raise HygieneConfigError(path, f"must be a path relative to the run directory, got {show_value(text)}")
    return pure.as_posix()


def _worker(value: Any, path: str) -> list[str]:
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise HygieneConfigError(path, f"cannot split command: {exc}") from None
    elif isinstance(value, list) and all(isinstance(item, (str, int, float)) and not isinstance(item, bool) for item in value):
        argv = [str(item) for item in value]
    else:
        raise HygieneConfigError(path, "must be a command (string or list of strings)")
    if not argv or not argv[0].strip():
        raise HygieneConfigError(path, "must be a nonempty command")
    if not any("{checkpoint}" in arg for arg in argv):
        raise HygieneConfigError(path, "must pass the checkpoint to the worker with a {checkpoint} placeholder")
    return argv


def _names(value: Any, path: str) -> list[str]:
    """A declared list of metric or component names: nonempty strings, each once."""
    if not isinstance(value, list) or not value:
        raise HygieneConfigError(path, "must be a nonempty list of names")
    names = [_text(item, f"{path}[{i}]") for i, item in enumerate(value)]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise HygieneConfigError(f"{path}[{i}]", f"{show_value(name)} is listed twice")
    return names


def _planned(block: dict, keys: tuple[str, ...], path: str) -> dict:
    """The optional planned names of a section (``history.components``, ``validation.metrics``...).

    Only what is declared is recorded, so a block that declares none normalizes as before.
    What they are for: docs/export.md, "Check before launch".
    """
    return {key: _names(block[key], f"{path}.{key}") for key in keys if block.get(key) is not None}


def _history(raw: Any) -> dict:
    path = "hygiene.history"
    block = _mapping(raw, path)
    _unknown_keys(block, ("schema", "output", "components", "metrics"), path)
    schema = _required(block, "schema", path)
    if isinstance(schema, str) and schema.lower().lstrip("v").isdigit():
        schema = int(schema.lower().lstrip("v"))
    schema = _int(schema, f"{path}.schema", minimum=1)
    if schema != RECORD_VERSION:
        raise HygieneConfigError(f"{path}.schema", f"unsupported history schema {schema} (this traceml writes {RECORD_VERSION})")
    output = _relative_path(_required(block, "output", path), f"{path}.output")
    if output != RANKS:
        # The history's home is fixed by the run directory layout (docs/hygiene.md): every reader
        # (summary, daemon, curve, export) reads ranks/; another folder would be recorded and ignored.
        raise HygieneConfigError(
            f"{path}.output",
            f"must be {RANKS} (the history is always ranks/rank_<r>/steps-<attempt>.jsonl), got {show_value(output)}",
        )
    return {"schema": schema, "output": output, **_planned(block, ("components", "metrics"), path)}


def _curve(raw: Any) -> dict:
    path = "hygiene.curve"
    block = _mapping(raw, path)
    _unknown_keys(block, ("cadence",), path)
    cadence = _int(_required(block, "cadence", path), f"{path}.cadence", minimum=1)
    return {"cadence": cadence, "path": CURVE_FILE}


def _validation(raw: Any) -> dict:
    path = "hygiene.validation"
    block = _mapping(raw, path)
    _unknown_keys(block, ("recipe", "cadence", "first_evaluation", "worker", "lease_s", "max_attempts", "dispatcher",
                          "retry_backoff_s", "timeout_s", "metrics"), path)
    recipe = _text(_required(block, "recipe", path), f"{path}.recipe")
    cadence = _int(_required(block, "cadence", path), f"{path}.cadence", minimum=1)
    first = _int(_required(block, "first_evaluation", path), f"{path}.first_evaluation", minimum=0)
    worker = _worker(_required(block, "worker", path), f"{path}.worker")
    lease = _number(block.get("lease_s", DEFAULT_LEASE_S), f"{path}.lease_s", minimum=1, maximum=MAX_SECONDS)
    attempts = _int(block.get("max_attempts", DEFAULT_MAX_ATTEMPTS), f"{path}.max_attempts", minimum=1)
    backoff = _number(block.get("retry_backoff_s", DEFAULT_RETRY_BACKOFF_S), f"{path}.retry_backoff_s", minimum=0,
                      maximum=MAX_SECONDS)
    timeout = _number(block.get("timeout_s", DEFAULT_WORKER_TIMEOUT_S), f"{path}.timeout_s", minimum=1,
                      maximum=MAX_SECONDS)
    dispatcher = block.get("dispatcher", DISPATCH_LAUNCHER)
    if dispatcher not in DISPATCHERS:
        raise HygieneConfigError(f"{path}.dispatcher", f"must be one of {', '.join(DISPATCHERS)}, got {show_value(dispatcher)}")
    return {
        "recipe": recipe,
        "cadence": cadence,
        "first_evaluation": first,
        "worker": worker,
        "lease_s": lease,
        "max_attempts": attempts,
        "retry_backoff_s": backoff,
        "timeout_s": timeout,
        "dispatcher": dispatcher,
        **_planned(block, ("metrics",), path),
    }


def _early_stopping(raw: Any) -> dict:
    path = "hygiene.early_stopping"
    block = _mapping(raw, path)
    keys = ("enabled", "reason", "metric", "direction", "min_delta", "patience", "warmup", "max_budget")
    _unknown_keys(block, keys, path)
    enabled = block.get("enabled", True)
    if not isinstance(enabled, bool):
        raise HygieneConfigError(f"{path}.enabled", f"must be true or false, got {show_value(enabled)}")
    if not enabled:
        # A fixed-duration protocol may opt out, but only with its reason on record.
        reason = _text(_required(block, "reason", path), f"{path}.reason")
        result: dict[str, Any] = {"enabled": False, "reason": reason}
        if block.get("max_budget") is not None:
            result["max_budget"] = _int(block["max_budget"], f"{path}.max_budget", minimum=1)
        return result
    metric = _text(_required(block, "metric", path), f"{path}.metric")
    direction = _required(block, "direction", path)
    if direction not in DIRECTIONS:
        raise HygieneConfigError(f"{path}.direction", f"must be min or max, got {show_value(direction)}")
    min_delta = _number(_required(block, "min_delta", path), f"{path}.min_delta", minimum=0.0)
    patience = _int(_required(block, "patience", path), f"{path}.patience", minimum=1)
    warmup = _int(block.get("warmup", 0) if block.get("warmup") is not None else 0, f"{path}.warmup", minimum=0)
    max_budget = _int(_required(block, "max_budget", path), f"{path}.max_budget", minimum=1)
    if warmup >= max_budget:
        # No checkpoint before the budget would be eligible: early stopping could never act.
        raise HygieneConfigError(f"{path}.warmup", f"must be below max_budget ({max_budget}), got {warmup}; "
                                 "a fixed-duration protocol declares enabled: false with its reason")
    return {
        "enabled": True,
        "metric": metric,
        "direction": direction,
        "min_delta": min_delta,
        "patience": patience,
        "warmup": warmup,
        "max_budget": max_budget,
    }


def _qc(raw: Any) -> dict:
    path = "hygiene.qc"
    block = _mapping(raw, path)
    _unknown_keys(block, ("cadence", "collapse_factor", *qc_block.BINDING_KEYS, *qc_block.WORKER_KEYS), path)
    out = {"cadence": _int(_required(block, "cadence", path), f"{path}.cadence", minimum=1)}
    if "collapse_factor" in block:
        factor = block["collapse_factor"]
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0.0 < factor < 1.0:
            raise HygieneConfigError(f"{path}.collapse_factor", f"must be a number between 0 and 1 (got {show_value(factor)})")
        out["collapse_factor"] = float(factor)
    try:  # owner, output root, roster and required items: bound before launch (hygiene/qc_block.py)
        out.update(qc_block.parse_binding(block, path))
    except qc_block.QcBlockError as exc:
        raise HygieneConfigError(exc.path, exc.problem) from None
    _qc_worker(block, out, path)
    return out


def _recovery(raw: Any) -> dict:
    """``hygiene.recovery``: the rolling recovery saves' cadence and bound (docs/hygiene.md, "Recovery saves").

    Both are required once the section is declared: seed 004 asks for a cadence chosen
    from step time, evaluation cost and acceptable loss, never an every-update default.
    """
    path = "hygiene.recovery"
    block = _mapping(raw, path)
    _unknown_keys(block, ("every", "keep"), path)
    return {
        "every": _int(_required(block, "every", path), f"{path}.every", minimum=1),
        "keep": _int(_required(block, "keep", path), f"{path}.keep", minimum=1),
    }


def _qc_worker(block: dict, out: dict, path: str) -> None:
    """``recipe`` and ``worker`` of the QC block: the heavy QC worker of a required ``worker_qc`` (docs/qc.md).

    Both are required when ``items.worker_qc`` is required and refused otherwise (a worker nobody runs
    would be recorded and ignored).
    """
    required = bool(((out.get("items") or {}).get("worker_qc") or {}).get("required"))
    if not required:
        for key in qc_block.WORKER_KEYS:
            if key in block:
                raise HygieneConfigError(f"{path}.{key}", "only with items.worker_qc: required (the heavy QC worker "
                                         "drains the QC backlog)")
        return
    out["recipe"] = _text(_required(block, "recipe", path), f"{path}.recipe")
    out["worker"] = _worker(_required(block, "worker", path), f"{path}.worker")


def _qc_on_checkpoints(parsed: dict) -> None:
    """A required worker QC is requested on published checkpoints: every QC point must publish one.

    QC points are initialization (update 0) and every ``qc.cadence`` updates; checkpoints are published
    from ``validation.first_evaluation`` every ``validation.cadence`` updates (docs/qc.md).
    """
    qc, validation = parsed["qc"], parsed["validation"]
    if "worker" not in qc:
        return
    if validation["first_evaluation"] != 0:
        raise HygieneConfigError("hygiene.validation.first_evaluation", "must be 0 with items.worker_qc: required "
                                 "(QC starts at initialization, on the checkpoint published at update 0)")
    if qc["cadence"] % validation["cadence"]:
        raise HygieneConfigError("hygiene.qc.cadence", f"{qc['cadence']} is not a multiple of validation.cadence "
                                 f"{validation['cadence']}: every QC point needs a published checkpoint")


def parse_hygiene(raw: object) -> dict:
    """Validate and normalize the ``hygiene:`` block of ``traceml.yaml``.

    ``raw`` is the value under the ``hygiene`` key (``None`` when absent). Returns
    the effective config with every default filled in, suitable for the
    manifest. Raises :class:`HygieneConfigError` naming the first bad field.
    """
    block = _mapping(raw, "hygiene")
    _unknown_keys(block, SECTIONS, "hygiene")
    parsed = {
        "history": _history(block.get("history")),
        "curve": _curve(block.get("curve")),
        "validation": _validation(block.get("validation")),
        "early_stopping": _early_stopping(block.get("early_stopping")),
        "qc": _qc(block.get("qc")),
    }
    if block.get("recovery") is not None:  # optional: a block without it normalizes as before
        parsed["recovery"] = _recovery(block["recovery"])
    _qc_on_checkpoints(parsed)
    return parsed


def validation_config_digest(hygiene: dict) -> str:
    """Digest of the settings that determine a validation result.

    Receipts carry it so a result is bound to the recipe and worker command
    that produced it; cadences and leases are excluded because they change
    when work happens, not what it computes.
    """
    validation = hygiene.get("validation", hygiene) if isinstance(hygiene, dict) else {}
    bound = {"recipe": validation.get("recipe"), "worker": validation.get("worker")}
    canonical = json.dumps(bound, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def changed_item(recorded: Any, current: Any, path: str = "hygiene") -> "str | None":
    """The first item of the effective config that differs, as ``<path>: <recorded> -> <current>``; None if equal.

    ``recorded`` is the block a run's manifest holds, ``current`` what
    ``traceml.yaml`` parses to now (both normalized by :func:`parse_hygiene`).
    A resumed run keeps its recorded policy (docs/hygiene.md): this names what
    an edit changed, so the refusal can say it in one line.
    """
    if recorded == current:
        return None
    if isinstance(recorded, dict) and isinstance(current, dict):
        for key in [*current, *(k for k in recorded if k not in current)]:
            where = f"{path}.{show_key(key)}"
            if key not in recorded:
                return f"{where}: (not recorded) -> {show_value(current[key])}"
            if key not in current:
                return f"{where}: {show_value(recorded[key])} -> (absent)"
            found = changed_item(recorded[key], current[key], where)
            if found is not None:
                return found
        return None
    if recorded is None or current is None:
        before = "(not declared)" if recorded is None else "declared"
        after = "(not declared)" if current is None else "declared"
        return f"{path}: {before} -> {after}"
    return f"{path}: {show_value(recorded)} -> {show_value(current)}"
