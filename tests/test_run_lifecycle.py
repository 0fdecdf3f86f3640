"""`traceml run` across a run's life: resume, interruption, late nodes (each refusal leaves files untouched)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from traceml_tui.core import records
from traceml_tui.run import cli as run_cli

TRACEML = [sys.executable, "-m", "traceml_tui"]
GUARD = {
    "schema_version": 1,
    "workload": {"name": "w", "parameters": {"model": "m"}},
    "measurement": {"start_step": 1, "completed_steps": 3},
}
STEPS = "import traceml_tui as traceml, sys\nfor _ in range(int(sys.argv[1])):\n    with traceml.trace_step():\n        traceml.log(loss=1.0)\n"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*TRACEML, "run", *args], cwd=cwd, env=_env(cwd), capture_output=True, text=True, timeout=120)


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _steps(run_dir: Path, attempt: int) -> list[int]:
    lines = (run_dir / "ranks/rank_0" / f"steps-{attempt}.jsonl").read_bytes().splitlines()
    return [r.step for r in map(records.decode, lines) if isinstance(r, records.Step)]


def test_unguarded_resume_is_a_new_attempt_continuing_the_history(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(STEPS)
    assert _run(["train.py", "--run-name", "r", "--args", "4"], tmp_path).returncode == 0
    proc = _run(["train.py", "--run-name", "r", "--resume", "--args", "3"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "logs" / "r"
    assert _steps(run_dir, 0) == [1, 2, 3, 4] and _steps(run_dir, 1) == [5, 6, 7]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["attempts"] == 2 and manifest["status"] == "completed"
    summary = json.loads((run_dir / "final_summary.json").read_text())
    assert summary["step_time"]["global"]["window"]["steps_analyzed"] == 7


RESUMABLE = """import sys, time
from pathlib import Path
import traceml_tui as traceml
for _ in range(2):
    with traceml.trace_step():
        traceml.log(loss=1.0)
if sys.argv[1] == "fail":
    raise RuntimeError("first attempt fails")
Path("resumed.waiting").write_text("1")
while not Path("resumed.go").exists():  # the test looks at the run while this attempt is alive
    time.sleep(0.05)
"""


def _status_json(tmp_path: Path) -> dict:
    index = tmp_path / "index.sqlite"
    ingest = subprocess.run([*TRACEML, "daemon", "logs", "--once", "--index", str(index)], cwd=tmp_path,
                            env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert ingest.returncode == 0, ingest.stderr
    status = subprocess.run([*TRACEML, "status", "--json", "--index", str(index)], cwd=tmp_path,
                            env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    (run,) = json.loads(status.stdout)["runs"]
    return run


@pytest.mark.slow  # two launches, status polled during the second: end to end (other resume tests stay fast)
def test_a_resumed_run_reads_running_until_its_new_attempt_ends(tmp_path: Path) -> None:
    """While --resume's attempt runs, the failed attempt's final_summary.json is still on disk: it must not make
    the run `failed`, its rank `lost` or show the old failure (the manifest says `running`: core.state)."""
    (tmp_path / "train.py").write_text(RESUMABLE)
    assert _run(["train.py", "--run-name", "r", "--args", "fail"], tmp_path).returncode != 0
    failed = _status_json(tmp_path)
    assert failed["status"] == "failed" and failed["failure"]["rank"] == 0
    proc = subprocess.Popen([*TRACEML, "run", "train.py", "--run-name", "r", "--resume", "--args", "ok"],
                            cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "resumed.waiting").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the resumed attempt never got going"
            time.sleep(0.05)
        assert (tmp_path / "logs/r/final_summary.json").exists()  # the previous attempt's, until the new one
        live = _status_json(tmp_path)
        assert (live["status"], live["rank_states"], live.get("failure")) == ("running", {"0": "running"}, None)
        (tmp_path / "resumed.go").write_text("1")
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.wait()
    done = _status_json(tmp_path)
    assert (done["status"], done["rank_states"], done.get("failure")) == ("completed", {"0": "completed"}, None)


def test_resume_refused_for_a_guarded_run_and_for_another_topology(tmp_path: Path) -> None:
    guarded = tmp_path / "guarded"
    guarded.mkdir()
    (guarded / "traceml.yaml").write_text(yaml.safe_dump({"guard": GUARD}))
    (guarded / "train.py").write_text(STEPS)
    assert _run(["train.py", "--run-name", "g", "--args", "3"], guarded).returncode == 0
    before = _digest(guarded / "logs")
    # even from a folder without the declaration, a guarded run is never resumed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "train.py").write_text(STEPS)
    proc = _run(["train.py", "--run-name", "g", "--resume", "--logs-dir", str(guarded / "logs"), "--args", "3"], elsewhere)
    assert proc.returncode == 1 and "guarded" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert _digest(guarded / "logs") == before

    (elsewhere / "train.py").write_text(STEPS)
    assert _run(["train.py", "--run-name", "u", "--args", "2"], elsewhere).returncode == 0
    before = _digest(elsewhere / "logs")
    proc = _run(["train.py", "--run-name", "u", "--resume", "--nproc-per-node", "2", "--args", "2"], elsewhere)
    assert proc.returncode == 1 and "same topology" in proc.stderr
    assert _digest(elsewhere / "logs") == before


def test_fresh_run_refuses_a_folder_holding_an_unmanaged_processes_steps(tmp_path: Path) -> None:
    """QA: the launcher wrote attempt steps-1 beside a plain traceml.init() process's steps-0 and the summary
    counted that process's steps; only a folder with a manifest was refused."""
    (tmp_path / "train.py").write_text(STEPS)
    sdk = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['x', '2']; import traceml_tui as traceml; "
                          "traceml.init('gsdk'); exec(open('train.py').read()); traceml.finish()"],
                         cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert sdk.returncode == 0, sdk.stderr
    run_dir = tmp_path / "logs" / "gsdk"
    assert (run_dir / "ranks/rank_0/steps-0.jsonl").is_file() and not (run_dir / "manifest.json").exists()
    before = _digest(tmp_path / "logs")
    # what the plain process left: its steps and the summary its rank 0 wrote at exit (docs/run.md)
    listing = ["final_summary.json", "final_summary.txt", "ranks"]
    assert sorted(os.listdir(run_dir)) == listing
    for extra in ([], ["--resume"]):  # nothing to resume either: no manifest
        proc = _run(["train.py", "--run-name", "gsdk", *extra, "--args", "2"], tmp_path)
        assert proc.returncode == 1, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert ("already exists" if not extra else "no run 'gsdk' to resume") in proc.stderr
        assert _digest(tmp_path / "logs") == before and sorted(os.listdir(run_dir)) == listing
    # an empty folder is not a run: a fresh run may use it
    (tmp_path / "logs" / "empty").mkdir()
    assert _run(["train.py", "--run-name", "empty", "--args", "2"], tmp_path).returncode == 0


