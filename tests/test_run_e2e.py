"""`traceml run` end to end: real 2-rank gloo DDP through the launcher, real files.

These launch real training processes (torch.distributed.run), so they are
marked slow; each takes a few seconds on 2 cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from traceml_tui.core import records
from traceml_tui.core.rundir import RunDir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
DDP_EXAMPLE = REPO / "examples" / "distributed" / "ddp_minimal.py"
SEED_YAML = REPO / "examples" / "traceml.yaml"
TRACEML = [sys.executable, "-m", "traceml_tui"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env.pop("TRACEML_RUN_DIR", None)
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*TRACEML, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _all_lines_parse(run_dir: Path) -> int:
    count = 0
    for path in list(run_dir.glob("ranks/rank_*/steps-*.jsonl")) + list(run_dir.glob("nodes/node_*/system.jsonl")):
        data = path.read_bytes()
        assert data.endswith(b"\n"), f"{path} ends with a partial line"
        for line in data.splitlines():
            records.decode(line)
            count += 1
    return count


@pytest.fixture
def seed_dir(tmp_path: Path) -> Path:
    """A launch directory holding the seed's traceml.yaml (a sibling folder stays unguarded)."""
    launch = tmp_path / "launch"
    launch.mkdir()
    shutil.copy(SEED_YAML, launch / "traceml.yaml")
    return launch


