"""`traceml export trackio --check` (seed 004): before launch, the run's folder and planned metrics are mapped.

The plan is the example's real `hygiene:` block (examples/hygiene/traceml.yaml),
checked from the traceml.yaml before launch and from the manifest a real
`traceml run` records; the folder check asks a real local Trackio store.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from support.cli import run_main
from support.lanes import needs

pytestmark = needs("trackio", "trackio not installed: pip install 'trackio==0.43.0' (the [trackio] extra)")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = yaml.safe_load((REPO / "examples" / "hygiene" / "traceml.yaml").read_text())
PROJECT = "vanguard-hal"
REG = ["--project", PROJECT, "--group", "ablations", "--description", "Does the scale-free loss fall? reference run"]
PLANNED = ["grad_norm/train", "loss/train", "lr/train", "mse/eval", "mse/train", "mse_ratio/eval", "mse_ratio/train",
           "r2/eval", "r2/train"]


@pytest.fixture
def env(cli_env: dict, tmp_path: Path) -> dict:
    cli_env["TRACKIO_DIR"] = str(tmp_path / "trackio-store")
    for name in ("TRACKIO_SERVER_URL", "TRACKIO_SPACE_ID", "TRACKIO_WRITE_TOKEN"):
        cli_env.pop(name, None)
    return cli_env


def _write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "traceml.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _check(traceml_cmd, target: Path, env: dict, *extra: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*traceml_cmd, "export", "trackio", "--check", str(target), *REG, *extra], env=env,
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def _check_in_process(target: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    """The same check in this process (support/cli.py), for a refusal decided before any store is asked."""
    return run_main(["export", "trackio", "--check", str(target), *REG, *extra], env=env)


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_a_good_block_passes_before_launch_and_from_the_launched_runs_manifest(tmp_path: Path, env: dict,
                                                                                 traceml_cmd):
    config = _write_config(tmp_path, EXAMPLE)
    before = _check(traceml_cmd, config, env, "--run-name", "demo")
    assert before.returncode == 0, before.stderr
    run_dir = (tmp_path / "logs" / "demo").resolve()
    assert before.stdout.strip() == (f"check ok: {run_dir} (traceml.yaml) -> Trackio run 'demo' of {PROJECT} (new); "
                                     f"{len(PLANNED)} planned keys mapped: {', '.join(PLANNED)}")
    assert not (tmp_path / "logs").exists() and not Path(env["TRACKIO_DIR"]).exists()  # nothing written or sent

    # without the name it will be launched with, the folder is unknown: one line, exit 2
    unnamed = _check(traceml_cmd, config, env)
    assert unnamed.returncode == 2 and "--run-name is required" in unnamed.stderr
    assert len(unnamed.stderr.strip().splitlines()) == 1

    # the launcher records the effective block in the manifest: the folder checks the same (e.g. before a resume)
    (tmp_path / "train.py").write_text("pass\n")
    launched = subprocess.run([*traceml_cmd, "run", "train.py", "--run-name", "demo"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
    assert json.loads((run_dir / "manifest.json").read_text())["hygiene"]["validation"]["metrics"] == [
        "r2", "mse", "mse_ratio"], launched.stderr
    after = _check(traceml_cmd, run_dir, env)
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == before.stdout.strip().replace("(traceml.yaml)", "(manifest.json)")


def _mutate(change: str) -> dict:
    config = copy.deepcopy(EXAMPLE)
    h = config["hygiene"]
    if change == "stopping-metric-not-reported":
        h["early_stopping"]["metric"] = "auc"
    elif change == "selection-role":
        h["validation"]["metrics"] = ["r2", "auc/selection"]
    elif change == "component-and-metric":
        h["history"]["metrics"] = ["r2", "mse"]
    elif change == "train-metric-of-another-role":
        h["history"]["metrics"] = ["r2/test"]
    elif change == "val-and-plain":
        h["validation"]["metrics"] = ["r2", "auc", "auc/val"]
    elif change == "no-validation-metrics":
        del h["validation"]["metrics"]
    return config


@pytest.mark.parametrize("change, named", [
    ("stopping-metric-not-reported", "early-stopping metric 'auc' is not mapped"),
    ("selection-role", "eval metric 'auc/selection' is not mapped: metric role 'selection' is refused"),
    ("component-and-metric", "step component 'mse' (value) and step metric 'mse' would both publish 'mse/train'"),
    ("train-metric-of-another-role", "step metric 'r2/test' is not mapped to a train key"),
    ("val-and-plain", "eval metric 'auc' and eval metric 'auc/val' would both publish 'auc/eval'"),
    ("no-validation-metrics", "hygiene.validation.metrics is not declared"),
])
def test_a_bad_block_names_the_unmapped_metric(tmp_path: Path, env: dict, change: str, named: str):
    config = _write_config(tmp_path, _mutate(change))
    proc = _check_in_process(config, env, "--run-name", "demo")
    assert proc.returncode == 2, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceml export: check failed: ") and named in lines[0], lines
    assert proc.stdout == "" and not Path(env["TRACKIO_DIR"]).exists()


TRAIN = textwrap.dedent(
    """
    import sys
    import traceml_tui as traceml

    traceml.init("exp", logs_dir=sys.argv[1])
    for step in range(1, 3):
        with traceml.trace_step():
            traceml.log(loss=1.0 / step, components={"mse": (0.5 / step, 2.0)}, metrics={"r2": 0.5})
    traceml.finish()
    """
)


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_a_folder_whose_trackio_run_another_folder_fills_is_not_mapped(tmp_path: Path, env: dict, traceml_cmd):
    """Seed 004: an earlier or sibling output directory does not cover a new output root."""
    (tmp_path / "train.py").write_text(TRAIN)
    trained = subprocess.run([sys.executable, "train.py", "logs"], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert trained.returncode == 0, trained.stderr
    published = tmp_path / "logs" / "exp"
    exported = subprocess.run([*traceml_cmd, "export", "trackio", str(published), *REG], env=env,
                              capture_output=True, text=True, timeout=180)
    assert exported.returncode == 0, exported.stderr

    own = _check(traceml_cmd, _write_config(tmp_path, EXAMPLE), env, "--run-name", "exp")
    assert own.returncode == 0, own.stderr
    assert f"-> Trackio run 'exp' of {PROJECT} (published)" in own.stdout  # this folder's own run

    sibling = _write_config(tmp_path / "next", EXAMPLE)  # a new output root that reuses the name
    refused = _check(traceml_cmd, sibling, env, "--run-name", "exp")
    assert refused.returncode == 2, refused.stdout
    line = refused.stderr.strip()
    assert "\n" not in line and str(published.resolve()) in line
    assert str((tmp_path / "next" / "logs" / "exp").resolve()) in line and "--run-name" in line
    assert _check(traceml_cmd, sibling, env, "--run-name", "exp-2").returncode == 0
