"""The arrows between packages point one way (docs/contracts.md, "arrows").

`lint-imports` (run by CI) holds the contracts in pyproject.toml; this test runs it too, and checks that the
contracts over the middle floors are there, so deleting one fails here as surely as breaking it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _contracts() -> dict[str, dict]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (3.10 still runs lint-imports below)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {c["name"]: c for c in config["tool"]["importlinter"]["contracts"]}


def test_the_middle_floors_are_a_layers_contract():
    """run > summary | export > hygiene | compare > guard > core, with the SDK and the screens held too."""
    contracts = _contracts()
    layers = [c for c in contracts.values() if c["type"] == "layers" and "traceml_tui.core" in c["layers"]]
    assert len(layers) == 1, sorted(contracts)
    floors = [{part.strip() for part in layer.split("|")} for layer in layers[0]["layers"]]
    assert floors == [
        {"traceml_tui.run"},
        {"traceml_tui.summary", "traceml_tui.export"},
        {"traceml_tui.hygiene", "traceml_tui.compare"},
        {"traceml_tui.guard"},
        {"traceml_tui.core"},
    ]
    assert not layers[0].get("ignore_imports")  # no arrow is let through the floors
    forbidden = {(tuple(c["source_modules"]), tuple(c["forbidden_modules"]))
                 for c in contracts.values() if c["type"] == "forbidden"}
    assert (("traceml_tui.sdk",), ("traceml_tui.run",)) in forbidden
    assert (("traceml_tui.tui.screens", "traceml_tui.tui.widgets"), ("traceml_tui.tui.app",)) in forbidden


def test_lint_imports_keeps_every_contract():
    """Every contract holds on this tree: no circle, no import running back up the floors."""
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([exe, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    kept = proc.stdout.count(" KEPT")
    assert kept == len(_contracts()), proc.stdout[-4000:]


def test_the_moved_helpers_live_below_their_users():
    """The parent-death helper is in core; the validate command (not hygiene) refreshes an ended run's summary."""
    code = (
        "import sys, traceml_tui.hygiene.drain, traceml_tui.hygiene.finalize, traceml_tui.core.lifeline;"
        "bad = sorted(m for m in sys.modules if m.startswith(('traceml_tui.run', 'traceml_tui.summary')));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
