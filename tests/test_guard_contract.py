"""The guard declaration rules of seed 000 ("Configuration fields")."""

from __future__ import annotations

import copy
import json

import pytest

from traceml_tui.guard.contract import (
    INT64_MAX,
    INT64_MIN,
    ContractError,
    contract_digest,
    measurement_end,
    parse_guard_contract,
)


def valid() -> dict:
    return {
        "schema_version": 1,
        "workload": {
            "name": "resnet50-imagenet-training",
            "parameters": {
                "model": "resnet50",
                "data_version": "imagenet-1k-v1",
                "precision": "bf16",
                "per_rank_batch_size": 32,
            },
        },
        "measurement": {"start_step": 10, "completed_steps": 50},
    }


def with_(path: str, value, *, delete: bool = False) -> dict:
    """A valid declaration with the value at dotted ``path`` replaced (or removed)."""
    raw = valid()
    node = raw
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[part]
    if delete:
        del node[parts[-1]]
    else:
        node[parts[-1]] = value
    return raw


def with_params(params: dict) -> dict:
    return with_("workload.parameters", params)


P = "guard.workload.parameters"

INVALID: list[tuple[str, object, str]] = [
    # (case id, raw guard block, expected field path)
    ("guard-not-mapping", ["schema_version", 1], "guard"),
    ("guard-null", None, "guard"),
    ("guard-unknown-field", with_("extra", 1), "guard.extra"),
    ("guard-non-string-key", {**valid(), 7: "x"}, "guard"),
    ("schema-missing", with_("schema_version", None, delete=True), "guard.schema_version"),
    ("schema-2", with_("schema_version", 2), "guard.schema_version"),
    ("schema-0", with_("schema_version", 0), "guard.schema_version"),
    ("schema-bool", with_("schema_version", True), "guard.schema_version"),
    ("schema-string", with_("schema_version", "1"), "guard.schema_version"),
    ("schema-float", with_("schema_version", 1.0), "guard.schema_version"),
    ("workload-missing", with_("workload", None, delete=True), "guard.workload"),
    ("workload-list", with_("workload", ["name"]), "guard.workload"),
    ("workload-unknown-field", with_("workload.version", "2"), "guard.workload.version"),
    ("name-missing", with_("workload.name", None, delete=True), "guard.workload.name"),
    ("name-null", with_("workload.name", None), "guard.workload.name"),
    ("name-int", with_("workload.name", 5), "guard.workload.name"),
    ("name-empty", with_("workload.name", ""), "guard.workload.name"),
    ("name-blank", with_("workload.name", "   "), "guard.workload.name"),
    ("name-leading-space", with_("workload.name", " resnet"), "guard.workload.name"),
    ("name-trailing-newline", with_("workload.name", "resnet\n"), "guard.workload.name"),
    ("name-129-chars", with_("workload.name", "n" * 129), "guard.workload.name"),
    ("name-control-char", with_("workload.name", "res\x07net"), "guard.workload.name"),
    ("name-tab-inside", with_("workload.name", "res\tnet"), "guard.workload.name"),
    ("name-zero-width-space", with_("workload.name", "res\u200bnet"), "guard.workload.name"),
    ("name-rtl-override", with_("workload.name", "res\u202enet"), "guard.workload.name"),
    ("name-private-use", with_("workload.name", "res\ue000net"), "guard.workload.name"),
    ("params-list", with_params(["model"]), P),  # type: ignore[arg-type]
    ("params-null", with_("workload.parameters", None), P),
    ("params-33-entries", with_params({f"k{i:02d}": i for i in range(33)}), P),
    ("param-key-int", with_params({1: "x"}), P),
    ("param-key-empty", with_params({"": "x"}), P),
    ("param-key-space", with_params({" model": "x"}), P),
    ("param-key-65-chars", with_params({"k" * 65: "x"}), P),
    ("param-key-control", with_params({"mo\x00del": "x"}), P),
    ("param-key-format", with_params({"mo\u200bdel": "x"}), P),
    ("param-value-null", with_params({"model": None}), f"{P}.model"),
    ("param-value-list", with_params({"model": ["a", "b"]}), f"{P}.model"),
    ("param-value-nested-mapping", with_params({"model": {"depth": 50}}), f"{P}.model"),
    ("param-value-empty-string", with_params({"model": ""}), f"{P}.model"),
    ("param-value-blank-string", with_params({"model": "  "}), f"{P}.model"),
    ("param-value-surrounding-space", with_params({"model": "resnet50 "}), f"{P}.model"),
    ("param-value-257-chars", with_params({"model": "v" * 257}), f"{P}.model"),
    ("param-value-control", with_params({"model": "a\x1bb"}), f"{P}.model"),
    ("param-value-bidi-format", with_params({"model": "a\u202eb"}), f"{P}.model"),
    ("param-value-nan", with_params({"lr": float("nan")}), f"{P}.lr"),
    ("param-value-inf", with_params({"lr": float("inf")}), f"{P}.lr"),
    ("param-value-minus-inf", with_params({"lr": float("-inf")}), f"{P}.lr"),
    ("param-value-int64-max-plus-1", with_params({"seed": INT64_MAX + 1}), f"{P}.seed"),
    ("param-value-int64-min-minus-1", with_params({"seed": INT64_MIN - 1}), f"{P}.seed"),
    ("param-value-bytes", with_params({"model": b"resnet"}), f"{P}.model"),
    ("measurement-missing", with_("measurement", None, delete=True), "guard.measurement"),
    ("measurement-list", with_("measurement", [10, 50]), "guard.measurement"),
    ("measurement-unknown-field", with_("measurement.end_step", 59), "guard.measurement.end_step"),
    ("start-missing", with_("measurement.start_step", None, delete=True), "guard.measurement.start_step"),
    ("start-zero", with_("measurement.start_step", 0), "guard.measurement.start_step"),
    ("start-negative", with_("measurement.start_step", -3), "guard.measurement.start_step"),
    ("start-bool", with_("measurement.start_step", True), "guard.measurement.start_step"),
    ("start-float", with_("measurement.start_step", 10.0), "guard.measurement.start_step"),
    ("start-string", with_("measurement.start_step", "10"), "guard.measurement.start_step"),
    ("start-null", with_("measurement.start_step", None), "guard.measurement.start_step"),
    ("start-int64-overflow", with_("measurement.start_step", INT64_MAX + 1), "guard.measurement.start_step"),
    ("count-missing", with_("measurement.completed_steps", None, delete=True), "guard.measurement.completed_steps"),
    ("count-zero", with_("measurement.completed_steps", 0), "guard.measurement.completed_steps"),
    ("count-bool", with_("measurement.completed_steps", False), "guard.measurement.completed_steps"),
    ("count-int64-overflow", with_("measurement.completed_steps", INT64_MAX + 1), "guard.measurement.completed_steps"),
    (
        "inclusive-end-overflow",
        with_("measurement", {"start_step": INT64_MAX, "completed_steps": 2}),
        "guard.measurement",
    ),
    (
        "inclusive-end-overflow-by-one",
        with_("measurement", {"start_step": 2, "completed_steps": INT64_MAX}),
        "guard.measurement",
    ),
]