def test_default_names_never_collide_even_when_launched_in_the_same_second(tmp_path: Path) -> None:
    """QA: two launches without --run-name in the same second: one was refused ("already exists; choose a
    fresh --run-name") for a name the user never chose. Every default name of the next seconds is taken here,
    so both racing launchers must move on to a free one, and not the same one."""
    (tmp_path / "tiny.py").write_text(STEPS)
    now = time.time()
    taken = {f"tiny-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now + s))}" for s in range(-1, 30)}
    for name in taken:
        (tmp_path / "logs" / name).mkdir(parents=True)
        (tmp_path / "logs" / name / "manifest.json").write_text('{"old": true}\n')
    procs = [subprocess.Popen([*TRACEML, "run", "tiny.py", "--args", "2"], cwd=tmp_path, env=_env(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], errs
    fresh = sorted(set(os.listdir(tmp_path / "logs")) - taken)
    assert len(fresh) == 2 and all(name.rsplit("-", 1)[0] in taken for name in fresh), fresh
    for name in fresh:
        assert sum(f"this run is {name!r}" in err for err in errs) == 1, errs
        manifest = json.loads((tmp_path / "logs" / name / "manifest.json").read_text())
        assert manifest["run_name"] == name and manifest["status"] == "completed"
    assert all((tmp_path / "logs" / name / "manifest.json").read_text() == '{"old": true}\n' for name in taken)
    # a chosen name is still refused, never renamed
    proc = _run(["tiny.py", "--run-name", fresh[0], "--args", "2"], tmp_path)
    assert proc.returncode == 1 and "already exists" in proc.stderr and "this run is" not in proc.stderr


def test_late_node_never_writes_into_a_finished_run(tmp_path: Path) -> None:
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump({"guard": GUARD}))
    (tmp_path / "train.py").write_text(STEPS)
    assert _run(["train.py", "--run-name", "done", "--args", "3"], tmp_path).returncode == 0
    before = _digest(tmp_path / "logs")
    proc = _run(["train.py", "--run-name", "done", "--nnodes", "2", "--node-rank", "1", "--master-port", "29977",
                 "--args", "3"], tmp_path)
    assert proc.returncode == 1 and "already finished" in proc.stderr
    assert _digest(tmp_path / "logs") == before


@pytest.mark.parametrize("sig,nproc", [
    (signal.SIGINT, 1),
    pytest.param(signal.SIGTERM, 2, marks=pytest.mark.slow),  # torchrun and 2 ranks: the fast lane keeps Ctrl-C
])
def test_a_signal_mid_run_gives_an_interrupted_run_with_a_summary(tmp_path: Path, sig, nproc) -> None:
    """Ctrl-C (one process) or a scheduler's SIGTERM (torchrun, 2 processes): exit 128 + the signal's number
    (torchrun turned SIGTERM into its own exit 1), an interrupted run, every step before the signal."""
    (tmp_path / "slow.py").write_text(
        "import time\nimport traceml_tui as traceml\nfor _ in range(10000):\n"
        "    with traceml.trace_step():\n        time.sleep(0.01)\n"
    )
    proc = subprocess.Popen([*TRACEML, "run", "slow.py", "--run-name", "stop", "--nproc-per-node", str(nproc)],
                            cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    files = [tmp_path / f"logs/stop/ranks/rank_{r}/steps-0.jsonl" for r in range(nproc)]
    seen = 0
    for _ in range(600):
        # the summary's window is the steps every rank recorded: wait for the slowest rank (a loaded machine
        # starts rank 1 later), minus the header line
        seen = min(f.read_bytes().count(b"\n") - 1 if f.exists() else 0 for f in files)
        if seen >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err[-2000:]
    manifest = json.loads((tmp_path / "logs/stop/manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["exit_code"] == proc.returncode
    summary = json.loads((tmp_path / "logs/stop/final_summary.json").read_text())
    assert summary["run_context"]["run"]["status"] == "interrupted"
    assert summary["step_time"]["global"]["window"]["steps_analyzed"] >= seen >= 5  # every step before the signal
    assert "traceml_tui/run" not in err  # the script's own KeyboardInterrupt is shown; the launcher's never


def test_ctrl_c_while_collecting_outcomes_still_finalizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from traceml_tui.guard.config import load_config
    from traceml_tui.run.launch import Launcher

    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump({"guard": GUARD}))
    (tmp_path / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    options = run_cli.parse_options(["train.py", "--run-name", "zint", "--nnodes", "2", "--master-port", "29978",
                                     "--finalize-timeout", "60"])
    launcher = Launcher(options, load_config(tmp_path / "traceml.yaml"))
    launcher.prepare()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGINT))
    started = time.monotonic()
    try:
        timer.start()
        launcher.finalize(0)  # node 1 never reports; Ctrl-C ends the 60 s wait
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 30
    manifest = json.loads((tmp_path / "logs/zint/manifest.json").read_text())
    assert manifest["status"] != "running"
    assert manifest["guard"]["training"]["reasons"] == ["node_outcome_missing"]
    assert (tmp_path / "logs/zint/final_summary.json").exists()


def test_deeply_nested_yaml_and_empty_run_name_are_one_line_refusals(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "train.py").write_text("open('RAN', 'w')\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traceml.yaml").write_text("guard: " + "[" * 3000 + "]" * 3000 + "\n")
    assert run_cli.main(["train.py"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nested too deeply" in err
    (tmp_path / "traceml.yaml").unlink()
    assert run_cli.main(["train.py", "--run-name", ""]) == 1
    assert "--run-name" in capsys.readouterr().err
    assert not (tmp_path / "RAN").exists()


def test_resume_is_refused_while_the_run_is_still_running_and_taken_after_a_killed_launch(tmp_path: Path) -> None:
    """Found trying the product: `--resume` of a run still training was accepted, and two launchers trained into
    the same rank folders at once (steps-0 to 600 beside steps-1 from 324; the manifest said one attempt, the
    summary was the last launcher's). While the run's launcher lease beats, the resume is refused in one line and
    nothing is written; after that launch is SIGKILLed (its lease left `live`, beating no more) it is taken."""
    (tmp_path / "train.py").write_text(RESUMABLE)
    env = dict(_env(tmp_path), TRACEML_LAUNCHER_LEASE_S="3")  # beats every 0.5 s
    go, waiting = tmp_path / "resumed.go", tmp_path / "resumed.waiting"

    def launch(*extra: str) -> subprocess.Popen:
        proc = subprocess.Popen([*TRACEML, "run", "train.py", "--run-name", "r", *extra, "--args", "ok"],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not waiting.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the launch never got going"
            time.sleep(0.05)
        return proc

    def files() -> tuple[set[str], bytes]:
        # what a resume would write (a manifest with one more attempt, a new attempt's files), not what the running
        # launch itself goes on writing (its lease's beats, its node samples, its held step records)
        return set(_digest(tmp_path / "logs")), (tmp_path / "logs/r/manifest.json").read_bytes()

    first = launch()
    try:
        before = files()
        refused = _run(["train.py", "--run-name", "r", "--resume", "--args", "ok"], tmp_path)
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.strip() == ("traceml run: --resume: run 'r' is still running (its launcher's lease "
                                          "beats); resume it once that launch has ended")
        assert files() == before
        go.write_text("1")
        assert first.wait(timeout=60) == 0, first.stderr.read().decode()
    finally:
        first.kill()
        first.wait()

    go.unlink()
    waiting.unlink()
    killed = launch("--resume")
    killed.kill()  # SIGKILL: no final word, the lease stays `live` and stops beating
    killed.wait()
    go.write_text("1")
    taken = _run(["train.py", "--run-name", "r", "--resume", "--args", "ok"], tmp_path)
    assert taken.returncode == 0, taken.stderr
    assert "whether that launch still runs" in taken.stdout
    assert _steps(tmp_path / "logs/r", 2) == [5, 6]  # on from the killed attempt's 3, 4
