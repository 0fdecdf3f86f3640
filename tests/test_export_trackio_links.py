"""Trackio: link, don't copy (seed 004) — and the description read back, no `selection` role, denominators.

A real run (the SDK), its real learning curve and batch grid, a real local
Trackio store (TRACKIO_DIR in a temp dir), read back through Trackio's own storage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from support.lanes import needs

pytestmark = needs("trackio", "trackio not installed: pip install 'trackio==0.43.0' (the [trackio] extra)")

PROJECT = "vanguard-hal"
TRAIN = textwrap.dedent(
    """
    import sys
    import traceml_tui as traceml

    traceml.init("exp", logs_dir=sys.argv[1])
    for step in range(1, 6):
        with traceml.trace_step():
            traceml.log(loss=1.0 / step, lr=0.1, batch_size=8, components={"mse": (0.5 / step, 2.0)})
    traceml.log_eval({"r2": 0.5, "examples": 500}, checkpoint="ckpt-5", split="holdout", role=sys.argv[2])
    traceml.finish()
    """
)
# Trackio's own reader: the stored logs, and where its media store is (TRACKIO_DIR is read at import).
READ = textwrap.dedent(
    """
    import json, sys
    from trackio import utils
    from trackio.sqlite_storage import SQLiteStorage
    print(json.dumps({"logs": SQLiteStorage.get_logs(sys.argv[1], sys.argv[2]), "media": str(utils.MEDIA_DIR),
                      "config": SQLiteStorage.get_run_config(sys.argv[1], sys.argv[2])}, default=str))
    """
)


def _run(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


def _make_run(tmp_path: Path, env: dict, role: str = "val") -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    done = _run([sys.executable, "train.py", "logs", role], env, tmp_path)
    assert done.returncode == 0, done.stderr
    run_dir = tmp_path / "logs" / "exp"
    assert _run([sys.executable, "-m", "traceml_tui", "curve", str(run_dir)], env, tmp_path).returncode == 0
    from traceml_tui.hygiene.batch_grid import save_batch_grid

    save_batch_grid(run_dir, np.random.default_rng(0).random((20, 3, 8, 8)), step=5, name="inputs")
    return run_dir


def _export(run_dir: Path, env: dict, description: str = "Does the ratio fall? reference run") -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "traceml_tui", "export", "trackio", str(run_dir), "--project", PROJECT,
                 "--group", "g", "--description", description], env, run_dir.parent)


def _read(env: dict, cwd: Path) -> dict:
    done = _run([sys.executable, "-c", READ, PROJECT, "exp"], env, cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    env.update(OMP_NUM_THREADS="1", TRACKIO_DIR=str(tmp_path / "trackio"), XDG_STATE_HOME=str(tmp_path / "state"))
    return env


def _same_file(a: Path, b: Path) -> bool:
    sa, sb = a.stat(), b.stat()  # stat follows a symlink
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_images_are_links_to_the_runs_pngs_readable_through_trackio(tmp_path: Path, env: dict) -> None:
    import matplotlib.image as mpimg

    run_dir = _make_run(tmp_path, env)
    done = _export(run_dir, env)
    assert done.returncode == 0, done.stderr
    stored = _read(env, tmp_path)
    images = {key: value for row in stored["logs"] for key, value in row.items()
              if isinstance(value, dict) and value.get("_type") == "trackio.image"}
    sources = {"curve/learning_curve": run_dir / "learning_curve.png",
               "qc/batch_grid/inputs": run_dir / "qc/batch_grid/inputs/step-00000005.png"}
    assert set(images) == set(sources)
    for key, value in images.items():
        entry = Path(stored["media"]) / value["file_path"]
        assert entry.is_symlink() or entry.stat().st_nlink == 2  # a link, not a copy ...
        assert _same_file(entry, sources[key])  # ... to the run's own file
        assert np.array_equal(mpimg.imread(str(entry)), mpimg.imread(str(sources[key])))
    assert stored["config"]["description"] == "Does the ratio fall? reference run"  # read back: it matched
    # a re-export sends nothing and adds nothing to Trackio's store
    before = sorted(p for p in Path(stored["media"]).rglob("*") if p.is_file())
    again = _export(run_dir, env)
    assert again.returncode == 0 and "exp: nothing new" in again.stdout
    assert sorted(p for p in Path(stored["media"]).rglob("*") if p.is_file()) == before


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_readouts_carry_their_denominator(tmp_path: Path, env: dict) -> None:
    run_dir = _make_run(tmp_path, env)
    assert _export(run_dir, env).returncode == 0
    tables = [value for row in _read(env, tmp_path)["logs"] for key, value in row.items() if key == "info/readouts"]
    assert tables, "no readouts table"
    table = tables[-1]
    text = json.dumps(table)
    assert "examples evaluated" in text and '"500"' in text


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_a_metric_role_named_selection_is_refused_before_anything_is_sent(tmp_path: Path, env: dict) -> None:
    run_dir = _make_run(tmp_path, env, role="selection")
    done = _export(run_dir, env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "traceml export: exp: metric role 'selection' is refused: publish it as eval and say in the run's "
        "description that eval selects checkpoints (so it is not an untouched test)"]
    assert not (run_dir / "export").exists()  # no cursor: nothing was delivered


def test_a_description_trackio_did_not_store_fails_the_export(tmp_path: Path, env: dict) -> None:
    """The branch where the store keeps another description (Trackio 0.43 updates it, so a sink reports one)."""
    from traceml_tui.export import cursor as cursor_mod
    from traceml_tui.export import trackio_export as tx

    run_dir = _make_run(tmp_path, env)
    registration = tx.Registration(project=PROJECT, group="g", description="Does the ratio fall? reference run")
    with pytest.raises(tx.DescriptionMismatch, match="'an older role'"):
        tx.export_run(run_dir, registration, _StaleDescriptionSink())
    assert cursor_mod.cursor_path(run_dir, PROJECT).is_file()  # what was delivered stays delivered
    # ... and the description is not taken as delivered: the next export sends and checks it again
    with pytest.raises(tx.DescriptionMismatch, match="'an older role'"):
        tx.export_run(run_dir, registration, _StaleDescriptionSink())


class _StaleDescriptionSink:
    """Takes every delivery and reads back a description other than the one registered."""

    def open(self, **kwargs) -> None: ...
    def log(self, points, step) -> None: ...
    def table(self, key, columns, rows, step) -> None: ...
    def image(self, key, path, step, caption) -> None: ...
    def close(self) -> None: ...

    def saved_config(self, project: str, run: str) -> dict:
        return {"description": "an older role", "_Group": "g"}