@pytest.mark.parametrize(("raw", "field"), [(raw, field) for _, raw, field in INVALID], ids=[c for c, _, _ in INVALID])
def test_invalid_declaration_names_the_field(raw, field):
    with pytest.raises(ContractError) as info:
        parse_guard_contract(raw)
    err = info.value
    assert err.field == field
    assert err.rule
    # One line a user can read in CI logs, starting with the field path.
    message = str(err)
    assert message == f"{field}: {err.rule}"
    assert "\n" not in message and "\r" not in message
    assert isinstance(err, ValueError)


def test_there_are_at_least_forty_invalid_cases():
    assert len(INVALID) >= 40


def test_hostile_key_is_escaped_in_the_error_line():
    with pytest.raises(ContractError) as info:
        parse_guard_contract(with_params({"a\nb\u202e": 1}))
    message = str(info.value)
    assert "\n" not in message and "\u202e" not in message
    assert "\\n" in message


def test_unknown_field_rule_is_readable():
    with pytest.raises(ContractError) as info:
        parse_guard_contract(with_("workload.version", "2"))
    assert str(info.value) == "guard.workload.version: unknown field"


def test_surrounding_whitespace_message():
    with pytest.raises(ContractError) as info:
        parse_guard_contract(with_("workload.name", " x"))
    assert str(info.value) == "guard.workload.name: must not have surrounding whitespace"


