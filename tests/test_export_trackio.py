"""`traceml export trackio` against a real local Trackio store (TRACKIO_DIR in a temp dir; no server)."""

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


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
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
        assert values[("mse_ratio/train", step)] == pytest.approx(0.5 / step / 2.0)
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
        [(k, s) for s in (6, 7) for k in ("loss/train", "lr/train", "mse_ratio/train", "mse/train", "r2/train")]
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


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
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


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_a_changed_description_and_group_are_published_and_read_back_with_nothing_new(tmp_path: Path, env: dict,
                                                                                      traceml_cmd):
    """Seed 004: update the description when the run's role changes, and verify what the server saved."""
    logs = tmp_path / "logs"
    _train(logs, 1, 3, env)
    run_dir = logs / "exp"
    assert _export(traceml_cmd, run_dir, env).returncode == 0
    stored, config = _stored(env)
    assert config["_Group"] == "ablations"

    role = ["--project", PROJECT, "--group", "references", "--description", "Superseded by exp2; kept as reference"]
    changed = subprocess.run([*traceml_cmd, "export", "trackio", str(run_dir), *role], env=env, capture_output=True,
                             text=True, timeout=120)
    assert changed.returncode == 0, changed.stderr
    assert "nothing new" not in changed.stdout and "new description/group" in changed.stdout
    grown, config = _stored(env)
    assert config["description"] == "Superseded by exp2; kept as reference" and config["_Group"] == "references"
    assert _scalars(grown) == _scalars(stored)  # no record was new: no point was sent again

    again = subprocess.run([*traceml_cmd, "export", "trackio", str(run_dir), *role], env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0 and "nothing new" in again.stdout


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_two_run_directories_of_one_name_never_merge_into_one_trackio_run(tmp_path: Path, env: dict, traceml_cmd):
    """Trackio runs are named after the folder; a second folder of that name is refused, naming both, and
    published with --run-name; nothing of it reaches the first one's run, with or without --cursor-dir."""
    first, second = tmp_path / "expA" / "logs", tmp_path / "expB" / "logs"
    first.parent.mkdir()
    second.parent.mkdir()
    _train(first, 1, 3, env)
    _train(second, 1, 5, env)
    a, b = first / "exp", second / "exp"

    both = subprocess.run([*traceml_cmd, "export", "trackio", str(a), str(b), *REG], env=env, capture_output=True,
                          text=True, timeout=120)
    assert both.returncode == 2 and str(a) in both.stderr and str(b) in both.stderr
    assert len(both.stderr.strip().splitlines()) == 1 and not Path(env["TRACKIO_DIR"]).exists()
    for bad in ("x/y", " exp", ".."):  # the name also names the cursor file under --cursor-dir
        assert _export(traceml_cmd, b, env, "--run-name", bad).returncode == 2

    for extra in ((), ("--cursor-dir", str(tmp_path / "cursors"))):
        project = ["--project", f"{PROJECT}{len(extra)}"]  # vanguard-hal0, vanguard-hal2
        exported = _export(traceml_cmd, a, env, *extra, *project)
        assert exported.returncode == 0, exported.stderr
        refused = _export(traceml_cmd, b, env, *extra, *project)
        assert refused.returncode == 2, refused.stdout
        assert len(refused.stderr.strip().splitlines()) == 1
        assert str(a) in refused.stderr and str(b) in refused.stderr and "--run-name" in refused.stderr
        renamed = _export(traceml_cmd, b, env, *extra, *project, "--run-name", "exp-b")
        assert renamed.returncode == 0, renamed.stderr
        # a later export of b under the folder's name again is refused, not published twice
        assert _export(traceml_cmd, b, env, *extra, *project).returncode == 2
        data = {}
        for run in ("exp", "exp-b"):
            proc = subprocess.run([sys.executable, "-c", DUMP, project[1], run], env=env, capture_output=True,
                                  text=True, timeout=120)
            data[run] = json.loads(proc.stdout)
        losses = {run: sorted(row["step"] for row in d["logs"] if "loss/train" in row) for run, d in data.items()}
        assert losses == {"exp": [1, 2, 3], "exp-b": [1, 2, 3, 4, 5]}
        assert {run: d["config"]["experiment_dir"] for run, d in data.items()} == {"exp": str(a), "exp-b": str(b)}


def test_a_server_without_its_write_token_is_a_configuration_error(tmp_path: Path, env: dict, traceml_cmd):
    logs = tmp_path / "logs"
    _train(logs, 1, 2, env)
    for extra in ((), ("--follow",)):  # --follow must not retry a configuration error forever
        proc = _export(traceml_cmd, logs / "exp", env, "--server-url", "http://127.0.0.1:9", *extra)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            "traceml export: --server-url needs the server's write token: set TRACKIO_WRITE_TOKEN "
            "(or add write_token to the URL)"]
    assert not (logs / "exp" / "export").exists()


