"""The daemon's threads leave the asynchronous signals to the thread that acts on them (traceml_tui/core/signals.py).

The kernel hands a signal sent to a process to any thread that does not block it, and Python runs the handler
on the main thread only, at its next bytecode: a SIGTERM the inotify reader or the metrics server took waited
for the serving main thread's next wake (its poll interval). `traceml daemon` serves on its main thread; `traceml
watch` runs the embedded ingester on a thread of its own while the App's loop holds the main thread. Each
thread they start is started shielded, and the decode process, started from a shielded thread, unblocks its
signals first.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import signal
import socket
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest

from daemon import cold, service
from traceml_tui.core.signals import shielded

from support.daemon_files import write_steps
from support.procfs import blocked_signals
from support.waiting import until

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads signal masks in /proc")


def _task_masks(pid: int) -> dict[int, set[int]]:
    """Each thread of process ``pid`` (its task id) and the signals it blocks."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("SigBlk:"):
                mask = int(line.split()[1], 16)
                out[int(task.name)] = {n for n in range(1, 65) if mask >> (n - 1) & 1}
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_running_daemon_takes_sigterm_on_its_serving_thread_only(tmp_path, traceml_cmd, cli_env):
    root = tmp_path / "logs"
    write_steps(root / "r", 0, range(1, 4))
    port = _free_port()
    proc = subprocess.Popen([*traceml_cmd, "daemon", str(root), "--index", str(tmp_path / "index.sqlite"),
                             "--metrics", f"127.0.0.1:{port}"], env=cli_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def scraped() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                return b"traceml_" in reply.read()
        except OSError:
            return False

    try:
        assert until(scraped), "the daemon never served its metrics"
        # the inotify reader and the metrics server are running (a scrape was answered on a request thread)
        # (the main thread blocks them only for the instant it starts a thread: wait until it serves)
        assert until(lambda: len(m := _task_masks(proc.pid)) >= 3 and signal.SIGTERM not in m[proc.pid]), \
            _task_masks(proc.pid)
        masks = _task_masks(proc.pid)
        assert signal.SIGTERM not in masks[proc.pid]  # the main thread serves and acts on it
        helpers = {tid: mask for tid, mask in masks.items() if tid != proc.pid}
        assert helpers and all({signal.SIGTERM, signal.SIGINT, signal.SIGHUP} <= m for m in helpers.values()), masks
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_embedded_ingester_and_its_watcher_leave_signals_to_the_main_thread(tmp_path):
    """`traceml watch` without a daemon: the ingester's thread and the inotify reader it starts are shielded."""
    root = tmp_path / "logs"
    write_steps(root / "r", 0, range(1, 4))
    before = {t.native_id for t in threading.enumerate()}
    ingester = service.Ingester(str(tmp_path / "index.sqlite"), [str(root)])
    ingester.start()
    try:
        assert until(lambda: ingester.records_ingested >= 3)
        started = [t for t in threading.enumerate() if t.native_id not in before and t.name.startswith("traceml-")]
        assert {t.name for t in started} >= {"traceml-ingester", "traceml-inotify"}, started
        for thread in started:
            assert signal.SIGTERM in blocked_signals(thread.native_id), thread.name
        assert signal.SIGTERM not in blocked_signals(threading.get_native_id())
    finally:
        ingester.stop()


def _own_blocked() -> set[int]:
    """The signals the calling process's main thread blocks (run in the decode process)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    return set()


def test_the_decode_process_started_from_a_shielded_thread_keeps_its_signals():
    """The cold path's decode pool is first used from the ingester's thread (shielded in `traceml watch`) inside a
    shielded block: the process it starts inherits that mask through exec and unblocks it first."""
    pool = cold.decode_worker(concurrent.futures, multiprocessing)
    try:
        with shielded():
            future = pool.submit(_own_blocked)
        blocked = future.result(timeout=120)
        assert signal.SIGTERM not in blocked and signal.SIGINT not in blocked, blocked
        assert os.getpid() != future.result()  # (a process of its own: the result came back through the pool)
    finally:
        pool.shutdown(wait=True)
