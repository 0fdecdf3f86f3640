"""`traceml run` refuses a `hygiene:` block missing a required item before any rank starts (seed 004)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from traceml_tui.run import cli as run_cli

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = yaml.safe_load((REPO / "examples" / "hygiene" / "traceml.yaml").read_text())

REQUIRED = [
    "history", "history.schema", "history.output",
    "curve", "curve.cadence",
    "validation", "validation.recipe", "validation.cadence", "validation.first_evaluation", "validation.worker",
    "early_stopping", "early_stopping.metric", "early_stopping.direction", "early_stopping.min_delta",
    "early_stopping.patience", "early_stopping.max_budget",
    "qc", "qc.cadence",
]


@pytest.mark.parametrize("item", REQUIRED)
def test_missing_hygiene_item_refuses_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, item: str) -> None:
    config = copy.deepcopy(EXAMPLE)
    node = config["hygiene"]
    *parents, leaf = item.split(".")
    for key in parents:
        node = node[key]
    del node[leaf]
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "train.py").write_text("open('SCRIPT_RAN', 'w').write('yes')\n")
    monkeypatch.chdir(tmp_path)
    rc = run_cli.main(["train.py", "--run-name", "h"])
    err = capsys.readouterr().err.strip()
    assert rc != 0
    # said like a guard block's error: the file read, the field, the rule
    assert err == f"traceml run: {(tmp_path / 'traceml.yaml').resolve()}: hygiene.{item}: required", err
    assert not (tmp_path / "SCRIPT_RAN").exists()
    assert not (tmp_path / "logs").exists()


def test_effective_hygiene_config_is_recorded_in_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump(EXAMPLE))
    (tmp_path / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli.main(["train.py", "--run-name", "h"]) == 0
    manifest = json.loads((tmp_path / "logs" / "h" / "manifest.json").read_text())
    assert manifest["hygiene"]["validation"]["recipe"] == "regression-holdout-v1"
    assert manifest["hygiene"]["early_stopping"]["patience"] == 3


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("item,value,said", [
    ("validation.recipe", "regression-holdout-v2",
     "hygiene.validation.recipe: 'regression-holdout-v1' -> 'regression-holdout-v2'"),
    ("early_stopping.patience", 5, "hygiene.early_stopping.patience: 3 -> 5"),
])
def test_resume_with_an_edited_hygiene_block_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys,
                                                        item: str, value, said: str) -> None:
    """docs/hygiene.md: a changed policy on resume is refused — before anything starts, nothing written."""
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump(EXAMPLE))
    (tmp_path / "train.py").write_text("open('SCRIPT_RAN', 'a').write('x')\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli.main(["train.py", "--run-name", "h"]) == 0
    edited = copy.deepcopy(EXAMPLE)
    section, key = item.split(".")
    edited["hygiene"][section][key] = value
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump(edited))
    run_dir = tmp_path / "logs" / "h"
    before = _tree(run_dir)
    capsys.readouterr()
    rc = run_cli.main(["train.py", "--run-name", "h", "--resume"])
    err = capsys.readouterr().err
    assert rc == run_cli.EXIT_REFUSED
    assert err == (f"traceml run: --resume: traceml.yaml changed the run's recorded hygiene policy ({said}); "
                   "restore it or choose a fresh --run-name\n"), err
    assert _tree(run_dir) == before  # the manifest, summary and every other file as they were
    assert (tmp_path / "SCRIPT_RAN").read_text() == "x"  # training did not start again


def test_resume_runs_on_the_recorded_hygiene_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same policy written another way resumes, and the launcher then holds the recorded block itself."""
    from traceml_tui.run.launch import Launcher

    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump(EXAMPLE))
    (tmp_path / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli.main(["train.py", "--run-name", "h"]) == 0
    recorded = json.loads((tmp_path / "logs" / "h" / "manifest.json").read_text())["hygiene"]
    same = copy.deepcopy(EXAMPLE)
    same["hygiene"]["validation"]["worker"] = " ".join(EXAMPLE["hygiene"]["validation"]["worker"])  # a string
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump(same))
    from traceml_tui.guard.config import find_config, load_config
    from traceml_tui.hygiene.config import parse_hygiene

    config = load_config(find_config(tmp_path))
    current = parse_hygiene(config.hygiene)
    launcher = Launcher(run_cli.parse_options(["train.py", "--run-name", "h", "--resume"]), config, current)
    launcher.prepare()
    try:
        assert launcher.hygiene is not current and launcher.hygiene == recorded
        assert launcher.manifest.attempts == 2
    finally:
        launcher.lease.finish()  # prepared, never run: its lease would beat on after the test
