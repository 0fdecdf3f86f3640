"""The Trackio export carries the QC figures' health measures as `qc`-role metrics (a real local store)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.lanes import needs

pytestmark = needs("trackio", "trackio not installed: pip install 'trackio==0.43.0' (the [trackio] extra)")

PROJECT = "vanguard-hal"
REG = ["--project", PROJECT, "--group", "qc", "--description", "Are the QC figures healthy? reference run"]

TRAIN = textwrap.dedent(
    """
    import sys
    import numpy as np
    import traceml_tui as traceml

    traceml.init("exp", logs_dir=sys.argv[1])
    rng = np.random.default_rng(0)
    for step in range(1, 5):
        with traceml.trace_step():
            traceml.log(loss=1.0 / step, lr=0.1, batch_size=8)
        if step in (2, 4):
            batch = rng.random((8, 3, 6, 6))
            # members 0-3 repeat one source: the grid's concentration shows it
            traceml.log_batch_grid(batch, name="inputs", sources=["a", "a", "a", "a", "b", "c", "d", "e"],
                                   eligible=10, cadence=2)
            groups = {"kept": [(f"k{i}", rng.random((5, 5)), float(i)) for i in range(16)], "empty": []}
            traceml.log_gallery(groups, name="roster", eligible={"kept": 32}, cadence=2)
    traceml.finish()
    """
)

DUMP = textwrap.dedent(
    """
    import json, sys
    from trackio.sqlite_storage import SQLiteStorage
    print(json.dumps(SQLiteStorage.get_logs(sys.argv[1], sys.argv[2]), default=str))
    """
)


@pytest.fixture
def env(cli_env: dict, tmp_path: Path) -> dict:
    cli_env["TRACKIO_DIR"] = str(tmp_path / "trackio-store")
    for name in ("TRACKIO_SERVER_URL", "TRACKIO_SPACE_ID", "TRACKIO_WRITE_TOKEN"):
        cli_env.pop(name, None)
    return cli_env


def _stored(env: dict) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", DUMP, PROJECT, "exp"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _points(logs: list[dict]) -> dict[tuple[str, int], object]:
    return {(k, row["step"]): v for row in logs for k, v in row.items() if k not in ("step", "timestamp")}


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_measures_of_grids_and_galleries_are_published_once_as_qc_metrics(tmp_path: Path, env: dict,
                                                                          traceml_cmd) -> None:
    logs = tmp_path / "logs"
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = subprocess.run([sys.executable, str(script), str(logs)], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    run_dir = logs / "exp"
    first = subprocess.run([*traceml_cmd, "export", "trackio", str(run_dir), *REG], env=env, capture_output=True,
                           text=True, timeout=180)
    assert first.returncode == 0, first.stderr
    points = _points(_stored(env))

    for step in (2, 4):
        grid = json.loads((run_dir / f"qc/batch_grid/inputs/step-{step:08d}.json").read_text())["measures"]
        gallery = json.loads((run_dir / f"qc/gallery/roster/step-{step:08d}.json").read_text())["measures"]["overall"]
        # what the figure's JSON says is what the store holds, under <kind>/<name>/<measure>/qc
        assert points[("batch_grid/inputs/coverage/qc", step)] == pytest.approx(grid["coverage"]["value"])
        assert grid["coverage"] == {"distinct": 5, "eligible": 10, "value": 0.5}
        assert points[("batch_grid/inputs/top_k_share/qc", step)] == pytest.approx(8 / 8)  # 5 sources, k = 5
        assert points[("batch_grid/inputs/gini/qc", step)] == pytest.approx(grid["concentration"]["gini"])
        assert grid["concentration"]["gini"] == pytest.approx(0.3)  # counts 4, 1, 1, 1, 1
        assert points[("batch_grid/inputs/entropy/qc", step)] == pytest.approx(grid["concentration"]["entropy"])
        assert points[("batch_grid/inputs/diversity/qc", step)] == pytest.approx(grid["diversity"]["value"])
        assert points[("gallery/roster/coverage/qc", step)] == pytest.approx(16 / 32)
        assert points[("gallery/roster/diversity/qc", step)] == pytest.approx(gallery["diversity"]["value"])
        # the gallery's page is an image under its QC key
        image = points[("qc/gallery/roster", step)]
        assert isinstance(image, dict) and image.get("_type") == "trackio.image"
    info = [v for (k, _), v in sorted(points.items(), key=lambda kv: kv[0][1]) if k == "info/run"][-1]
    rows = {row["quantity"]: row["value"] for row in info["_value"]}
    assert rows["QC required items"] == "not bound (hygiene.qc declares no items)"  # no traceml run, no block
    qc_keys = {k for (k, _) in points if k.endswith("/qc")}
    assert qc_keys == {f"{kind}/{measure}/qc" for kind in ("batch_grid/inputs", "gallery/roster")
                       for measure in ("coverage", "top_k_share", "gini", "entropy", "diversity")}

    again = subprocess.run([*traceml_cmd, "export", "trackio", str(run_dir), *REG], env=env, capture_output=True,
                           text=True, timeout=180)
    assert again.returncode == 0 and "nothing new" in again.stdout
    assert _points(_stored(env)) == points  # each measure delivered once
