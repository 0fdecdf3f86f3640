"""The field-collapse factor is predeclared in traceml.yaml (`hygiene.qc.collapse_factor`) and used by the SDK."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from traceml_tui.core import records
from traceml_tui.hygiene.config import HygieneConfigError, parse_hygiene

REPO = Path(__file__).resolve().parents[1]
HYGIENE = yaml.safe_load((REPO / "examples" / "hygiene" / "traceml.yaml").read_text())["hygiene"]


def test_declared_factor_is_validated_and_kept() -> None:
    block = copy.deepcopy(HYGIENE)
    block["qc"]["collapse_factor"] = 0.25
    assert parse_hygiene(block)["qc"]["collapse_factor"] == 0.25
    for bad in (0, 1, 1.5, -0.1, True, "0.2"):
        block["qc"]["collapse_factor"] = bad
        with pytest.raises(HygieneConfigError) as err:
            parse_hygiene(block)
        assert str(err.value).startswith("hygiene.qc.collapse_factor:")


@pytest.mark.parametrize(
    "manifest,declared",
    [
        ({"run_name": "run"}, 0.5),
        # a manifest with a wrong-typed field is no manifest at all (core.artifacts.decode_manifest): the default applies
        ({"run_name": "run", "attempts": "two"}, 0.1),
        ({}, 0.1),  # no run_name: not a manifest
    ],
)
def test_sdk_uses_the_declared_factor(tmp_path: Path, manifest: dict, declared: float) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    manifest = {**manifest, "hygiene": {"qc": {"cadence": 1, "collapse_factor": 0.5}}}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    script = tmp_path / "qc.py"
    script.write_text(
        "import numpy as np\nimport traceml_tui as traceml\ntraceml.init()\n"
        "traceml.log_field_stats('z', np.linspace(0, 1, 100), step=0)\n"
        "traceml.log_field_stats('w', np.linspace(0, 1, 100), step=0, collapse_factor=0.2)\n"
    )
    env = dict(os.environ, TRACEML_RUN_DIR=str(run_dir), TRACEML_RUN_NAME="run")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = (run_dir / "ranks/rank_0/steps-0.jsonl").read_bytes().splitlines()
    factors = {r.name: r.factor for r in map(records.decode, lines) if isinstance(r, records.FieldStats)}
    assert factors == {"z": declared, "w": 0.2}
