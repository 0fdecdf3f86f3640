"""Damaged hygiene side files, traceml.yaml and side-file text: one clear line, never a traceback.

Regression tests for the cases found by fuzzing the readers (docs/security.md, "Fuzzing"):

* R4 — backlog receipts/claims/failures with wrong types or huge numbers: ``traceml validate status`` and the
  index reader (watch's Backlog screen) report the file in one line and keep showing the other files;
* R5 — ``traceml.yaml`` with ``!!timestamp`` or 400-digit numbers: one-line config errors naming the item;
* R6 — a damaged Trackio export cursor (a negative offset included) is refused in one line, nothing overwritten;
* R7 — ``validate status --json`` is valid JSON (no ``Infinity``);
* R8 — a lone surrogate in a side file is reported as what it is, not as "Input data was truncated".

Inputs start from the committed real runs in tests/fixtures/runs; only the damage is written by hand.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.core.rundir import RunDir

from support.cli import run_main

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
BIG = "1" + "0" * 400  # an integer far beyond a double and SQLite's 64-bit range

pytestmark = pytest.mark.timeout(300)


def strict_json(text: str):
    """Parse as any strict JSON parser would: ``Infinity``/``NaN`` are not JSON."""
    def refuse(constant: str):
        raise ValueError(f"invalid JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


def hygiene_copy(tmp_path: Path) -> Path:
    run = tmp_path / "logs" / "hygiene"
    shutil.copytree(FIXTURES / "hygiene", run)
    return run


def validate_status(env: dict, run: Path, *extra: str) -> subprocess.CompletedProcess:
    """`traceml validate status RUN` in this process (support/cli.py)."""
    return run_main(["validate", "status", str(run), *extra], env=env)


# --------------------------------------------------------------------------- R4, R7: the backlog

#: (file, damage) → the words the one error line must hold. Each damage is one R4 case (or a sibling).
BACKLOG_DAMAGE = {
    "metrics-null": ("receipts/step-00000002.json",
                     lambda d: {**d, "metrics": None}, "$.metrics"),
    "metrics-string": ("receipts/step-00000002.json",
                       lambda d: {**d, "metrics": {"mse": "low"}}, "$.metrics"),
    "heartbeat-400-digits": ("claims/step-00000008.json",
                             lambda d: {**d, "heartbeat": int(BIG)}, "$.heartbeat"),
    "failure-attempt-text": ("failures/step-00000004-1.json",
                             lambda d: {**d, "attempt": "one"}, "$.attempt"),
    "request-step-2^63": ("requests/step-00000010.json",
                          lambda d: {**d, "step": 1 << 63}, "$.step"),
    "request-created-negative": ("requests/step-00000010.json",
                                 lambda d: {**d, "created": -5.0}, "$.created"),
}


@pytest.mark.parametrize("case", sorted(BACKLOG_DAMAGE))
def test_validate_status_reports_a_damaged_backlog_file_in_one_line(case, tmp_path, cli_env):
    run = hygiene_copy(tmp_path)
    rel, damage, where = BACKLOG_DAMAGE[case]
    path = run / "validation" / rel
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    clean = validate_status(cli_env, FIXTURES / "hygiene", "--json")
    assert clean.returncode == 0, clean.stderr
    expected = {row["checkpoint"] for row in strict_json(clean.stdout)["requests"]}

    for extra in ((), ("--json",)):
        proc = validate_status(cli_env, run, *extra)
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert f"validation/{rel}" in lines[0] and where in lines[0], lines[0]
    shown = {row["checkpoint"] for row in strict_json(proc.stdout)["requests"]}
    # every other file is still reported: only a damaged request drops out of the list
    assert shown == (expected - {Path(rel).stem} if rel.startswith("requests/") else expected)


def test_a_damaged_failure_record_still_counts_as_a_failed_attempt(tmp_path, cli_env):
    run = hygiene_copy(tmp_path)
    (run / "validation" / "failures" / "step-00000004-1.json").write_bytes(b'{"checkpoint": "step-00000004", ')
    proc = validate_status(cli_env, run, "--json")
    clean = validate_status(cli_env, FIXTURES / "hygiene", "--json")
    assert proc.returncode == 1 and "failures/step-00000004-1.json" in proc.stderr
    row = next(r for r in strict_json(proc.stdout)["requests"] if r["checkpoint"] == "step-00000004")
    was = next(r for r in strict_json(clean.stdout)["requests"] if r["checkpoint"] == "step-00000004")
    # the attempt is never lost: same count and state word as with the intact record
    assert (row["failures"], row["state"]) == (was["failures"], was["state"]) == (1, "failed")


def test_validate_status_json_is_valid_json_for_an_overflowing_metric(tmp_path, cli_env):
    """R7 (validate half): a metric written as 1e999 is no number; --json never prints Infinity."""
    run = hygiene_copy(tmp_path)
    receipt = run / "validation" / "receipts" / "step-00000002.json"
    receipt.write_text(receipt.read_text().replace('"r2": 0.75', '"r2": 1e999'))
    proc = validate_status(cli_env, run, "--json")
    assert "Infinity" not in proc.stdout and "NaN" not in proc.stdout
    status = strict_json(proc.stdout)
    assert proc.returncode == 1 and "receipts/step-00000002.json" in proc.stderr
    assert status["newest_completed"]["checkpoint"] == "step-00000000"  # the damaged receipt is no result


def test_dumps_valid_writes_null_for_non_finite_floats():
    from traceml_tui.core.jsonsafe import dumps_valid

    text = dumps_valid({"a": float("inf"), "b": [float("nan"), 1.5, -float("inf")], "c": {"d": 2}})
    assert strict_json(text) == {"a": None, "b": [None, 1.5, None], "c": {"d": 2}}


def test_the_index_reader_shows_the_other_backlog_files(tmp_path, traceml_cmd, cli_env):
    """R4 (reader half): the Backlog screen's reader skips a damaged file, counts a damaged failure, never raises."""
    from daemon.reader import Reader

    run = hygiene_copy(tmp_path)
    clean_root = tmp_path / "clean"
    shutil.copytree(FIXTURES / "hygiene", clean_root / "hygiene")
    validation = run / "validation"
    (validation / "receipts" / "step-00000002.json").write_text(
        '{"checkpoint":"step-00000002","step":2,"metrics":null,"completed":1.0}')
    claim = validation / "claims" / "step-00000008.json"
    claim.write_text(claim.read_text().replace('"heartbeat": 1796051704.2728488', f'"heartbeat": {BIG}'))
    (validation / "failures" / "step-00000004-1.json").write_text("{not json")
    items, errors = {}, {}
    for name, root in (("damaged", run.parent), ("clean", clean_root)):
        index = tmp_path / f"{name}.sqlite"
        proc = subprocess.run([*traceml_cmd, "daemon", str(root), "--once", "--no-inotify", "--index", str(index)],
                              env=cli_env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        with Reader(index) as reader:
            (summary,) = reader.list_runs()
            items[name] = {i.checkpoint: i for i in reader.backlog.entries(summary.run_id)}
            errors[name] = " | ".join(f"{e.path} {e.message}" for e in reader.events.errors(summary.run_id))
    damaged, clean = items["damaged"], items["clean"]
    # Each damaged file is named in the run's errors (the Run screen's ingest errors), the clean copy has none.
    for rel in ("validation/receipts/step-00000002.json", "validation/claims/step-00000008.json",
                "validation/failures/step-00000004-1.json"):
        assert rel in errors["damaged"], errors["damaged"]
    assert "validation/" not in errors["clean"], errors["clean"]
    assert set(damaged) == set(clean)  # no checkpoint lost, none invented from a damaged file's name
    assert damaged["step-00000002"].state.value != "completed" and damaged["step-00000002"].metrics == ()
    assert damaged["step-00000008"].heartbeat is None and damaged["step-00000008"].owner is None
    assert damaged["step-00000004"].failures == clean["step-00000004"].failures == 1
    for ckpt in ("step-00000000", "step-00000006", "step-00000010"):
        assert damaged[ckpt] == clean[ckpt]


# --------------------------------------------------------------------------- early_stopping.json


def test_a_damaged_early_stopping_state_is_refused_never_reset(tmp_path):
    from traceml_tui.hygiene.backlog import read_early_stopping as read_state
    from traceml_tui.hygiene.early_stopping import EarlyStopping

    run = hygiene_copy(tmp_path)
    stopper = EarlyStopping(run, metric="mse", direction="min", patience=5)
    stopper.update(step=10)
    path = RunDir(run).early_stopping
    state = json.loads(path.read_text())
    assert state["evaluations"] == 2  # a real state, written by the real class
    state["patience_counter"] = int(BIG)
    path.write_text(json.dumps(state))
    before = path.read_bytes()
    errors: list[str] = []
    assert read_state(path, errors) is None
    assert len(errors) == 1 and errors[0].startswith("early_stopping.json: ") and "$.patience_counter" in errors[0]
    with pytest.raises(ValueError, match=r"early_stopping.json: .*move it aside"):
        EarlyStopping(run, metric="mse", direction="min", patience=5)
    assert path.read_bytes() == before  # nothing overwritten


# --------------------------------------------------------------------------- R6: the export cursor


class _Sink:
    """A destination that accepts everything (trackio itself is optional; docs/export.md)."""

    def __init__(self) -> None:
        self.points: list[tuple[dict, int]] = []

    def open(self, **kwargs): pass
    def log(self, points, step): self.points.append((points, step))
    def table(self, *args): pass
    def image(self, *args): pass
    def close(self): pass


CURSOR_DAMAGE = {
    "delivered-int": (lambda c: {**c, "delivered": 5}, "$.delivered"),
    "train_step-list": (lambda c: {**c, "train_step": [1]}, "$.train_step"),
    "files-int": (lambda c: {**c, "files": {"ranks/rank_0/steps-0.jsonl": 5}}, "$.files"),
    "offset-negative": (lambda c: {**c, "files": {k: {**v, "offset": -5} for k, v in c["files"].items()}}, "offset"),
    "offset-2^64": (lambda c: {**c, "files": {k: {**v, "offset": 1 << 64} for k, v in c["files"].items()}}, "offset"),
    "surrogate": (lambda c: {**c, "run_name": "\ud800"}, "surrogate"),
}


@pytest.mark.parametrize("case", sorted(CURSOR_DAMAGE))
def test_a_damaged_export_cursor_is_refused_in_one_line(case, tmp_path):
    from traceml_tui.export import cursor as cm
    from traceml_tui.export import trackio_export as tx

    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "completed", run)
    reg = tx.Registration(project="lane-mgr", group="g", description="d", server_url=None)
    path = cm.cursor_path(run, reg.project)
    tx.export_run(run, reg, _Sink())
    damage, where = CURSOR_DAMAGE[case]
    path.write_text(json.dumps(damage(json.loads(path.read_bytes())), ensure_ascii=True))
    before = path.read_bytes()
    with pytest.raises(ValueError) as caught:
        tx.export_run(run, reg, _Sink())
    message = str(caught.value)
    assert "\n" not in message and path.name in message and where in message, message
    assert path.read_bytes() == before  # nothing overwritten: moving it aside re-exports everything


