"""Trackio keys (seed 004): one key per quantity and role, collisions refused, the first measurements read back.

Real runs written by the SDK, a real local Trackio store (TRACKIO_DIR in a temp
dir), read back through Trackio's own storage in a separate process.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from support.lanes import needs

pytestmark = needs("trackio", "trackio not installed: pip install 'trackio==0.43.0' (the [trackio] extra)")

PROJECT = "vanguard-hal"
REG = ["--project", PROJECT, "--group", "ablations", "--description", "Does the scale-free loss fall? reference run"]

# argv: logs dir, run name, JSON of the eval metrics, JSON of extra step metrics
TRAIN = textwrap.dedent(
    """
    import json, sys
    import traceml_tui as traceml

    traceml.init(sys.argv[2], logs_dir=sys.argv[1])
    extra = json.loads(sys.argv[4])
    for step in range(1, 4):
        with traceml.trace_step():
            traceml.log(loss=1.0 / step, lr=0.1, batch_size=8, components={"mse": (0.5 / step, 2.0)},
                        metrics={"r2": 1.0 - 1.0 / step, **extra})
    traceml.log_eval(json.loads(sys.argv[3]), checkpoint="ckpt-3", split="holdout", role="val")
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


def _train(tmp_path: Path, env: dict, name: str, evals: dict, extra: dict | None = None) -> Path:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "logs"), name, json.dumps(evals),
                           json.dumps(extra or {})], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "logs" / name


def _export(traceml_cmd, run_dirs: list[Path], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*traceml_cmd, "export", "trackio", *map(str, run_dirs), *REG], env=env,
                          capture_output=True, text=True, timeout=180)