def test_seed_cpu_ddp_workflow_then_compare_and_refused_rerun(seed_dir: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    for name in ("guard-reference", "guard-candidate"):
        proc = _run([
            "run", str(DDP_EXAMPLE), "--run-name", name, "--nproc-per-node", "2", "--args", "--steps", "20",
        ], seed_dir, env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Measurement contract captured" in proc.stderr
        run_dir = seed_dir / "logs" / name
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["guard"]["contract"]["workload"]["name"] == "ddp-minimal-guard-trial"
        assert manifest["guard"]["training"]["status"] == "completed"
        assert manifest["guard"]["training"]["nodes"] == [{"node_rank": 0, "exit_code": 0}]
        assert manifest["status"] == "completed"
        summary = json.loads((run_dir / "final_summary.json").read_text())
        assert summary["schema_version"] == 1.9
        window = summary["step_time"]["global"]["window"]
        assert (window["steps_analyzed"], window["start_step"], window["end_step"]) == (20, 1, 20)
        assert window["diagnosis_clock"] == "cpu"
        average = summary["step_time"]["global"]["average"]
        assert average["step_time_cpu_ms"] > 0
        assert average["step_time_gpu_ms"] is None  # never a fabricated 0
        assert sorted(summary["step_time"]["groups"]["rows"]) == ["0", "1"]
        ctx = summary["run_context"]
        assert ctx["run"]["status"] == "completed"
        assert ctx["execution"] == {
            "expected_nodes": 1, "processes_per_node": 2, "expected_world_size": 2,
            "launcher_completion": {"status": "completed", "nodes_observed": 1, "reason_codes": []},
        }
        assert ctx["declaration"] == manifest["guard"]["contract"]
        assert (run_dir / "final_summary.txt").read_text().startswith("TraceML summary")
        assert (run_dir / "nodes" / "node_0" / "training.stderr.log").exists()
        assert _all_lines_parse(run_dir) >= 2 * 22  # header + 20 steps + rank_end per rank

    proc = _run([
        "compare", "logs/guard-reference/final_summary.json", "logs/guard-candidate/final_summary.json",
        "--max-step-time-regression-pct", "1000", "--output", "compare/guard-reference-vs-candidate",
    ], seed_dir, env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (seed_dir / "compare" / "guard-reference-vs-candidate.json").exists()
    assert (seed_dir / "compare" / "guard-reference-vs-candidate.txt").exists()
    verdict = json.loads((seed_dir / "compare" / "guard-reference-vs-candidate.json").read_text())
    assert "WITHIN_THRESHOLD_IN_THIS_PAIR" in json.dumps(verdict)

    before = _tree_digest(seed_dir / "logs" / "guard-reference")
    proc = _run([
        "run", str(DDP_EXAMPLE), "--run-name", "guard-reference", "--nproc-per-node", "2", "--args", "--steps", "20",
    ], seed_dir, env)
    assert proc.returncode != 0
    assert "already exists" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert _tree_digest(seed_dir / "logs" / "guard-reference") == before


KILL_SCRIPT = """
import os, signal, time
import torch, torch.distributed as dist
import traceml_tui as traceml
dist.init_process_group("gloo")
traceml.init()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 400):
    with traceml.trace_step(model):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step(); opt.zero_grad()
        traceml.log(loss=loss)
    time.sleep(0.03)  # updates longer than the SDK's write window: each step on disk when it ends (docs/run.md)
    if step == 15 and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_sigkill_of_one_rank_leaves_whole_lines_and_a_failed_summary(seed_dir: Path, tmp_path: Path) -> None:
    (seed_dir / "killer.py").write_text(KILL_SCRIPT)
    proc = _run(["run", "killer.py", "--run-name", "killed", "--nproc-per-node", "2"], seed_dir, _env(tmp_path))
    assert proc.returncode != 0
    run_dir = seed_dir / "logs" / "killed"
    assert _all_lines_parse(run_dir) > 15
    rank1 = [records.decode(line) for line in (run_dir / "ranks/rank_1/steps-0.jsonl").read_bytes().splitlines()]
    assert max(r.step for r in rank1 if isinstance(r, records.Step)) == 15
    summary = json.loads((run_dir / "final_summary.json").read_text())
    assert summary["run_context"]["run"]["status"] == "failed"
    assert summary["run_context"]["execution"]["launcher_completion"]["status"] == "incomplete"
    assert json.loads((run_dir / "manifest.json").read_text())["exit_code"] == proc.returncode


SECRET = "hunter2-very-secret-token"  # passed as a script argument
ENV_SECRET = "s3cr3t-env-value-7f1c"  # only in the environment


def _host_token(text: str) -> bool:
    """The host name as a whole token (a short host name such as ``vm`` is also a substring of package names)."""
    host = re.escape(socket.gethostname())
    return re.search(rf"(?<![A-Za-z0-9_.-]){host}(?![A-Za-z0-9_-])", text) is not None


def test_secrets_env_args_paths_and_host_stay_out_of_artifacts(seed_dir: Path, tmp_path: Path) -> None:
    script = seed_dir / "secretive.py"
    script.write_text(
        "import sys, os\nimport traceml_tui as traceml\ntraceml.init()\n"
        "for _ in range(3):\n    with traceml.trace_step():\n        traceml.log(loss=1.0)\n"
        "print('args', sys.argv[1:], os.environ['API_TOKEN'][:3])\n"
    )
    env = _env(tmp_path, API_TOKEN=ENV_SECRET, TRACEML_TEST_SECRET=ENV_SECRET)
    proc = _run(["run", "secretive.py", "--run-name", "secretive", "--args", "--token", SECRET], seed_dir, env)
    assert proc.returncode == 0, proc.stderr
    run_dir = seed_dir / "logs" / "secretive"
    paths = [str(seed_dir), str(tmp_path), sys.prefix, os.path.dirname(sys.executable)]
    forbidden = [SECRET, ENV_SECRET, *paths]
    for name in ("final_summary.json", "final_summary.txt", "manifest.json", "nodes/node_0/guard_outcome.json"):
        text = (run_dir / name).read_text()
        for needle in forbidden:
            assert needle not in text, f"{needle!r} leaked into {name}"
        assert not _host_token(text), f"the host name leaked into {name}"
    # The reproduction bundle (docs/security.md): no env value, host name or absolute path; the README's
    # reproduction line carries the script's arguments as given — and only the README.
    bundle = RunDir(run_dir).bundle_files()
    assert {p.name for p in bundle} >= {"README.md", "git.json", "environment.json", "inputs.json"}
    assert json.loads((run_dir / "provenance" / "git.json").read_text())["reason"] == "not a git repository"
    for path in bundle:
        text = path.read_text()
        for needle in [ENV_SECRET, *paths]:
            assert needle not in text, f"{needle!r} leaked into {path.name}"
        assert not _host_token(text), f"the host name leaked into {path.name}"
        assert (SECRET in text) == (path.name == "README.md"), path.name
    # every file of the run, logs included: the environment's value never reaches disk
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) > len(bundle) + 4
    for path in files:
        data = path.read_bytes()
        assert ENV_SECRET.encode() not in data, f"the environment's secret leaked into {path.relative_to(run_dir)}"
        assert not _host_token(data.decode("utf-8", "replace")), f"the host name leaked into {path.relative_to(run_dir)}"


NODE_SCRIPT = """
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
import traceml_tui as traceml
dist.init_process_group("gloo", timeout=timedelta(seconds=20))
traceml.init()
fail_node = os.environ.get("FAIL_NODE")
for step in range(1, 6):
    with traceml.trace_step():
        t = torch.ones(1)
        dist.all_reduce(t)
    if fail_node is not None and os.environ["TRACEML_NODE_RANK"] == fail_node and step == 2:
        sys.exit(3)
traceml.finish()
dist.destroy_process_group()  # without it gloo may abort at interpreter exit
"""


def _two_nodes(seed_dir: Path, tmp_path: Path, name: str, *, fail_node: str | None = None,
               node1_dir: Path | None = None, plant=None, finalize_timeout: str = "4",
               ) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess, dict]:
    """Two launchers on one machine sharing one logs dir; returns (node0, node1, manifest).

    ``finalize_timeout``: how long node 0 waits for node 1's outcome. Short where node 1's outcome never
    reaches the shared run (it waits all of it); long where it does, since the wait ends when it arrives and a
    loaded machine can finish node 1 seconds after node 0 (a 4 s wait once read a completed pair as incomplete).
    """
    (seed_dir / "node.py").write_text(NODE_SCRIPT)
    node1_dir = node1_dir or seed_dir
    if node1_dir != seed_dir:
        (node1_dir / "node.py").write_text(NODE_SCRIPT)
    logs = seed_dir / "logs"
    port = str(_free_port())
    extra = {"FAIL_NODE": fail_node} if fail_node is not None else {}
    env = _env(tmp_path, **extra)
    common = ["--run-name", name, "--nnodes", "2", "--nproc-per-node", "1", "--master-port", port,
              "--logs-dir", str(logs), "--finalize-timeout", finalize_timeout]
    # node 0's output goes to files, not pipes: an unread pipe that fills up would block node 0
    # mid-training and, through the collectives, node 1 too.
    out0, err0 = tmp_path / f"{name}-node0.out", tmp_path / f"{name}-node0.err"
    with open(out0, "w") as stdout0, open(err0, "w") as stderr0:
        node0 = subprocess.Popen([*TRACEML, "run", "node.py", *common, "--node-rank", "0"], cwd=seed_dir, env=env,
                                 stdout=stdout0, stderr=stderr0)
        try:
            if plant is not None:
                # plant only once node 1 trains: a node k > 0 refuses to start into a run that already holds its
                # outcome (run/launch.py), so a plant ahead of a slow node 1 would leave node 0 at the rendezvous
                threading.Thread(target=_plant_when_node1_trains, args=(logs / name, plant), daemon=True).start()
            node1 = subprocess.run([*TRACEML, "run", "node.py", *common, "--node-rank", "1"], cwd=node1_dir, env=env,
                                   capture_output=True, text=True, timeout=180)
            node0.wait(timeout=180)
        finally:
            if node0.poll() is None:
                node0.kill()
    result0 = subprocess.CompletedProcess(node0.args, node0.returncode, out0.read_text(), err0.read_text())
    return result0, node1, json.loads((logs / name / "manifest.json").read_text())


def _plant_when_node1_trains(run_dir: Path, plant) -> None:
    """Call ``plant(run_dir)`` once node 1's rank has written its first record (bounded wait)."""
    first = run_dir / "ranks" / "rank_1"
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and not any(first.glob("steps-*.jsonl")):
        time.sleep(0.05)
    plant(run_dir)


def _forged_outcome(run_dir: Path, digest: str, size_pad: int = 0) -> None:
    """Plant node 1's outcome: well-formed but bound to ``digest``, optionally padded past 16 KiB."""
    from traceml_tui.guard.outcome import build_outcome

    path = run_dir / "nodes" / "node_1" / "guard_outcome.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    outcome = build_outcome(run_name=run_dir.name, node_rank=1, nnodes=2, nproc_per_node=1,
                            contract_digest=digest, exit_code=0, completed_at=time.time())
    text = json.dumps(outcome)
    if size_pad:
        text = text[:-1] + ', "pad": "' + "x" * size_pad + '"}'
    path.write_text(text)


def test_two_nodes_completed(seed_dir: Path, tmp_path: Path) -> None:
    node0, node1, manifest = _two_nodes(seed_dir, tmp_path, "mn-ok", finalize_timeout="60")
    assert (node0.returncode, node1.returncode) == (0, 0), node0.stderr[-2000:] + node1.stderr[-2000:]
    training = manifest["guard"]["training"]
    assert training["status"] == "completed"
    assert training["nodes_expected"] == 2 and training["nodes_observed"] == 2
    assert training["nodes"] == [{"node_rank": 0, "exit_code": 0}, {"node_rank": 1, "exit_code": 0}]
    summary = json.loads((seed_dir / "logs/mn-ok/final_summary.json").read_text())
    assert summary["step_time"]["global"]["window"]["steps_analyzed"] == 5
    assert summary["run_context"]["execution"]["expected_nodes"] == 2


def test_two_nodes_one_training_fails(seed_dir: Path, tmp_path: Path) -> None:
    node0, node1, manifest = _two_nodes(seed_dir, tmp_path, "mn-fail", fail_node="1", finalize_timeout="60")
    assert node1.returncode != 0
    training = manifest["guard"]["training"]
    assert training["status"] == "incomplete"
    assert "node_training_failed" in training["reasons"]
    # the launcher exits with its own training command's code, never a collection verdict
    assert manifest["exit_code"] == node0.returncode


def test_two_nodes_one_never_reports(seed_dir: Path, tmp_path: Path) -> None:
    # node 1 launches from a folder without traceml.yaml: it trains but writes no guard outcome
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    started = time.monotonic()
    node0, node1, manifest = _two_nodes(seed_dir, tmp_path, "mn-missing", node1_dir=elsewhere)
    assert node0.returncode == 0 and node1.returncode == 0
    training = manifest["guard"]["training"]
    assert training["status"] == "incomplete"
    assert training["reasons"] == ["node_outcome_missing"]
    assert time.monotonic() - started < 120


def test_two_nodes_forged_outcome_conflicts(seed_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plant = lambda run_dir: _forged_outcome(run_dir, "sha256:" + "0" * 64)  # noqa: E731
    node0, node1, manifest = _two_nodes(seed_dir, tmp_path, "mn-forged", node1_dir=elsewhere, plant=plant)
    assert (node0.returncode, node1.returncode) == (0, 0), node0.stderr[-2000:] + node1.stderr[-2000:]
    assert manifest["guard"]["training"]["status"] == "incomplete"
    assert "node_outcome_conflict" in manifest["guard"]["training"]["reasons"]


def test_two_nodes_oversized_outcome_is_invalid(seed_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    digest = {}

    def plant(run_dir: Path) -> None:
        for _ in range(100):
            try:
                digest["d"] = json.loads((run_dir / "manifest.json").read_text())["guard"]["contract_digest"]
                break
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)
        _forged_outcome(run_dir, digest.get("d", "x"), size_pad=1 << 20)

    node0, node1, manifest = _two_nodes(seed_dir, tmp_path, "mn-huge", node1_dir=elsewhere, plant=plant)
    assert (node0.returncode, node1.returncode) == (0, 0), node0.stderr[-2000:] + node1.stderr[-2000:]
    assert manifest["guard"]["training"]["status"] == "incomplete"
    assert "node_outcome_invalid" in manifest["guard"]["training"]["reasons"]


def test_single_process_runs_directly_and_exit_code_propagates(tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text(
        "import traceml_tui as traceml\ntraceml.init()\nwith traceml.trace_step():\n    pass\nraise SystemExit(7)\n"
    )
    proc = _run(["run", "boom.py", "--run-name", "boom"], tmp_path, _env(tmp_path))
    assert proc.returncode == 7
    summary = json.loads((tmp_path / "logs/boom/final_summary.json").read_text())
    assert summary["run_context"]["run"]["status"] == "failed"
    assert "declaration" not in summary["run_context"]  # an ordinary run has no declaration
    assert not (tmp_path / "logs/boom/nodes/node_0/guard_outcome.json").exists()
