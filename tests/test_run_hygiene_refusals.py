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
