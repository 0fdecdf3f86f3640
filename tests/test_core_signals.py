"""Threads traceml starts leave the asynchronous signals to the main thread (traceml_tui/core/signals.py;
docs/run.md, "Signals"): a scheduler that suspends a job and then cancels it (SIGSTOP, SIGTERM, SIGCONT) once
had its SIGTERM taken by a helper thread of `traceml run`, and the launcher, waiting for torchrun in the main
thread, never acted on it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from traceml_tui.core.signals import SYNCHRONOUS_SIGNALS, shielded, unshielded

from support.procfs import blocked_signals, ignored_signals, process_blocked_signals
from support.waiting import until

TRACEML = [sys.executable, "-m", "traceml_tui"]
PROC_TASKS = Path("/proc/self/task")


@pytest.mark.skipif(not PROC_TASKS.is_dir(), reason="reads the threads' signal masks in /proc")
def test_a_thread_started_shielded_blocks_every_asynchronous_signal_and_the_caller_keeps_its_mask():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    ready, done = threading.Event(), threading.Event()

    def body() -> None:
        ready.set()
        done.wait(30)

    with shielded():
        thread = threading.Thread(target=body, daemon=True)
        thread.start()
    try:
        assert ready.wait(30)
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before  # the caller's mask is back
        blocked = blocked_signals(thread.native_id)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD, signal.SIGALRM):
            assert sig in blocked, sig.name
        for sig in SYNCHRONOUS_SIGNALS:
            assert sig not in blocked, signal.Signals(sig).name  # a fault belongs to the thread that raised it
        assert signal.SIGTERM not in blocked_signals(threading.get_native_id())
    finally:
        done.set()
        thread.join(30)


@pytest.mark.skipif(not PROC_TASKS.is_dir(), reason="reads the signal masks in /proc")
def test_a_process_started_unshielded_from_a_shielded_thread_keeps_its_signals():
    """A child inherits its starting thread's mask through exec: started plainly from a shielded thread (the
    launcher's drainer dispatch) it blocks SIGTERM; started inside ``unshielded()`` it does not, and the thread
    is shielded again after."""
    seen: dict[str, object] = {}

    def body() -> None:
        plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        with unshielded():
            free = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        seen["thread_after"] = blocked_signals(threading.get_native_id())
        seen["children"] = (plain, free)

    with shielded():
        thread = threading.Thread(target=body, daemon=True)
        thread.start()
    thread.join(60)
    plain, free = seen["children"]  # type: ignore[misc]
    try:
        assert signal.SIGTERM in process_blocked_signals(plain.pid)  # the hazard
        assert signal.SIGTERM not in process_blocked_signals(free.pid)
        assert signal.SIGTERM in seen["thread_after"]  # type: ignore[operator]
        free.terminate()
        assert free.wait(timeout=60) == -signal.SIGTERM
    finally:
        for child in (plain, free):
            child.kill()
            child.wait(30)


def _wait_for(predicate, timeout: float = 120.0) -> bool:
    return until(predicate, timeout)


@pytest.mark.timeout(300)  # a real launch of one process (about a second)
def test_a_suspended_launcher_cancelled_with_sigterm_ends_as_a_plain_sigterm_ends_it(tmp_path: Path) -> None:
    """SIGSTOP, SIGTERM, SIGCONT — what `scontrol suspend` then `scancel` do — ends `traceml run` as a SIGTERM
    alone does (tests/test_run_lifecycle.py): exit 143, an interrupted run. Before the launcher's threads were
    started shielded, the SIGTERM landed on one of them and the launcher went on waiting for training."""
    (tmp_path / "slow.py").write_text(
        "import time\nimport traceml_tui as traceml\nfor _ in range(100000):\n"
        "    with traceml.trace_step():\n        time.sleep(0.01)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen([*TRACEML, "run", "slow.py", "--run-name", "cancel"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    steps = tmp_path / "logs/cancel/ranks/rank_0/steps-0.jsonl"
    try:
        assert _wait_for(lambda: steps.exists() and steps.read_bytes().count(b"\n") >= 6), "no step recorded"
        for _ in range(3):  # its helper threads are all running by now (sampler, lease, log copies)
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.01)
            proc.send_signal(signal.SIGCONT)
            if _wait_for(lambda: proc.poll() is not None, timeout=2.0):
                break
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    manifest = json.loads((tmp_path / "logs/cancel/manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["exit_code"] == proc.returncode


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the signal dispositions in /proc")
def test_finalizing_a_run_in_this_process_leaves_its_signal_dispositions_as_they_were(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """The launcher ignores SIGINT and SIGTERM for its last writes. `finalize` used to leave them so: a test
    process that finalized a run in-process (tests/test_run_lifecycle.py) ignored SIGTERM from then on, every
    child it started afterwards inherited that (an ignored signal survives exec), and the SDK's SIGTERM tests'
    children on that worker slept through their SIGTERM."""
    from traceml_tui.guard.config import load_config
    from traceml_tui.run import cli as run_cli
    from traceml_tui.run.launch import Launcher

    (tmp_path / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    launcher = Launcher(run_cli.parse_options(["train.py", "--run-name", "dispositions"]), load_config(None))
    launcher.prepare()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    launcher.finalize(0)
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert json.loads((tmp_path / "logs/dispositions/manifest.json").read_text())["status"] == "completed"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert signal.SIGTERM not in ignored_signals(child.pid) and signal.SIGINT not in ignored_signals(child.pid)
        child.terminate()
        assert child.wait(timeout=60) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