def test_export_cli_says_one_line_for_a_negative_offset(tmp_path, traceml_cmd, cli_env):
    pytest.importorskip("trackio")
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "completed", run)
    cursor = run / "export" / "trackio-lane-mgr.json"
    cursor.parent.mkdir()
    cursor.write_text(json.dumps({"version": 1, "files": {"ranks/rank_0/steps-0.jsonl": {"head": "x", "offset": -5}}}))
    proc = subprocess.run([*traceml_cmd, "export", "trackio", str(run), "--project", "lane-mgr",
                           "--group", "g", "--description", "a damaged cursor"], env=cli_env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "trackio-lane-mgr.json is damaged" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- R5: traceml.yaml

CONFIG_DAMAGE = {
    "mode: !!timestamp nope\n": "mode: the YAML tag !!timestamp",
    "logs_dir: !!binary aGVsbG8=\n": "logs_dir: the YAML tag !!binary",
    "mode: !!set {a, b}\n": "mode: the YAML tag !!set",
    f"finalize_timeout_sec: {BIG}\n": "finalize_timeout_sec: must be a finite number",
    f"history_retention: {BIG}\n": "history_retention: must be a finite positive duration",
    f"interval: {BIG}\n": "interval: must be a finite number",
    "history_retention: 1.0e+400\n": "history_retention: must be a finite positive duration",
    "mode: 2024-01-01\n": "mode: must be one of",
    "{1: 2}\n": "setting names must be strings",
    "mode: " + "[" * 5000 + "\n": "traceml.yaml: invalid YAML",
}

HYGIENE_DAMAGE = {
    ("lease_s: 30", f"lease_s: {BIG}"): "hygiene.validation.lease_s: must be a finite number",
    ("lease_s: 30", "lease_s: 1.0e+300"): "hygiene.validation.lease_s: must be a finite number",
    ("cadence: 100", f"cadence: {BIG}"): "cadence: must fit in a signed 64-bit integer",
    ("lease_s: 30", "lease_s: !!timestamp 2024-01-01"): "hygiene.validation.lease_s: the YAML tag !!timestamp",
}


def _run_with_config(tmp_path: Path, text: str, env: dict) -> subprocess.CompletedProcess:
    """`traceml run s.py` under ``text`` as traceml.yaml, in this process (refused before any rank starts)."""
    (tmp_path / "traceml.yaml").write_text(text)
    (tmp_path / "s.py").write_text("print(1)\n")
    return run_main(["run", "s.py", "--run-name", "t"], cwd=tmp_path, env=env)


@pytest.mark.parametrize("text", sorted(CONFIG_DAMAGE))
def test_traceml_yaml_damage_is_a_one_line_config_error(text, tmp_path, cli_env):
    from traceml_tui.guard.config import ConfigError, load_config

    (tmp_path / "traceml.yaml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "traceml.yaml")
    assert CONFIG_DAMAGE[text] in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("edit", sorted(HYGIENE_DAMAGE))
def test_hygiene_block_damage_is_a_one_line_config_error(edit, tmp_path, cli_env):
    example = (Path(__file__).parents[1] / "examples" / "hygiene" / "traceml.yaml").read_text()
    assert edit[0] in example
    proc = _run_with_config(tmp_path, example.replace(edit[0], edit[1], 1), cli_env)
    assert proc.returncode == 1, proc.stderr  # the exit of every traceml.yaml error (docs/run.md)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "traceml.yaml" in proc.stderr and HYGIENE_DAMAGE[edit] in proc.stderr


def test_traceml_run_exits_like_other_config_errors_on_a_yaml_tag(tmp_path, cli_env):
    ordinary = _run_with_config(tmp_path, "mode: nope\n", cli_env)
    tagged = _run_with_config(tmp_path, "mode: !!timestamp nope\n", cli_env)
    assert tagged.returncode == ordinary.returncode != 0
    assert "Traceback" not in tagged.stderr and len(tagged.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "logs").exists()  # nothing started


def test_an_unquoted_date_stays_text():
    import yaml

    from traceml_tui.guard.config import _Loader

    assert yaml.load("when: 2024-01-01\n", Loader=_Loader) == {"when": "2024-01-01"}  # noqa: S506


# --------------------------------------------------------------------------- R8: surrogates


def test_a_lone_surrogate_in_a_side_file_is_named(tmp_path, traceml_cmd, cli_env):
    """R8: the daemon's error row says what the bytes are, not msgspec's "Input data was truncated"."""
    root = tmp_path / "logs"
    shutil.copytree(FIXTURES / "completed", root / "good")
    shutil.copytree(FIXTURES / "completed", root / "bad")
    (root / "bad" / "manifest.json").write_bytes(b'{"run_name":"\\ud800"}\n')
    index = tmp_path / "idx.sqlite"
    proc = subprocess.run([*traceml_cmd, "daemon", str(root), "--once", "--no-inotify", "--index", str(index)],
                          env=cli_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(index) as conn:
        messages = [m for (p, m) in conn.execute("SELECT path, message FROM errors") if p == "manifest.json"]
    assert messages and all("unpaired UTF-16 surrogate escape \\ud800" in m for m in messages), messages
    assert not any("truncated" in m for m in messages)


@pytest.mark.parametrize("data", [b'{"a": "\\ud800"}', b'{"a": "\\udc00"}', b'{"a": "\\ud800\\u0041"}',
                                  b'{"a": "x\\ud83d"}'])
def test_readers_name_an_unpaired_surrogate(data):
    import msgspec

    from traceml_tui.core import jsonsafe

    with pytest.raises(msgspec.DecodeError, match="unpaired UTF-16 surrogate"):
        jsonsafe.decode_bounded(data)
    with pytest.raises(ValueError, match="unpaired UTF-16 surrogate"):
        jsonsafe.loads_bounded(data)


def test_paired_and_escaped_backslashes_are_not_surrogates():
    from traceml_tui.core import jsonsafe

    assert jsonsafe.loads_bounded(b'{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}') == {"a": "\U0001F600", "b": "\\ud800"}
    assert jsonsafe.unpaired_surrogate(b'{"b": "\\\\ud800"}') is None


def test_loads_bounded_refuses_utf8_encoded_surrogates():
    """json.loads would decode these bytes with "surrogatepass" and return text that cannot be printed."""
    from traceml_tui.core import jsonsafe

    with pytest.raises(UnicodeDecodeError):
        jsonsafe.loads_bounded(b'{"a": "\xed\xa0\x80"}')
    assert sys.getdefaultencoding() == "utf-8"


# --------------------------------------------------------------------------- leases a claim may record


def test_a_manifest_lease_beyond_bounds_falls_back_on_the_default(tmp_path, cli_env):
    """An edited manifest's 400-digit lease is no lease: the default applies (a claim must stay decodable)."""
    from traceml_tui.core.state import DEFAULT_LEASE_S
    from traceml_tui.hygiene.backlog import declared_validation

    run = hygiene_copy(tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["hygiene"]["validation"]["lease_s"] = int(BIG)
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert declared_validation(run)["lease_s"] == DEFAULT_LEASE_S
    proc = validate_status(cli_env, run, "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_drain_refuses_a_lease_no_claim_may_record(tmp_path, traceml_cmd, cli_env):
    run = hygiene_copy(tmp_path)
    before = sorted(p.name for p in (run / "validation" / "claims").iterdir())
    proc = subprocess.run([*traceml_cmd, "validate", "drain", str(run), "--lease", "1e12", "--", "true", "{checkpoint}"],
                          env=cli_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--lease" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in (run / "validation" / "claims").iterdir()) == before  # nothing claimed
