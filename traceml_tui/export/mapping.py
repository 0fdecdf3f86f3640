"""The metric mapping of the Trackio export: records → namespaced metric keys. Pure.

One key rule (docs/export.md, "One key per quantity"): a key is the quantity,
then the role, ``<quantity>/<role>``, so the train and eval values of one
quantity share a chart: ``loss/train`` + ``loss/eval``, ``mse/train`` +
``mse/eval`` (a loss component's physical value), ``mse_ratio/train`` +
``mse_ratio/eval`` (its scale-free ratio, 1.0 = no skill; the ``_ratio`` suffix
the validation worker and the learning curve use), ``r2/train`` + ``r2/eval``
for task metrics, ``lr/train``, ``grad_norm/train``,
``qc/field/<name>/<statistic>`` for latent field QC, and the health measures
of each QC figure as metrics of the ``qc`` role:
``<figure kind>/<name>/<measure>/qc`` (``gallery/latents/coverage/qc``,
``batch_grid/inputs/gini/qc``). An incoming ``/val`` (or
``/validation``) role is written as ``/eval`` here and nowhere else, so one
endpoint never splits across two charts; two source keys of one record that
would land on one key (``auc`` and ``auc/val``) are refused
(:class:`KeyCollision`), never merged. The step of every point is the optimizer
update count (``STEP_METRIC``). Counters (updates, examples seen, batch size,
pending readouts) go to an information table, never to charts. A missing score
is never sent as a number.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Iterator, Optional

from traceml_tui.core import records
from traceml_tui.hygiene.curve import RATIO_SUFFIX  # one spelling of "a component's ratio" (curve, worker, keys)

STEP_METRIC = "optimizer_updates"
QC_ROLE = "qc"
ROLES = ("train", "eval", "test", QC_ROLE)
_ROLE_ALIASES = {"val": "eval", "valid": "eval", "validation": "eval", "eval": "eval", "train": "train",
                 "training": "train", "test": "test"}
PROJECT_RE = re.compile(r"([a-z0-9][a-z0-9_]*)-([a-z0-9][a-z0-9_-]*)")  # fullmatch only ("$" accepts "\n")
_KEY_PART_RE = re.compile(r"[^A-Za-z0-9_.\-]+")

#: what the exporter publishes, by record source (recorded in the run config and checked by --validate-only)
MAPPING: dict[str, str] = {
    "step.loss": "loss/train",
    "step.components.<c>.value": "<c>/train",
    "step.components.<c>.ratio": "<c>_ratio/train",
    "step.metrics.<m>": "<m>/train",
    "step.lr": "lr/train",
    "step.grad_norm": "grad_norm/train",
    "eval.metrics.<m> (completed)": "<m>/<role>",
    "receipt.metrics.<m>": "<m>/eval",
    "field_stats.<f>.<stat>": "qc/field/<f>/<stat>",
    "learning_curve.png": "curve/learning_curve",
    "qc/batch_grid/<name>": "qc/batch_grid/<name>",
    "qc/gallery/<name>": "qc/gallery/<name>",
    "batch_grid <name> measures.<measure>": "batch_grid/<name>/<measure>/qc",
    "gallery <name> measures.overall.<measure>": "gallery/<name>/<measure>/qc",
    "counters, readouts": "info/run, info/readouts (tables)",
}


#: Metric roles refused (seed 004): "selection" hides that eval picked the checkpoint; use train/eval labels
#: and say in the description that eval drives selection (it is then not an untouched test).
REFUSED_ROLES = frozenset({"selection"})


def normalize_role(role: Optional[str]) -> str:
    """The published role of a role label: val/validation → eval (the one place that does it).

    Raises ``ValueError`` (one line) for a refused role such as ``selection``.
    """
    word = (role or "eval").strip().lower()
    if word in REFUSED_ROLES:
        raise ValueError(f"metric role {role!r} is refused: publish it as eval and say in the run's description "
                         "that eval selects checkpoints (so it is not an untouched test)")
    return _ROLE_ALIASES.get(word, _clean(role or "eval"))


def _clean(part: str) -> str:
    return _KEY_PART_RE.sub("_", str(part).strip()) or "_"


def metric_key(name: str, role: str) -> str:
    """``<quantity>/<role>``; a name that already ends in a role keeps it, normalized (``auc/val`` → ``auc/eval``)."""
    parts = [p for p in str(name).split("/") if p]
    if len(parts) > 1 and parts[-1].strip().lower() in REFUSED_ROLES:
        normalize_role(parts[-1])  # raises
    if len(parts) > 1 and parts[-1].lower() in _ROLE_ALIASES:
        return "/".join(_clean(p) for p in parts[:-1]) + "/" + normalize_role(parts[-1])
    return "/".join(_clean(p) for p in parts or ["_"]) + "/" + normalize_role(role)


def validate_mapping(keys: Iterable[str] = MAPPING.values()) -> list[str]:
    """Problems in a metric mapping: every chart key must end in a role (tables and images excepted)."""
    problems = []
    for key in keys:
        if key.startswith(("qc/", "curve/", "info/")):
            continue
        if key.rsplit("/", 1)[-1] not in ROLES and not key.endswith("<role>"):
            problems.append(f"metric key {key!r} does not end in a role ({', '.join(ROLES)})")
    return problems


class KeyCollision(ValueError):
    """Two source keys of one record would publish one Trackio key: one value would silently replace the other."""


def _publish(entries: Iterable[tuple[str, str, Any]]) -> dict[str, float]:
    """Chart points of one record from ``(source, key, value)``; refuses two sources on one key.

    The refusal holds whether or not the values are present: the names collide,
    so a later record with both values would lose one of them.
    """
    entries = list(entries)
    clash = collision((source, key) for source, key, _ in entries)
    if clash is not None:
        raise KeyCollision(clash)
    points: dict[str, float] = {}
    for _, key, value in entries:
        number = records.finite_or_none(value)
        if number is not None:  # a missing value stays missing: never a 0
            points[key] = number
    return points


def component_keys(name: str) -> tuple[str, str]:
    """The train keys of one loss component: its physical value and its scale-free ratio."""
    quantity = _clean(name)
    return f"{quantity}/train", f"{quantity}{RATIO_SUFFIX}/train"


def step_sources(rec: records.Step) -> Iterator[tuple[str, str, Any]]:
    """``(source, key, value)`` of one training step record (source: how a message names it)."""
    yield "step loss", "loss/train", rec.loss
    yield "step lr", "lr/train", rec.lr
    yield "step grad_norm", "grad_norm/train", rec.grad_norm
    for name, comp in (rec.components or {}).items():
        value_key, ratio_key = component_keys(name)
        yield f"step component {name!r} (value)", value_key, comp.value
        yield f"step component {name!r} (ratio)", ratio_key, comp.ratio
    for name, value in (rec.metrics or {}).items():
        yield f"step metric {name!r}", metric_key(name, "train"), value


def step_points(rec: records.Step) -> dict[str, float]:
    """Chart points of one training step record; :class:`KeyCollision` when two of its sources share a key."""
    return _publish(step_sources(rec))


def eval_sources(metrics: dict[str, Any], role: str = "eval") -> Iterator[tuple[str, str, Any]]:
    """``(source, key, value)`` of one completed evaluation's metrics."""
    where = "eval metric" if normalize_role(role) == "eval" else f"{normalize_role(role)} metric"
    for name, value in (metrics or {}).items():
        yield f"{where} {name!r}", metric_key(name, role), value


