"""`traceml run` refuses bad input before anything starts: one line, non-zero exit, nothing touched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from traceml_tui.run import cli as run_cli

MARKER_SCRIPT = """
from pathlib import Path
Path("SCRIPT_RAN").write_text("yes")
"""

GOOD_GUARD = {
    "schema_version": 1,
    "workload": {"name": "w", "parameters": {"model": "m"}},
    "measurement": {"start_step": 1, "completed_steps": 5},
}


@pytest.fixture
def launch_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(MARKER_SCRIPT)
    return tmp_path


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], launch_dir: Path) -> str:
    rc = run_cli.main(argv)
    err = capsys.readouterr().err
    assert rc != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert not (launch_dir / "SCRIPT_RAN").exists(), "the training script must not start"
    return lines[0]


def _invalid_declarations() -> list[tuple[str, object, str]]:
    from test_guard_contract import INVALID  # the contract's own table of rule violations

    cases = []
    for case_id, raw, field in INVALID:
        text = yaml.safe_dump({"mode": "summary", "history_enabled": True, "guard": raw}, allow_unicode=False)
        if yaml.safe_load(text) == {"mode": "summary", "history_enabled": True, "guard": raw}:
            cases.append((case_id, text, field))
    return cases


INVALID_YAML = _invalid_declarations()


def test_at_least_forty_invalid_declarations_reach_the_launcher():
    assert len(INVALID_YAML) >= 40


@pytest.mark.parametrize(("text", "field"), [(t, f) for _, t, f in INVALID_YAML], ids=[i for i, _, _ in INVALID_YAML])
def test_invalid_guard_declaration_refused_before_launch(launch_dir, capsys, text, field):
    (launch_dir / "traceml.yaml").write_text(text)
    line = _refused(capsys, ["train.py", "--run-name", "r1"], launch_dir)
    assert field in line
    assert not (launch_dir / "logs").exists(), "no run directory may be created"


def test_declaration_found_in_a_parent_directory(tmp_path, monkeypatch, capsys):
    bad = dict(GOOD_GUARD, schema_version=2)
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump({"guard": bad}))
    sub = tmp_path / "project" / "sub"
    sub.mkdir(parents=True)
    (sub / "train.py").write_text(MARKER_SCRIPT)
    monkeypatch.chdir(sub)
    line = _refused(capsys, ["train.py"], sub)
    assert "guard.schema_version" in line


@pytest.mark.parametrize(
    ("setup", "argv", "expect"),
    [
        ("", ["missing.py"], "training script not found"),
        ("", ["train.py", "--nproc-per-node", "0"], "--nproc-per-node"),
        ("", ["train.py", "--nnodes", "2", "--node-rank", "2", "--master-port", "29999", "--run-name", "x"], "--node-rank"),
        ("", ["train.py", "--nnodes", "0"], "--nnodes"),
        ("", ["train.py", "--run-name", "../escape"], "--run-name"),
        ("", ["train.py", "--run-name", "foo\n"], "--run-name"),  # "$" would match before the newline
        ("", ["train.py", "--run-name", ".hidden"], "--run-name"),
        ("", ["train.py", "--run-name", "a/b"], "--run-name"),
        ("", ["train.py", "--trace-max-steps", "0"], "--trace-max-steps"),
        ("guard", ["train.py", "--trace-max-steps", "3"], "--trace-max-steps"),
        ("invalid-yaml", ["train.py"], "traceml.yaml"),
        ("binary-yaml", ["train.py"], "traceml.yaml"),
        ("list-yaml", ["train.py"], "traceml.yaml"),
        ("logs-is-file", ["train.py", "--logs-dir", "afile"], "not writable"),
    ],
)
def test_bad_input_is_one_line_and_nothing_starts(launch_dir, capsys, setup, argv, expect):
    if setup == "guard":
        (launch_dir / "traceml.yaml").write_text(yaml.safe_dump({"guard": GOOD_GUARD}))
    elif setup == "invalid-yaml":
        (launch_dir / "traceml.yaml").write_text("guard: [unclosed\n  x: 1\n")
    elif setup == "binary-yaml":
        (launch_dir / "traceml.yaml").write_bytes(b"\xff\xfe\x00garbage\x00")
    elif setup == "list-yaml":
        (launch_dir / "traceml.yaml").write_text("- a\n- b\n")
    (launch_dir / "afile").write_text("not a folder")
    line = _refused(capsys, argv, launch_dir)
    assert expect in line
    assert (launch_dir / "afile").read_text() == "not a folder"


def test_existing_manifest_refused_and_untouched(launch_dir, capsys):
    (launch_dir / "traceml.yaml").write_text(yaml.safe_dump({"guard": GOOD_GUARD}))
    run_dir = launch_dir / "logs" / "taken"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text('{"old": true}\n')
    line = _refused(capsys, ["train.py", "--run-name", "taken"], launch_dir)
    assert "already exists" in line
    assert (run_dir / "manifest.json").read_text() == '{"old": true}\n'
    assert sorted(p.name for p in run_dir.iterdir()) == ["manifest.json"]


def test_usage_errors_exit_2_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "traceml_tui", "run", "--no-such-flag"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_launcher_does_not_import_textual_or_torch(tmp_path):
    code = (
        "import sys; from traceml_tui.run import cli, launch; import traceml_tui.summary.build; "
        "import traceml_tui.run.sampler; "
        "bad = [m for m in ('textual', 'torch') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