def _stored(env: dict, run: str) -> dict[tuple[str, int], float]:
    proc = subprocess.run([sys.executable, "-c", DUMP, PROJECT, run], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return {(key, row["step"]): value for row in json.loads(proc.stdout) for key, value in row.items()
            if key not in ("step", "timestamp") and isinstance(value, (int, float))}


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_train_and_eval_of_one_quantity_land_under_one_key(tmp_path: Path, env: dict, traceml_cmd):
    evals = {"loss": 0.4, "mse": 0.2, "mse_ratio": 0.1, "r2/val": 0.55}  # what a validation worker reports
    run_dir = _train(tmp_path, env, "exp", evals)
    proc = _export(traceml_cmd, [run_dir], env)
    assert proc.returncode == 0, proc.stderr
    values = _stored(env, "exp")
    for quantity, train_at_1, evaluated in (("loss", 1.0, 0.4), ("mse", 0.5, 0.2), ("mse_ratio", 0.25, 0.1),
                                            ("r2", 0.0, 0.55)):
        assert values[(f"{quantity}/train", 1)] == pytest.approx(train_at_1), quantity
        assert values[(f"{quantity}/eval", 3)] == pytest.approx(evaluated), quantity
    charts = {key.rsplit("/", 1)[0] for key, _ in values}
    assert charts == {"loss", "mse", "mse_ratio", "r2", "lr"}  # one chart per quantity, both roles on it
    assert {key.rsplit("/", 1)[1] for key, _ in values} == {"train", "eval"}
    # the first measurements (every key of step 1) were read back through Trackio's API and found equal
    first = sorted(key for key, step in values if step == 1)
    assert first == ["loss/train", "lr/train", "mse/train", "mse_ratio/train", "r2/train"]
    assert f"(first measurements read back through Trackio: {len(first)} equal)" in proc.stdout
    again = _export(traceml_cmd, [run_dir], env)
    assert again.returncode == 0 and "nothing new" in again.stdout and "read back" not in again.stdout


@pytest.mark.parametrize(
    "evals, extra, sources, key",
    [
        ({"auc": 0.7, "auc/val": 0.8}, None, ("eval metric 'auc'", "eval metric 'auc/val'"), "auc/eval"),
        ({"r2": 0.5}, {"mse": 0.3}, ("step component 'mse' (value)", "step metric 'mse'"), "mse/train"),
    ],
    ids=["auc-and-auc-val", "component-and-metric"],
)
@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_two_sources_of_one_key_are_refused_naming_both(tmp_path: Path, env: dict, traceml_cmd, evals, extra,
                                                         sources, key):
    bad = _train(tmp_path, env, "exp", evals, extra)
    good = _train(tmp_path, env, "other", {"r2": 0.5})
    proc = _export(traceml_cmd, [bad, good], env)
    assert proc.returncode == 2, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceml export: exp: step ")
    assert all(source in lines[0] for source in sources) and repr(key) in lines[0]
    assert "nothing of this run was published" in lines[0]
    assert not (bad / "export").exists()  # no cursor: nothing of it was delivered
    assert _stored(env, "exp") == {}
    assert _stored(env, "other")[("loss/train", 1)] == 1.0  # one bad run does not stop the others
    assert "other: sent" in proc.stdout


TRACKIO_WRITE = textwrap.dedent(
    """
    import sys, trackio
    # another writer (a direct SDK caller) already logged step 1 of the same Trackio run
    trackio.init(project=sys.argv[1], name="exp", group="ablations", config={"experiment_dir": sys.argv[2]},
                 auto_log_cpu=False, auto_log_gpu=False, embed=False)
    trackio.log({"loss/train": 5.0}, step=1)
    trackio.finish()
    """
)


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_first_measurements_read_back_name_what_trackio_holds_otherwise(tmp_path: Path, env: dict, traceml_cmd):
    run_dir = _train(tmp_path, env, "exp", {"r2": 0.5})
    proc = subprocess.run([sys.executable, "-c", TRACKIO_WRITE, PROJECT, str(run_dir.resolve())], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    exported = _export(traceml_cmd, [run_dir], env)
    assert exported.returncode == 2, exported.stdout
    assert exported.stderr.strip().splitlines() == [
        "traceml export: exp: Trackio's first measurements (step 1) differ from those sent: "
        "loss/train: sent 1.0, stored 5.0, 1.0"]
    # what was delivered stays delivered; the cursor moved, so nothing is sent twice
    assert _stored(env, "exp")[("mse/train", 1)] == 0.5
    assert "nothing new" in _export(traceml_cmd, [run_dir], env).stdout


STEPS = textwrap.dedent(
    """
    import sys
    import traceml_tui as traceml

    traceml.init("exp", logs_dir=sys.argv[1])
    for step in range(int(sys.argv[2]), int(sys.argv[3]) + 1):
        with traceml.trace_step():
            traceml.log(loss=1.0 / step, components={"mse": (0.5 / step, 2.0)})
    traceml.finish()
    """
)


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_the_first_measurements_are_read_back_when_they_come_after_a_pass_without_steps(tmp_path: Path, env: dict,
                                                                                         traceml_cmd):
    """An exporter started with the run (--follow) first sends only tables; the first steps are still verified."""
    (tmp_path / "steps.py").write_text(STEPS)
    run_dir = tmp_path / "logs" / "exp"
    for first, last, expect in ((1, 0, None), (1, 2, "(first measurements read back through Trackio: 3 equal)"),
                                (3, 4, None)):
        wrote = subprocess.run([sys.executable, "steps.py", "logs", str(first), str(last)], env=env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=120)
        assert wrote.returncode == 0, wrote.stderr
        proc = _export(traceml_cmd, [run_dir], env)
        assert proc.returncode == 0, proc.stderr
        assert "exp: sent" in proc.stdout
        assert ("read back through Trackio" in proc.stdout) == (expect is not None), proc.stdout
        if expect is not None:
            assert expect in proc.stdout
    assert sorted(step for key, step in _stored(env, "exp") if key == "mse_ratio/train") == [1, 2, 3, 4]


def test_the_reader_sees_what_trackio_stored(tmp_path: Path, env: dict, monkeypatch):
    """TrackioReader asks Trackio's API (in process for the local store) and differences() compares exactly."""
    proc = subprocess.run([sys.executable, "-c", TRACKIO_WRITE, PROJECT, "/elsewhere"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    code = textwrap.dedent(
        """
        import json, sys
        from traceml_tui.export import readback
        reader = readback.TrackioReader()
        stored = reader.values_at(sys.argv[1], "exp", 1)
        print(json.dumps({"stored": stored, "config": reader.run_config(sys.argv[1], "exp"),
                          "missing": reader.run_config(sys.argv[1], "nobody"),
                          "same": readback.differences({"loss/train": 5.0}, stored),
                          "other": readback.differences({"loss/train": 5.000001, "r2/train": 1.0}, stored)}))
        """
    )
    read = subprocess.run([sys.executable, "-c", code, PROJECT], env=env, capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    data = json.loads(read.stdout)
    assert data["stored"] == {"loss/train": [5.0]}
    assert data["config"]["experiment_dir"] == "/elsewhere" and data["missing"] == {}
    assert data["same"] == []
    assert data["other"] == ["loss/train: sent 5.000001, stored 5.0", "r2/train: sent 1.0, stored nothing"]


SERVE = textwrap.dedent(
    """
    import sys, trackio
    trackio.show(open_browser=False, block_thread=True, server_port=int(sys.argv[1]), host="127.0.0.1")
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # trains, exports and reads back through a real Trackio store: end to end
def test_a_server_is_read_back_through_its_http_api(tmp_path: Path, env: dict, traceml_cmd):
    """A real self-hosted Trackio server: the first measurements and the folder's owner are read over its API."""
    port = _free_port()
    server_env = dict(env, TRACKIO_DIR=str(tmp_path / "server-store"), TRACKIO_WRITE_TOKEN="tok")
    server = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], env=server_env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120  # generous: the machine may be loaded
        while True:
            try:
                urllib.request.urlopen(url, timeout=5).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the Trackio server did not start"
                time.sleep(0.3)
        client = dict(env, TRACKIO_WRITE_TOKEN="tok")  # the exporter's own TRACKIO_DIR stays untouched
        run_dir = _train(tmp_path, env, "exp", {"r2": 0.5, "mse_ratio": 0.2})
        sent = subprocess.run([*traceml_cmd, "export", "trackio", str(run_dir), *REG, "--server-url", url],
                              env=client, capture_output=True, text=True, timeout=180)
        assert sent.returncode == 0, sent.stderr
        assert "(first measurements read back through Trackio: 5 equal)" in sent.stdout
        assert not Path(env["TRACKIO_DIR"]).exists()  # everything went to (and came back from) the server

        sibling = tmp_path / "next"
        sibling.mkdir()
        example = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples/hygiene/traceml.yaml").read_text())
        (sibling / "traceml.yaml").write_text(yaml.safe_dump(example))
        check = subprocess.run([*traceml_cmd, "export", "trackio", "--check", str(sibling / "traceml.yaml"), *REG,
                                "--run-name", "exp", "--server-url", url], env=client, capture_output=True,
                               text=True, timeout=120)
        assert check.returncode == 2, check.stdout
        assert str(run_dir.resolve()) in check.stderr and len(check.stderr.strip().splitlines()) == 1
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