def eval_points(metrics: dict[str, Any], role: str = "eval") -> dict[str, float]:
    """Chart points of one completed evaluation (an eval record or a validation receipt).

    :class:`KeyCollision` when two of its metrics publish one key (``auc`` and ``auc/val``).
    """
    return _publish(eval_sources(metrics, role))


def planned_sources(components: Iterable[str] = (), train_metrics: Iterable[str] = (),
                    eval_metrics: Iterable[str] = ()) -> Iterator[tuple[str, str]]:
    """``(source, key)`` of what a run plans to log, by the rules that publish its records (the ``--check``).

    The fixed training keys (loss, lr, grad_norm) come first; a metric of a
    refused role raises ``ValueError`` (one line naming it).
    """
    yield "step loss", "loss/train"
    yield "step lr", "lr/train"
    yield "step grad_norm", "grad_norm/train"
    for name in components:
        value_key, ratio_key = component_keys(name)
        yield f"step component {name!r} (value)", value_key
        yield f"step component {name!r} (ratio)", ratio_key
    for role, names in (("train", train_metrics), ("eval", eval_metrics)):
        for name in names:
            source = f"{'step' if role == 'train' else 'eval'} metric {name!r}"
            try:
                key = metric_key(name, role)
            except ValueError as exc:  # a refused role
                raise ValueError(f"{source} is not mapped: {exc}") from None
            yield source, key