VALID_EDGES = [
    ("name-128-chars", with_("workload.name", "n" * 128)),
    ("name-unicode-letters", with_("workload.name", "résnet-日本-Ω")),
    ("params-absent", with_("workload.parameters", None, delete=True)),
    ("params-empty", with_params({})),
    ("params-32-entries", with_params({f"k{i:02d}": i for i in range(32)})),
    ("param-key-64-chars", with_params({"k" * 64: "x"})),
    ("param-value-256-chars", with_params({"model": "v" * 256})),
    ("param-value-inner-space", with_params({"model": "res net"})),
    ("param-int64-max", with_params({"seed": INT64_MAX})),
    ("param-int64-min", with_params({"seed": INT64_MIN})),
    ("param-negative-zero-float", with_params({"x": -0.0})),
    ("param-bools", with_params({"amp": True, "compile": False})),
    ("start-1-count-1", with_("measurement", {"start_step": 1, "completed_steps": 1})),
    ("start-int64-max-count-1", with_("measurement", {"start_step": INT64_MAX, "completed_steps": 1})),
    ("start-1-count-int64-max", with_("measurement", {"start_step": 1, "completed_steps": INT64_MAX})),
]


@pytest.mark.parametrize("raw", [raw for _, raw in VALID_EDGES], ids=[c for c, _ in VALID_EDGES])
def test_valid_edge_cases_are_accepted(raw):
    contract = parse_guard_contract(raw)
    assert contract["schema_version"] == 1
    # Idempotent: a normalized contract is itself a valid declaration.
    assert parse_guard_contract(contract) == contract
    assert measurement_end(contract) <= INT64_MAX


def test_normalized_shape_sorted_and_typed():
    contract = parse_guard_contract(valid())
    assert contract == {
        "schema_version": 1,
        "workload": {
            "name": "resnet50-imagenet-training",
            "parameters": {
                "data_version": "imagenet-1k-v1",
                "model": "resnet50",
                "per_rank_batch_size": 32,
                "precision": "bf16",
            },
        },
        "measurement": {"start_step": 10, "completed_steps": 50},
    }
    assert list(contract["workload"]["parameters"]) == sorted(contract["workload"]["parameters"])
    assert type(contract["workload"]["parameters"]["per_rank_batch_size"]) is int
    assert measurement_end(contract) == 59


def test_missing_parameters_default_to_empty_mapping():
    contract = parse_guard_contract(with_("workload.parameters", None, delete=True))
    assert contract["workload"]["parameters"] == {}


def test_types_preserved_exactly():
    contract = parse_guard_contract(with_params({"a": True, "b": 1, "c": 1.0, "d": "1"}))
    params = contract["workload"]["parameters"]
    assert [type(params[k]) for k in "abcd"] == [bool, int, float, str]


def test_returned_contract_is_a_copy():
    raw = valid()
    contract = parse_guard_contract(raw)
    raw["workload"]["parameters"]["model"] = "vit"
    raw["measurement"]["start_step"] = 99
    assert contract["workload"]["parameters"]["model"] == "resnet50"
    assert contract["measurement"]["start_step"] == 10


def test_digest_ignores_key_order():
    raw = valid()
    reordered = {
        "measurement": {"completed_steps": 50, "start_step": 10},
        "workload": {
            "parameters": dict(reversed(list(raw["workload"]["parameters"].items()))),
            "name": raw["workload"]["name"],
        },
        "schema_version": 1,
    }
    assert contract_digest(parse_guard_contract(raw)) == contract_digest(parse_guard_contract(reordered))


