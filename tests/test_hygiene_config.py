"""The `hygiene:` block: every required item is enforced and named in a one-line error."""

from __future__ import annotations

import copy

import pytest
import yaml

from traceml_tui.hygiene.config import HygieneConfigError, parse_hygiene, validation_config_digest

EXAMPLE = yaml.safe_load(
    """
history:
  schema: 1
  output: ranks
curve:
  cadence: 50
validation:
  recipe: regression-holdout-v1
  cadence: 100
  first_evaluation: 0
  worker: [python, validate.py, --checkpoint, "{checkpoint}"]
early_stopping:
  metric: r2
  direction: max
  min_delta: 0.001
  patience: 3
  warmup: 200
  max_budget: 5000
qc:
  cadence: 100
"""
)

REQUIRED = [
    ("history",),
    ("history", "schema"),
    ("history", "output"),
    ("curve",),
    ("curve", "cadence"),
    ("validation",),
    ("validation", "recipe"),
    ("validation", "cadence"),
    ("validation", "first_evaluation"),
    ("validation", "worker"),
    ("early_stopping",),
    ("early_stopping", "metric"),
    ("early_stopping", "direction"),
    ("early_stopping", "min_delta"),
    ("early_stopping", "patience"),
    ("early_stopping", "max_budget"),
    ("qc",),
    ("qc", "cadence"),
]


def _without(path: tuple[str, ...]) -> dict:
    raw = copy.deepcopy(EXAMPLE)
    node = raw
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return raw


def test_documented_example_normalizes_with_defaults():
    cfg = parse_hygiene(EXAMPLE)
    assert cfg["validation"]["worker"] == ["python", "validate.py", "--checkpoint", "{checkpoint}"]
    assert cfg["validation"]["lease_s"] == 60.0 and cfg["validation"]["max_attempts"] == 3
    assert cfg["validation"]["retry_backoff_s"] == 5.0 and cfg["validation"]["timeout_s"] == 3600.0
    assert cfg["early_stopping"] == {
        "enabled": True, "metric": "r2", "direction": "max", "min_delta": 0.001,
        "patience": 3, "warmup": 200, "max_budget": 5000,
    }
    assert cfg["curve"] == {"cadence": 50, "path": "learning_curve.png"}
    assert cfg["history"] == {"schema": 1, "output": "ranks"}


@pytest.mark.parametrize("path", REQUIRED, ids=".".join)
def test_each_missing_required_item_is_refused_by_name(path):
    with pytest.raises(HygieneConfigError) as info:
        parse_hygiene(_without(path))
    message = str(info.value)
    assert message == f"hygiene.{'.'.join(path)}: required"
    assert "\n" not in message


@pytest.mark.parametrize(
    "path,value,expect",
    [
        (("early_stopping", "direction"), "up", "hygiene.early_stopping.direction: must be min or max"),
        (("early_stopping", "patience"), 0, "hygiene.early_stopping.patience: must be >= 1"),
        (("early_stopping", "min_delta"), "small", "hygiene.early_stopping.min_delta: must be a number"),
        (("curve", "cadence"), 2.5, "hygiene.curve.cadence: must be an integer"),
        (("validation", "worker"), ["python", "validate.py"], "hygiene.validation.worker: must pass the checkpoint"),
        (("validation", "worker"), [], "hygiene.validation.worker: must be a nonempty command"),
        (("validation", "recipe"), "  ", "hygiene.validation.recipe: must be a nonempty string"),
        (("history", "output"), "/abs/ranks", "hygiene.history.output: must be a path relative"),
        (("history", "output"), "../elsewhere", "hygiene.history.output: must be a path relative"),
        (("history", "output"), "history", "hygiene.history.output: must be ranks"),
        (("history", "schema"), 2, "hygiene.history.schema: unsupported history schema 2"),
        (("qc",), "often", "hygiene.qc: must be a mapping"),
        (("validation", "surprise"), 1, "hygiene.validation.surprise: unknown key"),
        (("validation", "timeout_s"), 0, "hygiene.validation.timeout_s: must be a finite number >= 1"),
        (("validation", "retry_backoff_s"), -1, "hygiene.validation.retry_backoff_s: must be a finite number >= 0"),
        # no checkpoint before the budget would be eligible: early stopping could never act
        (("early_stopping", "warmup"), 5000, "hygiene.early_stopping.warmup: must be below max_budget (5000)"),
    ],
)
def test_malformed_items_are_refused_by_name(path, value, expect):
    raw = copy.deepcopy(EXAMPLE)
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(HygieneConfigError) as info:
        parse_hygiene(raw)
    assert str(info.value).startswith(expect)