def collision(sources: Iterable[tuple[str, str]]) -> Optional[str]:
    """The one line naming the first two sources that share a key, None when every key has one source."""
    owner: dict[str, str] = {}
    for source, key in sources:
        first = owner.setdefault(key, source)
        if first != source:
            return (f"{first} and {source} would both publish {key!r}: rename one of them where the run logs it "
                    "(one key per quantity and role, docs/export.md)")
    return None


def field_points(rec: records.FieldStats) -> dict[str, float]:
    """Chart points of one latent field QC record (statistics in the field's own space)."""
    base = f"qc/field/{_clean(rec.name)}"
    return _publish((f"field {rec.name!r} {stat}", f"{base}/{stat}", getattr(rec, stat))
                    for stat in ("median", "p_low", "p_high", "occupancy"))


def measure_points(kind: str, name: str, measures: Any) -> dict[str, float]:
    """Chart points of one QC figure's health measures (``hygiene/qc_measures.py``), role ``qc``.

    ``kind``: ``batch_grid`` or ``gallery``; ``measures``: the figure's
    ``measures`` object (a gallery's ``overall``). A measure that is not a
    number (an empty group's coverage) is not sent: never a substituted zero.
    """
    from traceml_tui.hygiene.qc_measures import headline

    if not isinstance(measures, dict):
        return {}
    return _publish((f"{kind} {name!r} {measure}", f"{_clean(kind)}/{_clean(name)}/{measure}/{QC_ROLE}", value)
                    for measure, value in headline(measures).items())


def registration_problems(project: Any, group: Any, description: Any) -> list[str]:
    """What is missing or malformed in a registration (checked before any artifact is read)."""
    problems = []
    if not isinstance(project, str) or not project:
        problems.append("--project is required (<lane>-<manager>, lowercase)")
    elif not PROJECT_RE.fullmatch(project):
        problems.append(f"--project {project!r} must be <lane>-<manager>: lowercase letters, digits, '_' "
                        "(e.g. vanguard-hal)")
    if not isinstance(group, str) or not group.strip():
        problems.append("--group is required (related experiments share a group)")
    if not isinstance(description, str) or not description.strip():
        problems.append("--description is required: a nonempty plain-language description of the run")
    elif any(ord(c) < 32 and c not in "\n\t" for c in description):
        problems.append("--description must be plain text (control characters found)")
    problems += validate_mapping()
    return problems


def lane_and_manager(project: str) -> tuple[str, str]:
    """Split a valid project name ``<lane>-<manager>``."""
    match = PROJECT_RE.fullmatch(project)
    if match is None:
        raise ValueError(f"not a <lane>-<manager> project name: {project!r}")
    return match.group(1), match.group(2)