def test_digest_is_type_significant():
    as_int = parse_guard_contract(with_params({"batch": 32}))
    as_str = parse_guard_contract(with_params({"batch": "32"}))
    as_float = parse_guard_contract(with_params({"batch": 32.0}))
    as_bool = parse_guard_contract(with_params({"flag": True}))
    as_one = parse_guard_contract(with_params({"flag": 1}))
    assert len({contract_digest(as_int), contract_digest(as_str), contract_digest(as_float)}) == 3
    assert contract_digest(as_bool) != contract_digest(as_one)


def test_digest_changes_with_any_declared_value():
    base = contract_digest(parse_guard_contract(valid()))
    assert contract_digest(parse_guard_contract(with_("workload.name", "other"))) != base
    assert contract_digest(parse_guard_contract(with_("measurement.completed_steps", 51))) != base


def test_digest_format_matches_published_construction():
    # sha256 over canonical JSON (sorted keys, no spaces, UTF-8), "sha256:" prefix:
    # the same construction as traceml-ai, so digests interoperate.
    import hashlib

    contract = parse_guard_contract(with_("workload.name", "réseau"))
    canonical = json.dumps(contract, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    digest = contract_digest(contract)
    assert digest == "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert len(digest) == len("sha256:") + 64


def test_digest_of_raw_declaration_equals_digest_of_normalized():
    raw = valid()
    assert contract_digest(raw) == contract_digest(parse_guard_contract(copy.deepcopy(raw)))


# --- YAML 1.1 scalar spelling through load_config on real files --------------


def load_guard(tmp_path, parameters: str, measurement: str = "start_step: 10\n    completed_steps: 50"):
    from traceml_tui.guard.config import load_config

    text = (
        "mode: summary\nhistory_enabled: true\nguard:\n  schema_version: 1\n"
        "  workload:\n    name: w\n    parameters:\n"
        + "".join(f"      {line}\n" for line in parameters.splitlines())
        + f"  measurement:\n    {measurement}\n"
    )
    path = tmp_path / "traceml.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path).guard


def test_yaml_scalar_spelling_decides_type(tmp_path):
    params = load_guard(
        tmp_path,
        'octal: 010\nsexagesimal: 1:30\nsci: 1e-3\ndec: 0.001\nsci_float: 1.0e-3\n'
        'y: yes\nn: no\non_: on\noff_: off\nquoted: "010"\nbatch: 32\nbatch_s: "32"',
    )["workload"]["parameters"]
    assert params["octal"] == 8 and type(params["octal"]) is int
    assert params["sexagesimal"] == 90 and type(params["sexagesimal"]) is int
    assert params["sci"] == "1e-3"
    assert params["dec"] == 0.001 and params["sci_float"] == 0.001
    assert (params["y"], params["n"], params["on_"], params["off_"]) == (True, False, True, False)
    assert params["quoted"] == "010"
    assert params["batch"] == 32 and params["batch_s"] == "32"
    assert list(params) == sorted(params)


def test_yaml_integer_forms_accepted_for_steps(tmp_path):
    contract = load_guard(tmp_path, "model: m", "start_step: 010\n    completed_steps: 1:30")
    assert contract["measurement"] == {"start_step": 8, "completed_steps": 90}


def test_yaml_bool_where_step_required_is_rejected(tmp_path):
    from traceml_tui.guard.config import ConfigError

    with pytest.raises(ConfigError) as info:
        load_guard(tmp_path, "model: m", "start_step: yes\n    completed_steps: 5")
    assert info.value.field == "guard.measurement.start_step"


def test_yaml_null_parameter_rejected(tmp_path):
    from traceml_tui.guard.config import ConfigError

    with pytest.raises(ConfigError) as info:
        load_guard(tmp_path, "model:")
    assert info.value.field == "guard.workload.parameters.model"


def test_yaml_digest_same_for_reordered_files_and_differs_for_quoted_int(tmp_path):
    a = load_guard(tmp_path, "model: resnet50\nbatch: 32")
    b = load_guard(tmp_path, "batch: 32\nmodel: resnet50")
    c = load_guard(tmp_path, 'batch: "32"\nmodel: resnet50')
    assert contract_digest(a) == contract_digest(b)
    assert contract_digest(a) != contract_digest(c)