def test_absent_block_is_refused():
    with pytest.raises(HygieneConfigError, match=r"^hygiene: required$"):
        parse_hygiene(None)


def test_early_stopping_can_be_disabled_only_with_a_reason():
    raw = copy.deepcopy(EXAMPLE)
    raw["early_stopping"] = {"enabled": False}
    with pytest.raises(HygieneConfigError, match=r"^hygiene\.early_stopping\.reason: required$"):
        parse_hygiene(raw)
    raw["early_stopping"] = {"enabled": False, "reason": "exact reproduction of a fixed 300-epoch protocol"}
    assert parse_hygiene(raw)["early_stopping"] == {
        "enabled": False, "reason": "exact reproduction of a fixed 300-epoch protocol"}


def test_worker_string_is_split_and_digest_binds_recipe_and_worker_only():
    raw = copy.deepcopy(EXAMPLE)
    raw["validation"]["worker"] = "python validate.py --checkpoint {checkpoint}"
    as_string = parse_hygiene(raw)
    as_list = parse_hygiene(EXAMPLE)
    assert as_string["validation"]["worker"] == as_list["validation"]["worker"]
    assert validation_config_digest(as_string) == validation_config_digest(as_list)
    raw["validation"]["cadence"] = 7  # when validation runs does not change what it computes
    assert validation_config_digest(parse_hygiene(raw)) == validation_config_digest(as_list)
    raw["validation"]["recipe"] = "regression-holdout-v2"
    assert validation_config_digest(parse_hygiene(raw)) != validation_config_digest(as_list)


def test_changed_item_names_the_first_difference_in_one_line():
    from traceml_tui.hygiene.config import changed_item

    recorded = parse_hygiene(copy.deepcopy(EXAMPLE))
    assert changed_item(recorded, copy.deepcopy(recorded)) is None
    older = copy.deepcopy(recorded)
    del older["validation"]["dispatcher"]  # a manifest from before the item existed
    assert changed_item(older, recorded) == "hygiene.validation.dispatcher: (not recorded) -> 'launcher'"
    assert changed_item(recorded, None) == "hygiene: declared -> (not declared)"
    assert changed_item(None, recorded) == "hygiene: (not declared) -> declared"


def test_planned_names_are_optional_lists_recorded_only_when_declared():
    """history.components/metrics and validation.metrics: the plan `traceml export trackio --check` reads."""
    assert "metrics" not in parse_hygiene(copy.deepcopy(EXAMPLE))["validation"]  # undeclared: nothing added
    cfg = copy.deepcopy(EXAMPLE)
    cfg["history"].update(components=["mse"], metrics=["r2"])
    cfg["validation"]["metrics"] = ["r2", "mse_ratio"]
    out = parse_hygiene(cfg)
    assert (out["history"]["components"], out["history"]["metrics"]) == (["mse"], ["r2"])
    assert out["validation"]["metrics"] == ["r2", "mse_ratio"]
    for value, expect in (([], "must be a nonempty list of names"), ("r2", "must be a nonempty list of names"),
                          (["r2", " "], "hygiene.validation.metrics[1]: must be a nonempty string"),
                          (["r2", "r2"], "hygiene.validation.metrics[1]: 'r2' is listed twice")):
        bad = copy.deepcopy(EXAMPLE)
        bad["validation"]["metrics"] = value
        with pytest.raises(HygieneConfigError) as err:
            parse_hygiene(bad)
        assert expect in str(err.value) and "\n" not in str(err.value)
