"""traceml.yaml discovery and validation on real files."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from traceml_tui.guard.config import (
    DEFAULT_HISTORY_RETENTION_S,
    ConfigError,
    TracemlConfig,
    check_trace_max_steps,
    find_config,
    load_config,
)
from traceml_tui.guard.contract import parse_guard_contract

GUARD = """\
mode: summary
history_enabled: true

guard:
  schema_version: 1
  workload:
    name: resnet50-imagenet-training
    parameters:
      model: resnet50
      data_version: imagenet-1k-v1
      precision: bf16
      per_rank_batch_size: 32
  measurement:
    start_step: 10
    completed_steps: 50
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# --- discovery ---------------------------------------------------------------


def test_find_config_in_start_directory(tmp_path):
    cfg = write(tmp_path / "traceml.yaml", "mode: summary\n")
    assert find_config(tmp_path) == cfg


def test_find_config_walks_up_to_nearest_parent(tmp_path):
    outer = write(tmp_path / "traceml.yaml", "mode: summary\n")
    inner = write(tmp_path / "proj" / "traceml.yaml", "mode: cli\n")
    deep = tmp_path / "proj" / "src" / "pkg"
    deep.mkdir(parents=True)
    assert find_config(deep) == inner
    os.unlink(inner)
    assert find_config(deep) == outer


def test_find_config_none_when_absent(tmp_path):
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    found = find_config(deep)
    # Nothing under tmp_path; anything found must lie above it (e.g. a stray /tmp file).
    assert found is None or tmp_path not in found.parents


@pytest.mark.parametrize("kind", ["directory", "dangling-link", "fifo"])
def test_find_config_stops_at_the_first_entry_whatever_it_is(tmp_path, kind):
    inner = tmp_path / "proj" / "traceml.yaml"
    make_entry(inner, kind)
    write(tmp_path / "traceml.yaml", "mode: summary\n")
    assert find_config(tmp_path / "proj") == inner