def test_an_unreachable_server_is_one_line_and_trackio_adds_none(tmp_path: Path, env: dict, traceml_cmd):
    logs = tmp_path / "logs"
    _train(logs, 1, 2, env)
    proc = _export(traceml_cmd, logs / "exp", dict(env, TRACKIO_WRITE_TOKEN="t"), "--server-url",
                   "http://127.0.0.1:9")
    assert proc.returncode == 75
    assert len(proc.stderr.strip().splitlines()) == 1 and "will retry" in proc.stderr, proc.stderr


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_malformed_step_lines_are_counted_reported_and_everything_else_is_sent(tmp_path: Path, env: dict,
                                                                              traceml_cmd):
    logs = tmp_path / "logs"
    _train(logs, 1, 3, env)
    run_dir = logs / "exp"
    steps = sorted((run_dir / "ranks").rglob("steps-*.jsonl"))[0]
    with open(steps, "ab") as handle:  # hand-written on purpose: the SDK never writes these
        handle.write(b'{"v":1,"kind":"step","step":"four"\n')
        handle.write(b"not json\n")
    proc = _export(traceml_cmd, run_dir, env)
    assert proc.returncode == 65
    assert proc.stderr.strip().splitlines() == [
        "traceml export: exp: skipped 2 malformed step-file lines (not records; the run directory is unchanged, "
        "everything else was sent)"]
    stored, _ = _stored(env)
    assert {s for (k, s) in _scalars(stored) if k == "loss/train"} == {1, 2, 3}
    tables = [v for k, _, v in _points(stored) if k == "info/run"]
    info = {row["quantity"]: row["value"] for row in tables[-1]["_value"]}
    assert info["malformed step lines skipped"] == "2"
    again = _export(traceml_cmd, run_dir, env)
    assert again.returncode == 0 and "nothing new" in again.stdout


class _RemoteSink:
    """A destination whose store cannot be read back from here (a self-hosted server): only the cursor knows."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def open(self, **kwargs) -> None: ...
    def log(self, points, step) -> None: self.sent.append(step)
    def table(self, key, columns, rows, step) -> None: ...
    def image(self, key, path, step, caption) -> None: ...
    def close(self) -> None: ...


def test_a_shared_cursor_dir_refuses_a_second_folder_of_one_name(tmp_path: Path, env: dict):
    from traceml_tui.export import trackio_export as tx

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _train(tmp_path / "a" / "logs", 1, 3, env)
    _train(tmp_path / "b" / "logs", 1, 5, env)
    registration = tx.Registration(project=PROJECT, group="g", description="Does the loss fall? reference run")
    cursors = tmp_path / "cursors"
    tx.export_run(tmp_path / "a" / "logs" / "exp", registration, _RemoteSink(), cursor_dir=cursors)
    sink = _RemoteSink()
    with pytest.raises(tx.IdentityCollision, match="--run-name") as refused:
        tx.export_run(tmp_path / "b" / "logs" / "exp", registration, sink, cursor_dir=cursors)
    assert str(tmp_path / "a" / "logs" / "exp") in str(refused.value)
    assert str(tmp_path / "b" / "logs" / "exp") in str(refused.value)
    assert sink.sent == []
    tx.export_run(tmp_path / "b" / "logs" / "exp", registration, sink, cursor_dir=cursors, run_name="exp-b")
    assert sink.sent == [1, 2, 3, 4, 5]  # its own cursor: every step, none skipped as "already sent"
