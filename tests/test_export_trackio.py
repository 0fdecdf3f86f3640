"""`traceml export trackio` against a real local Trackio store (TRACKIO_DIR in a temp dir; no server)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("trackio", reason="trackio not installed: pip install 'trackio==0.43.0' (the [trackio] extra)")

PROJECT = "vanguard-hal"
REG = ["--project", PROJECT, "--group", "ablations", "--description", "Does the scale-free loss fall? reference run"]

TRAIN = textwrap.dedent(
    """
    import sys
    import traceml_tui as traceml

    traceml.init("exp", logs_dir=sys.argv[1])
    first, last = int(sys.argv[2]), int(sys.argv[3])
    for step in range(first, last + 1):
        with traceml.trace_step():
            traceml.log(loss=1.0 / step, lr=0.1, batch_size=8, components={"mse": (0.5 / step, 2.0)},
                        metrics={"r2": 1.0 - 1.0 / step})
    traceml.log_eval({"r2/val": 0.5 + last / 100.0, "loss": 2.0 / last}, checkpoint=f"ckpt-{last}", split="holdout",
                     role="val")
    traceml.log_eval({"r2": None}, checkpoint=f"ckpt-{last}-next", status="pending")
    traceml.finish()
    """
)

DUMP = textwrap.dedent(
    """
    import json, sys
    from trackio.sqlite_storage import SQLiteStorage
    logs = SQLiteStorage.get_logs(sys.argv[1], sys.argv[2])
    print(json.dumps({"logs": logs, "config": SQLiteStorage.get_run_config(sys.argv[1], sys.argv[2])}, default=str))
    """
)


def _train(logs: Path, first: int, last: int, env: dict) -> None:
    script = logs.parent / "train.py"
    script.write_text(TRAIN)
    proc = subprocess.run([sys.executable, str(script), str(logs), str(first), str(last)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def _export(traceml_cmd, run_dir: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*traceml_cmd, "export", "trackio", str(run_dir), *REG, *extra], env=env,
                          capture_output=True, text=True, timeout=120)


def _stored(env: dict, run: str = "exp") -> tuple[list[dict], dict]:
    proc = subprocess.run([sys.executable, "-c", DUMP, PROJECT, run], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    return data["logs"], data["config"]


def _points(logs: list[dict]) -> list[tuple[str, int, object]]:
    out = []
    for row in logs:
        for key, value in row.items():
            if key not in ("step", "timestamp"):
                out.append((key, row["step"], value))
    return out


def _scalars(logs: list[dict]) -> dict[tuple[str, int], float]:
    return {(k, s): v for k, s, v in _points(logs) if isinstance(v, (int, float))}


@pytest.fixture
def env(cli_env: dict, tmp_path: Path) -> dict:
    cli_env["TRACKIO_DIR"] = str(tmp_path / "trackio-store")
    for name in ("TRACKIO_SERVER_URL", "TRACKIO_SPACE_ID", "TRACKIO_WRITE_TOKEN"):
        cli_env.pop(name, None)
    return cli_env


def test_export_is_incremental_idempotent_and_equals_the_records(tmp_path: Path, env: dict, traceml_cmd):
    logs = tmp_path / "logs"
    _train(logs, 1, 5, env)
    run_dir = logs / "exp"

    first = _export(traceml_cmd, run_dir, env)
    assert first.returncode == 0, first.stderr
    assert "exp: sent" in first.stdout
    stored, config = _stored(env)
    values = _scalars(stored)
    # training points equal the records; the step is the optimizer update
    for step in range(1, 6):
        assert values[("loss/train", step)] == pytest.approx(1.0 / step)
        assert values[("ratio/mse/train", step)] == pytest.approx(0.5 / step / 2.0)
        assert values[("r2/train", step)] == pytest.approx(1.0 - 1.0 / step)
    # a /val metric and a val role arrive as /eval; no /val key exists anywhere
    assert values[("r2/eval", 5)] == pytest.approx(0.55)
    assert values[("loss/eval", 5)] == pytest.approx(0.4)
    assert not any("/val" in key for key, _, _ in _points(stored))
    # the pending readout is a table row, never a number
    assert ("r2/eval", 0) not in values and not any(v == 0 and k.endswith("/eval") for (k, _), v in values.items())
    tables = {k: v for k, _, v in _points(stored) if isinstance(v, dict) and v.get("_type") == "trackio.table"}
    info = {row["quantity"]: row["value"] for row in tables["info/run"]["_value"]}
    assert info["optimizer updates"] == "5" and info["examples seen"] == "40" and info["batch size"] == "8"
    assert info["pending readouts"] == "1"
    statuses = {row["checkpoint"]: row["status"] for row in tables["info/readouts"]["_value"]}
    assert statuses == {"ckpt-5": "completed", "ckpt-5-next": "pending"}
    # registration recorded in the run config
    assert config["description"].startswith("Does the scale-free loss fall?")
    assert (config["lane"], config["manager"]) == ("vanguard", "hal")
    assert config["experiment_dir"] == str(run_dir.resolve()) and config["step_metric"] == "optimizer_updates"

    # again, nothing new: nothing is sent
    again = _export(traceml_cmd, run_dir, env)
    assert again.returncode == 0 and "nothing new" in again.stdout
    assert _stored(env)[0] == stored

    # the run grows (a resume continues at step 6) and a validation result arrives late for checkpoint step 2
    _train(logs, 6, 7, env)
    from traceml_tui.core.atomic import atomic_write_json
    from traceml_tui.core.rundir import RunDir
    from traceml_tui.hygiene import backlog

    request = {"checkpoint": "step-00000002", "step": 2, "path": "checkpoints/step-00000002.pt", "config_digest": "d"}
    atomic_write_json(RunDir(run_dir).request("step-00000002"), request)
    backlog.write_receipt(run_dir, request, {"r2": 0.25, "mae": None})

    third = _export(traceml_cmd, run_dir, env)
    assert third.returncode == 0, third.stderr
    grown = _stored(env)[0]
    before = _points(stored)
    new = [p for p in _points(grown) if p not in before or _points(grown).count(p) > before.count(p)]
    new_scalars = sorted((k, s) for k, s, v in new if isinstance(v, (int, float)))
    expected = sorted(
        [(k, s) for s in (6, 7) for k in ("loss/train", "lr/train", "ratio/mse/train", "loss/mse/train", "r2/train")]
        + [("r2/eval", 7), ("loss/eval", 7), ("r2/eval", 2)]
    )
    assert new_scalars == expected  # exactly the new points, each once; the missing mae is not a number
    assert _scalars(grown)[("r2/eval", 2)] == pytest.approx(0.25)

    assert "nothing new" in _export(traceml_cmd, run_dir, env).stdout
    assert _stored(env)[0] == grown


def test_validate_only_fails_on_a_missing_description_before_reading_anything(tmp_path: Path, env: dict, traceml_cmd):
    missing = tmp_path / "no-such-run"  # never opened: the registration is checked first
    proc = subprocess.run([*traceml_cmd, "export", "trackio", str(missing), "--project", PROJECT, "--group", "g",
                           "--validate-only"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--description is required" in proc.stderr and "no-such-run" not in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    bad = subprocess.run([*traceml_cmd, "export", "trackio", str(missing), "--project", "Vanguard_HAL", "--group", "g",
                          "--description", "  ", "--validate-only"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "<lane>-<manager>" in bad.stderr and "--description" in bad.stderr
    ok = _export(traceml_cmd, missing, env, "--validate-only")
    assert ok.returncode == 0 and "registration ok" in ok.stdout
    assert not Path(env["TRACKIO_DIR"]).exists()  # nothing was contacted or created


def test_an_unavailable_store_loses_nothing_and_the_next_export_delivers(tmp_path: Path, env: dict, traceml_cmd):
    logs = tmp_path / "logs"
    _train(logs, 1, 3, env)
    run_dir = logs / "exp"
    (tmp_path / "blocked").write_text("a file where the store's folder should be")
    down = dict(env, TRACKIO_DIR=str(tmp_path / "blocked" / "store"))
    proc = _export(traceml_cmd, run_dir, down)
    assert proc.returncode == 75, proc.stderr
    assert "unavailable" in proc.stderr and "will retry" in proc.stderr
    assert not (run_dir / "export" / f"trackio-{PROJECT}.json").exists()  # the cursor did not move

    up = _export(traceml_cmd, run_dir, env)
    assert up.returncode == 0, up.stderr
    assert {s for (k, s) in _scalars(_stored(env)[0]) if k == "loss/train"} == {1, 2, 3}
