"""Property tests of the Trackio key rule (docs/export.md, "One key per quantity") over arbitrary metric names.

Metric names come from the run (untrusted): whatever they are, a record either
maps each name to its own ``<quantity>/<role>`` key or is refused naming two
sources; it never merges two values into one key.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceml_tui.export import mapping

from support.lanes import examples

PART = st.sampled_from(["auc", "r2", "mse", "loss", "val", "eval", "validation", "train", "test", "Val", "a b",
                        "a_b", "x.y", "", " ", "mse_ratio", "é"])
NAME = st.lists(PART, min_size=1, max_size=3).map("/".join)
VALUE = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10))
METRICS = st.dictionaries(NAME, VALUE, max_size=6)
ROLE = st.sampled_from(["eval", "val", "validation", "train", "test", None])


@settings(max_examples=examples(300), deadline=None)
@given(METRICS, ROLE)
def test_each_key_has_one_source_or_the_record_is_refused(metrics: dict, role):
    sources = list(mapping.eval_sources(metrics, role))  # no part is a refused role: this never raises
    keys = [key for _, key, _ in sources]
    try:
        points = mapping.eval_points(metrics, role)
    except mapping.KeyCollision as exc:
        assert len(set(keys)) < len(keys)  # refused only when two names really share a key
        assert "\n" not in str(exc) and str(exc).count("would both publish") == 1
        return
    assert len(set(keys)) == len(keys)
    for name, value in metrics.items():
        key = mapping.metric_key(name, role or "eval")
        assert key.rsplit("/", 1)[-1] in mapping.ROLES
        present = value is not None and not isinstance(value, bool) and math.isfinite(float(value))
        assert (key in points) == present and (not present or points[key] == float(value))


@settings(max_examples=examples(200), deadline=None)
@given(st.text(alphabet="abcxyz_0123.-", min_size=1, max_size=12))
def test_train_and_eval_of_one_quantity_share_the_chart(name: str):
    if name.lower() in ("val", "eval", "validation", "train", "training", "test", "valid"):
        return  # a bare role word is not a quantity
    train, evaluated = mapping.metric_key(name, "train"), mapping.metric_key(name, "val")
    assert train.rsplit("/", 1) == [train.rsplit("/", 1)[0], "train"]
    assert evaluated == train.rsplit("/", 1)[0] + "/eval"
    # a component's value and ratio land beside the worker's metric of the same name
    value_key, ratio_key = mapping.component_keys(name)
    assert value_key == train
    assert ratio_key.rsplit("/", 1)[0] == mapping.metric_key(name + "_ratio", "eval").rsplit("/", 1)[0]


@pytest.mark.parametrize("metrics, pair", [
    ({"auc": 0.7, "auc/val": 0.8}, ("'auc'", "'auc/val'")),
    ({"auc/val": 0.7, "auc/validation": None}, ("'auc/val'", "'auc/validation'")),
    ({"a b": 1.0, "a_b": 2.0}, ("'a b'", "'a_b'")),
])
def test_known_collisions_name_both(metrics: dict, pair: tuple[str, str]):
    with pytest.raises(mapping.KeyCollision) as refused:
        mapping.eval_points(metrics, "val")
    assert all(name in str(refused.value) for name in pair)
