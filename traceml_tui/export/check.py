"""``traceml export trackio --check TARGET``: before launch, is the run's folder and every planned metric mapped?

Seed 004: before launching a scientific run, verify that its exact output
directory and every planned artifact are mapped to the common metric keys in
the publisher's registration; an ancestor, sibling or earlier directory does
not cover a new output root. The plan is the run's declared ``hygiene:``
block, read from one of two places (docs/export.md, "Check before launch"):

* a ``traceml.yaml`` — before ``traceml run`` creates anything. The folder is
  ``<logs_dir>/<--run-name>`` under the file's folder (where the examples are
  launched from), so ``--run-name`` is required: it is the name the run will be
  launched with, and its Trackio run's name;
* a run folder holding ``manifest.json`` (a run being resumed, or one the
  launcher has just registered): the effective block it recorded.

Checked, in order, the first problem reported as one line: the block itself;
that the worker's metrics are declared (``hygiene.validation.metrics``) and
include the early-stopping metric; that every planned metric maps to a
``<quantity>/<role>`` key of its role, no two to one key; that the folder's
Trackio run is new or already this folder's (its cursor and, through Trackio's
API, its stored ``experiment_dir``). Nothing is written and nothing is sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from traceml_tui.core import artifacts
from traceml_tui.core.rundir import RunDir, validate_run_name
from traceml_tui.export import cursor as cursor_mod
from traceml_tui.export import mapping


class CheckFailed(ValueError):
    """What is not mapped (one line)."""


@dataclass
class Plan:
    """What a run plans to publish: its folder, its Trackio run and its declared hygiene block."""

    run_dir: Path
    run_name: str
    hygiene: dict
    origin: str  # where the block was read: "traceml.yaml" or "manifest.json"


def load_plan(target: Path, run_name: Optional[str]) -> Plan:
    """The plan of ``target`` (a ``traceml.yaml`` or a run folder with a manifest); :class:`CheckFailed` if none."""
    target = Path(target)
    if target.is_dir():
        return _plan_from_manifest(target, run_name)
    if target.suffix in (".yaml", ".yml") or target.is_file():
        return _plan_from_yaml(target, run_name)
    raise CheckFailed(f"{target}: neither a traceml.yaml nor a run folder")


def _plan_from_yaml(path: Path, run_name: Optional[str]) -> Plan:
    from traceml_tui.guard.config import ConfigError, load_config
    from traceml_tui.hygiene.config import HygieneConfigError, parse_hygiene

    try:
        config = load_config(path)
    except ConfigError as exc:
        raise CheckFailed(str(exc)) from None
    if config.hygiene is None:
        raise CheckFailed(f"{path}: declares no hygiene: block, so nothing is planned to check")
    try:
        hygiene = parse_hygiene(config.hygiene)
    except HygieneConfigError as exc:
        raise CheckFailed(f"{path}: {exc}") from None
    if run_name is None:
        raise CheckFailed(f"{path}: --run-name is required before launch: the name the run will be launched with "
                          "(traceml run --run-name NAME) names its folder and its Trackio run")
    try:
        validate_run_name(run_name)
    except ValueError as exc:
        raise CheckFailed(f"--run-name: {exc}") from None
    # traceml run puts a run at <logs_dir>/<name> under the directory it is launched from (docs/run.md)
    run_dir = path.resolve().parent / (config.logs_dir or "logs") / run_name
    return Plan(run_dir, run_name, hygiene, "traceml.yaml")


def _plan_from_manifest(run_dir: Path, run_name: Optional[str]) -> Plan:
    layout = RunDir(run_dir)
    try:
        manifest = artifacts.read_manifest(layout.manifest)
    except FileNotFoundError:
        raise CheckFailed(f"{run_dir}: no manifest.json (before launch, check the run's traceml.yaml with "
                          "--run-name)") from None
    except (OSError, ValueError) as exc:
        raise CheckFailed(f"{run_dir}: manifest.json is unreadable ({exc})") from None
    if manifest is None:
        raise CheckFailed(f"{run_dir}: manifest.json is not a run manifest")
    if not manifest.hygiene_block:
        raise CheckFailed(f"{run_dir}: its manifest records no hygiene: block, so nothing is planned to check")
    return Plan(run_dir.resolve(), run_name or run_dir.resolve().name, manifest.hygiene_block, "manifest.json")


def _names(section: object, key: str) -> list[str]:
    value = section.get(key) if isinstance(section, dict) else None
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def planned_keys(hygiene: dict) -> list[tuple[str, str]]:
    """``(source, key)`` of every planned metric; :class:`CheckFailed` naming the first one that is not mapped."""
    history, validation = hygiene.get("history"), hygiene.get("validation")
    stopping = hygiene.get("early_stopping") if isinstance(hygiene.get("early_stopping"), dict) else {}
    eval_metrics = _names(validation, "metrics")
    if not eval_metrics:
        raise CheckFailed("hygiene.validation.metrics is not declared: the metrics the worker reports are the "
                          "planned eval keys (e.g. metrics: [r2, mse_ratio])")
    target = stopping.get("metric") if stopping.get("enabled", True) else None
    if isinstance(target, str) and target not in eval_metrics:
        raise CheckFailed(f"early-stopping metric {target!r} is not mapped: hygiene.validation.metrics "
                          f"({', '.join(eval_metrics)}) does not report it, so nothing would publish it")
    try:
        sources = list(mapping.planned_sources(_names(history, "components"), _names(history, "metrics"),
                                               eval_metrics))
    except ValueError as exc:  # a refused role (selection), naming the metric
        raise CheckFailed(str(exc)) from None
    for source, key in sources:
        role = "eval" if source.startswith("eval ") else "train"
        if key.rsplit("/", 1)[-1] != role:
            raise CheckFailed(f"{source} is not mapped to a {role} key: its name ends in another role (it would "
                              f"publish {key!r})")
    clash = mapping.collision(sources)
    if clash is not None:
        raise CheckFailed(clash)
    return sources


def check_folder(plan: Plan, project: str, reader, cursor_dir: Optional[Path]) -> str:
    """Whether the folder's Trackio run is new or this folder's own: ``"new"``/``"published"``, else CheckFailed.

    ``reader`` is a :class:`readback.TrackioReader`; its :class:`readback.ReadBackUnavailable` propagates.
    """
    here = str(plan.run_dir)
    path = cursor_mod.cursor_path(plan.run_dir, project, cursor_dir, plan.run_name)
    if path.is_file():
        try:
            cur = cursor_mod.load(path)
        except ValueError as exc:  # an unreadable cursor is named, never ignored (docs/export.md)
            raise CheckFailed(f"{here}: {exc}") from None
        if cur.experiment_dir is not None and cur.experiment_dir != here:
            raise CheckFailed(f"{here} is not mapped: its Trackio run {plan.run_name!r} of {project} is published "
                              f"from {cur.experiment_dir} (cursor {path.name}); give this run its own --run-name")
        if cur.run_name is not None and cur.run_name != plan.run_name:
            raise CheckFailed(f"{here} is published to {project} as Trackio run {cur.run_name!r}, not "
                              f"{plan.run_name!r}: pass --run-name {cur.run_name}")
    owner = reader.run_config(project, plan.run_name).get("experiment_dir")
    if isinstance(owner, str) and owner != here:
        raise CheckFailed(f"{here} is not mapped: Trackio run {plan.run_name!r} of {project} is published from "
                          f"{owner} (an ancestor, sibling or earlier folder does not cover a new output root); "
                          "give this run its own --run-name")
    return "published" if owner == here else "new"
