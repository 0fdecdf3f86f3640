"""A killed launcher (or torchrun) leaves no training behind: real `traceml run`, real DDP ranks, SIGKILL.

The launcher starts training with a parent-death signal (core/lifeline.py): when
the launcher dies — even by SIGKILL, which nothing can forward — the kernel
sends SIGTERM to torchrun (or to the single training process), and torchrun
stops its ranks. The ranks themselves watch torchrun (sdk init()), so a
SIGKILLed torchrun does not leave them running either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from traceml_tui.core.rundir import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")]

TRACEML = [sys.executable, "-m", "traceml_tui"]

LONG_DDP = """
import time
from datetime import timedelta
import torch, torch.distributed as dist
import traceml_tui as traceml
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
traceml.init()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 100_000):
    with traceml.trace_step(model):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step(); opt.zero_grad()
        traceml.log(loss=loss)
    time.sleep(0.02)
"""

LONG_SINGLE = """
import time
import traceml_tui as traceml
traceml.init()
for step in range(1, 100_000):
    with traceml.trace_step():
        traceml.log(loss=1.0)
    time.sleep(0.02)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env.pop("TRACEML_RUN_DIR", None)
    return env


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _survivors(procs: list[psutil.Process]) -> str:
    """Each process still alive: its command, its signal masks and dispositions, and (where py-spy is installed)
    where each of its threads is — so a failure says why the parent-death signal did not end it."""
    import shutil

    out = []
    for proc in procs:
        if not _alive(proc):
            continue
        out.append(f"{proc.pid} {proc.cmdline()}")
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            out += [line for line in status if line.startswith(("State:", "SigPnd", "ShdPnd", "SigBlk", "SigIgn",
                                                                  "SigCgt"))]
        except OSError:
            pass
        if shutil.which("py-spy"):
            dump = subprocess.run(["py-spy", "dump", "--pid", str(proc.pid)], capture_output=True, text=True,
                                  timeout=60, check=False)
            out.append((dump.stdout + dump.stderr)[-4000:])
    return "\n".join(out)


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _start(tmp_path: Path, script: str, name: str, nproc: int) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "train.py").write_text(script)
    launcher = subprocess.Popen(
        [*TRACEML, "run", "train.py", "--run-name", name, "--nproc-per-node", str(nproc)],
        cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return launcher, tmp_path / "logs" / name


def _training_started(run_dir: Path, ranks: int) -> bool:
    files = RunDir(run_dir).step_files()
    return len(files) == ranks and all(f.path.stat().st_size > 600 for f in files)  # header + a few steps


def _kill_leftovers(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.mark.faults
@pytest.mark.parametrize(("script", "nproc"), [(LONG_DDP, 2), (LONG_SINGLE, 1)], ids=["ddp-2-ranks", "one-process"])
def test_sigkill_of_the_launcher_leaves_no_process_of_the_run(tmp_path: Path, script: str, nproc: int) -> None:
    """Item 13: SIGKILL of `traceml run` leaves no rank of the run alive (parent-death signal)."""
    launcher, run_dir = _start(tmp_path, script, "orphans", nproc)
    procs: list[psutil.Process] = []
    try:
        assert _wait(lambda: _training_started(run_dir, nproc), 90), "training never started"
        procs = psutil.Process(launcher.pid).children(recursive=True)
        ranks = [p for p in procs if "train.py" in " ".join(p.cmdline())]
        assert len(ranks) >= nproc, [p.cmdline() for p in procs]
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        # A wait for a condition, not a time limit: under load torchrun's own teardown of its ranks after the
        # parent-death signal took longer than 15 s once (the fresh-clone suite beside another one).
        assert _wait(lambda: not any(_alive(p) for p in procs), 45), _survivors(procs)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        _kill_leftovers(procs)


def test_sigkill_of_torchrun_stops_its_ranks_and_the_run_is_finalized(tmp_path: Path) -> None:
    launcher, run_dir = _start(tmp_path, LONG_DDP, "agent-killed", 2)
    procs: list[psutil.Process] = []
    try:
        assert _wait(lambda: _training_started(run_dir, 2), 90), "training never started"
        procs = psutil.Process(launcher.pid).children(recursive=True)
        agents = [p for p in psutil.Process(launcher.pid).children() if "torch.distributed.run" in p.cmdline()]
        assert len(agents) == 1, [p.cmdline() for p in procs]
        ranks = agents[0].children()
        assert len(ranks) == 2
        agents[0].kill()
        # A rank blocked in a gloo collective runs its SIGTERM handler only once the collective fails (its peer
        # gone): seconds on a loaded 2-core machine, so the bound is generous; a rank left running fails it.
        assert _wait(lambda: not any(_alive(p) for p in ranks), 60), [p.pid for p in ranks if _alive(p)]
        launcher.wait(timeout=60)  # the launcher sees training end and finalizes the run
        assert launcher.returncode != 0
        manifest = (run_dir / "manifest.json").read_text()
        assert '"status": "failed"' in manifest or '"status":"failed"' in manifest
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        _kill_leftovers(procs)