def make_entry(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "directory":
        path.mkdir()
    elif kind == "dangling-link":
        path.symlink_to(path.parent / "no-such-target")
    elif kind == "fifo":
        os.mkfifo(path)


@pytest.mark.parametrize(("kind", "why"), [("directory", "a directory, not a regular file"),
                                           ("dangling-link", "a symbolic link to a missing target"),
                                           ("fifo", "a FIFO, not a regular file")])
def test_unusable_config_in_launch_dir_is_refused_not_skipped(tmp_path, traceml_cmd, cli_env, kind, why):
    """QA: such an entry was skipped and the parent's traceml.yaml (here a guard) silently applied."""
    write(tmp_path / "traceml.yaml", GUARD)
    launch = tmp_path / "cfg"
    make_entry(launch / "traceml.yaml", kind)
    (launch / "train.py").write_text("open('SCRIPT_RAN', 'w').write('yes')\n")
    # A FIFO opened for reading would block until a writer came: the timeout catches that regression.
    proc = subprocess.run([*traceml_cmd, "run", "train.py", "--run-name", "x"], cwd=launch, env=cli_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [f"traceml run: {launch / 'traceml.yaml'}: cannot read file: {why}"]
    assert sorted(p.name for p in launch.iterdir()) == ["traceml.yaml", "train.py"]  # no logs/, the script never ran
    assert not (tmp_path / "logs").exists()


# --- loading -----------------------------------------------------------------


def test_defaults_without_a_file():
    cfg = load_config(None)
    assert cfg == TracemlConfig()
    assert cfg.mode == "summary" and cfg.history_enabled is True
    assert cfg.history_retention == DEFAULT_HISTORY_RETENTION_S
    assert cfg.guard is None and cfg.hygiene is None and cfg.path is None


def test_empty_file_gives_defaults(tmp_path):
    cfg = load_config(write(tmp_path / "traceml.yaml", ""))
    assert cfg.guard is None and cfg.mode == "summary" and cfg.path == tmp_path / "traceml.yaml"


def test_seed_example_loads_normalized_guard(tmp_path):
    cfg = load_config(write(tmp_path / "traceml.yaml", GUARD))
    assert cfg.guard == {
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
    assert cfg.guard == parse_guard_contract(cfg.guard)


@pytest.mark.parametrize(
    ("spelling", "seconds"),
    [("1800", 1800), ("90", 90), ("30s", 30), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1.5", 2), ('"45"', 45)],
)
def test_history_retention_is_seconds(tmp_path, spelling, seconds):
    cfg = load_config(write(tmp_path / "traceml.yaml", f"history_retention: {spelling}\n"))
    assert cfg.history_retention == seconds


def test_hygiene_mapping_is_passed_through(tmp_path):
    cfg = load_config(write(tmp_path / "traceml.yaml", "hygiene:\n  early_stopping:\n    patience: 3\n"))
    assert cfg.hygiene == {"early_stopping": {"patience": 3}}


def test_reference_settings_are_accepted(tmp_path):
    cfg = load_config(
        write(
            tmp_path / "traceml.yaml",
            """\
            logs_dir: ./runs
            finalize_timeout_sec: 60
            interval: 2.0
            enable_logging: false
            dashboard_port: 8765
            dashboard_auto_open: false
            """,
        )
    )
    assert cfg.logs_dir == "./runs"
    assert cfg.finalize_timeout_sec == 60.0


# --- errors: one line naming the file and the field --------------------------


def assert_config_error(path: Path, field: str | None, *needles: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    message = str(err)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert err.field == field
    if field:
        assert f": {field}: " in message
    for needle in needles:
        assert needle in message
    return err


def test_unreadable_file(tmp_path):
    path = tmp_path / "traceml.yaml"
    assert_config_error(path, None, "cannot read")  # missing
    path.mkdir()
    assert_config_error(path, None, "cannot read file: a directory")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_unreadable_permissions(tmp_path):
    path = write(tmp_path / "traceml.yaml", "mode: summary\n")
    path.chmod(0)
    try:
        assert_config_error(path, None, "cannot read")
    finally:
        path.chmod(0o644)


def test_not_utf8(tmp_path):
    path = tmp_path / "traceml.yaml"
    path.write_bytes(b"mode: \xff\xfe\n")
    assert_config_error(path, None, "UTF-8")


def test_invalid_yaml_reports_line(tmp_path):
    path = write(tmp_path / "traceml.yaml", "mode: summary\nguard:\n  workload: [unclosed\n  other: 1\n")
    err = assert_config_error(path, None, "invalid YAML", "line ")
    assert "line 4" in str(err) or "line 3" in str(err)


def test_invalid_yaml_tab_indentation(tmp_path):
    path = write(tmp_path / "traceml.yaml", "guard:\n\tschema_version: 1\n")
    assert_config_error(path, None, "invalid YAML", "line 2")


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_not_a_mapping(tmp_path, text):
    assert_config_error(write(tmp_path / "traceml.yaml", text), None, "top level must be a mapping")


def test_unknown_top_level_key(tmp_path):
    assert_config_error(write(tmp_path / "traceml.yaml", "mode: summary\ngaurd: {}\n"), "gaurd", "unknown setting")


def test_non_string_top_level_key(tmp_path):
    assert_config_error(write(tmp_path / "traceml.yaml", "1: x\n"), None, "must be strings")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("mode: 3\n", "mode"),
        ("mode: fancy\n", "mode"),
        ("history_enabled: maybe\n", "history_enabled"),
        ("history_enabled: 2\n", "history_enabled"),
        ("history_retention: yes\n", "history_retention"),
        ("history_retention: 0\n", "history_retention"),
        ("history_retention: -5\n", "history_retention"),
        ("history_retention: 10 minutes\n", "history_retention"),
        ("history_retention: .inf\n", "history_retention"),
        ("history_retention: [1]\n", "history_retention"),
        ("hygiene: [a]\n", "hygiene"),
        ("hygiene: null\n", "hygiene"),
        ("logs_dir: 5\n", "logs_dir"),
        ("finalize_timeout_sec: 0\n", "finalize_timeout_sec"),
        ("finalize_timeout_sec: soon\n", "finalize_timeout_sec"),
        ("interval: true\n", "interval"),
        ("dashboard_port: 70000\n", "dashboard_port"),
        ("enable_logging: sometimes\n", "enable_logging"),
    ],
)
def test_bad_types(tmp_path, text, field):
    assert_config_error(write(tmp_path / "traceml.yaml", text), field)


def test_guard_error_keeps_contract_field_path(tmp_path):
    text = GUARD.replace("name: resnet50-imagenet-training", 'name: " resnet50"')
    err = assert_config_error(write(tmp_path / "traceml.yaml", text), "guard.workload.name", "surrounding whitespace")
    assert str(err) == f"{tmp_path / 'traceml.yaml'}: guard.workload.name: must not have surrounding whitespace"


def test_guard_parameter_list_rejected(tmp_path):
    text = GUARD.replace("precision: bf16", "precision: [bf16, fp32]")
    assert_config_error(write(tmp_path / "traceml.yaml", text), "guard.workload.parameters.precision")


def test_guard_requires_history(tmp_path):
    text = GUARD.replace("history_enabled: true", "history_enabled: false")
    assert_config_error(write(tmp_path / "traceml.yaml", text), "history_enabled", "guard")


def test_guard_requires_summary_mode(tmp_path):
    text = GUARD.replace("mode: summary", "mode: cli")
    assert_config_error(write(tmp_path / "traceml.yaml", text), "mode", "summary")


def test_guard_null_is_rejected(tmp_path):
    assert_config_error(write(tmp_path / "traceml.yaml", "guard:\n"), "guard", "mapping")


def test_duplicate_key_inside_guard_is_rejected(tmp_path):
    text = GUARD.replace("      precision: bf16\n", "      precision: bf16\n      precision: fp32\n")
    assert_config_error(write(tmp_path / "traceml.yaml", text), "guard.workload.parameters.precision", "duplicate")


def test_recursive_alias_is_refused(tmp_path):
    path = write(tmp_path / "traceml.yaml", "hygiene: &a\n  self: *a\n")
    assert_config_error(path, None, "line 2", "aliases (*a) are not allowed")


# --- hostile files: refused at once, one short line ----------------------------


def alias_bomb(levels: int = 8, width: int = 9) -> str:
    """A flow sequence of a few hundred bytes whose nested aliases expand to width**levels strings."""
    names = "abcdefghijklmnop"[:levels]
    items = ["&a [" + ", ".join(['"lol"'] * width) + "]"]
    items += [f"&{name} [" + ", ".join([f"*{prev}"] * width) + "]" for prev, name in zip(names, names[1:])]
    return "[" + ", ".join(items) + "]"


HYGIENE_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hygiene" / "traceml.yaml"


@pytest.mark.faults
@pytest.mark.parametrize("where", ["dashboard_port", "hygiene.curve.cadence", "hygiene.early_stopping.direction"])
def test_alias_bomb_is_refused_with_one_line(tmp_path, traceml_cmd, cli_env, where):
    """Item 3: a YAML alias bomb is refused at once in one line; the script never starts."""
    import yaml

    config = yaml.safe_load(HYGIENE_EXAMPLE.read_text())
    node = config
    *parents, leaf = where.split(".")
    for key in parents:
        node = node[key]
    node[leaf] = "BOMB"
    text = yaml.safe_dump(config).replace("BOMB", alias_bomb())
    assert len(alias_bomb()) < 420
    (tmp_path / "traceml.yaml").write_text(text)
    (tmp_path / "train.py").write_text("open('SCRIPT_RAN', 'w').write('yes')\n")
    # Before: ~20-40 s of expansion, then a MemoryError traceback. The timeout only keeps a
    # regression from hanging the suite; the assertion is the refusal.
    proc = subprocess.run([*traceml_cmd, "run", "train.py", "--run-name", "bomb"], cwd=tmp_path, env=cli_env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "aliases" in lines[0] and "not allowed" in lines[0], lines[-3:]
    assert not (tmp_path / "SCRIPT_RAN").exists() and not (tmp_path / "logs").exists()


def test_merge_keys_are_aliases_too(tmp_path):
    path = write(tmp_path / "traceml.yaml", "hygiene:\n  base: &b {cadence: 1}\n  curve:\n    <<: *b\n")
    assert_config_error(path, None, "aliases (*b) are not allowed")


def test_anchors_without_aliases_are_fine(tmp_path):
    cfg = load_config(write(tmp_path / "traceml.yaml", "logs_dir: &where ./runs\n"))
    assert cfg.logs_dir == "./runs"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("mode: " + "x" * 100_000 + "\n", "mode"),
        ("dashboard_port: [" + ", ".join(["123456789"] * 20_000) + "]\n", "dashboard_port"),
        ("history_retention: '" + "9" * 50_000 + "x'\n", "history_retention"),
        ("dashboard_port: " + "9" * 5_000 + "\n", None),  # beyond Python's int digit limit
        ("x" * 1_000 + ": 1\n", "x" * 79 + "…"),  # an unknown key: named in the field, capped too
    ],
    ids=["long-string", "long-list", "long-duration", "huge-integer", "long-key"],
)
def test_quoted_values_are_capped(tmp_path, text, field):
    err = assert_config_error(write(tmp_path / "traceml.yaml", text), field)
    assert len(err.rule) < 200, err.rule
    assert len(str(err)) < len(str(err.path)) + 300


@pytest.mark.parametrize(
    ("item", "value"),
    [("early_stopping.direction", "y" * 100_000), ("curve.cadence", list(range(50_000))),
     ("qc.collapse_factor", {"k" * 1000: 1}), ("validation.cadence", -(10**4000))],
    ids=["long-string", "long-list", "long-mapping", "huge-integer"],
)
def test_hygiene_errors_quote_values_capped(item, value):
    import yaml

    from traceml_tui.hygiene.config import HygieneConfigError, parse_hygiene

    hygiene = yaml.safe_load(HYGIENE_EXAMPLE.read_text())["hygiene"]
    section, key = item.split(".")
    hygiene[section][key] = value
    with pytest.raises(HygieneConfigError) as info:
        parse_hygiene(hygiene)
    message = str(info.value)
    assert message.startswith(f"hygiene.{item}: ") and "\n" not in message
    assert len(info.value.problem) < 200, message


# --- --trace-max-steps -------------------------------------------------------


def test_trace_max_steps_must_cover_declared_range():
    contract = parse_guard_contract(
        {"schema_version": 1, "workload": {"name": "w"}, "measurement": {"start_step": 10, "completed_steps": 50}}
    )
    check_trace_max_steps(contract, None)
    check_trace_max_steps(contract, 59)
    check_trace_max_steps(contract, 1000)
    with pytest.raises(ConfigError) as info:
        check_trace_max_steps(contract, 58)
    message = str(info.value)
    assert message.startswith("--trace-max-steps: ")
    assert "10-59" in message and "59" in message
    with pytest.raises(ConfigError):
        check_trace_max_steps(contract, 0)


def test_guard_modules_import_neither_textual_nor_torch():
    import subprocess
    import sys

    code = (
        "import sys, traceml_tui.guard.contract, traceml_tui.guard.config, traceml_tui.guard.outcome\n"
        "print(sorted(m for m in ('textual', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_duplicate_key_with_control_character_stays_one_line(tmp_path):
    path = tmp_path / "traceml.yaml"
    path.write_text('hygiene:\n  "a\\u0007": 1\n  "a\\u0007": 2\n', encoding="utf-8")
    err = assert_config_error(path, "hygiene.'a\\x07'", "duplicate")
    assert "\x07" not in str(err)
