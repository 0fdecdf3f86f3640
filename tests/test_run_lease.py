"""A dead launcher or node is `lost` on every surface: real `traceml run` launches (2-rank gloo DDP, and a
2-node run of two launchers on this machine) whose launcher is SIGKILLed, a real `traceml daemon --metrics`
process ingesting them, and the real `traceml status` table, `--json`, `--oneline` and Prometheus scrape.

The launchers run with a 4-second lease (``TRACEML_LAUNCHER_LEASE_S``; docs/run.md, "Launcher lease").
Nothing here asserts a wall-clock time: each test waits for a condition with a generous timeout and checks
the words seen on the way (issue 24's acceptance items).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest

from daemon.reader import Reader
from traceml_tui.core import lease as core_lease
from traceml_tui.core.rundir import RunDir

from support.realruns import DDP_SCRIPT, TRACEML, _Launch, count_steps, subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")]

LEASE_S = "4"
#: Words a run may show after its launcher died and before its lease expired: never a final word.
TRANSITIONAL = {"running", "stalled"}
WAIT_S = 120.0  # generous: a loaded 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate: Callable[[], object], timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


@dataclass
class Daemon:
    root: Path
    index: Path
    url: str
    env: dict
    work: Path

    def cli(self, *args: str) -> str:
        proc = subprocess.run([*TRACEML, "status", "--index", str(self.index), *args], env=self.env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def json_run(self, name: str) -> Optional[dict]:
        runs = json.loads(self.cli("--json"))["runs"]
        return next((r for r in runs if r["name"] == name), None)

    def table_cell(self, name: str) -> Optional[str]:
        """The STATUS cell of the run's table row."""
        lines = self.cli().splitlines()
        start = lines[0].index("STATUS")
        end = lines[0].index("RANKS")
        row = next((line for line in lines[1:] if line.split(" ", 1)[0] == name), None)
        return None if row is None else row[start:end].strip()

    def oneline(self, root: Path) -> str:
        return self.cli("--oneline", str(root)).strip()

    def metrics(self, name: str) -> tuple[Optional[str], set[str]]:
        """The run's `traceml_run_status` word (the label at 1) and its `traceml_run_lost_node` nodes."""
        with urllib.request.urlopen(self.url, timeout=10) as resp:
            text = resp.read().decode()
        word, nodes = None, set()
        for line in text.splitlines():
            if f'run="{name}"' not in line or line.startswith("#"):
                continue
            labels, value = line.rsplit(" ", 1)
            if labels.startswith("traceml_run_status{") and float(value) == 1.0:
                word = labels.split('status="', 1)[1].split('"', 1)[0]
            elif labels.startswith("traceml_run_lost_node{") and float(value) == 1.0:
                nodes.add(labels.split('node="', 1)[1].split('"', 1)[0])
        return word, nodes

    def launch(self, sub: str, name: str, *run_args: str, log: str = "") -> _Launch:
        args = [str(DDP_SCRIPT), "--run-name", name, "--logs-dir", str(self.root / sub), *run_args,
                "--args", "--steps", "100000", "--sleep", "0.05", "--pid-dir", str(self.work / f"pids-{name}{log}")]
        env = dict(self.env, **{core_lease.LEASE_ENV: LEASE_S})
        return _Launch(args, self.work, env, self.work / f"{name}{log}", self.work / f"pids-{name}{log}")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    work = tmp_path_factory.mktemp("lease")
    root = work / "logs"
    root.mkdir()
    env = subprocess_env(work / "state")
    index = work / "index.sqlite"
    port = _free_port()
    with open(work / "daemon.err", "wb") as err:
        proc = subprocess.Popen([*TRACEML, "daemon", str(root), "--index", str(index), "--rescan-interval", "0.3",
                                 "--poll-interval", "0.3", "--metrics", f"127.0.0.1:{port}"],
                                env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    d = Daemon(root, index, f"http://127.0.0.1:{port}/metrics", env, work)

    def up() -> bool:
        try:
            return "traceml_index_up 1.0" in urllib.request.urlopen(d.url, timeout=5).read().decode()
        except OSError:
            return False

    try:
        _wait(up, WAIT_S, "the daemon's metrics endpoint")
        yield d
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _all_surfaces_say(d: Daemon, name: str, root: Path, word: str) -> None:
    """Wait until the table, --json, --oneline and the metrics all show ``word`` for the run."""
    _wait(lambda: (d.json_run(name) or {}).get("status") == word, WAIT_S, f"status --json saying {word}")
    _wait(lambda: (d.table_cell(name) or "").split(" ")[0] == word, WAIT_S, f"the status table saying {word}")
    _wait(lambda: d.oneline(root) == f"traceml: 1 {word}", WAIT_S, f"status --oneline saying {word}")
    _wait(lambda: d.metrics(name)[0] == word, WAIT_S, f"traceml_run_status saying {word}")


class _Watch(threading.Thread):
    """Every word the index reader (what every surface shows) gives the run, as often as it can, until stopped."""

    def __init__(self, index: Path, name: str) -> None:
        super().__init__(daemon=True)
        self.index, self.name = index, name
        self.words: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                with Reader(self.index) as reader:
                    run = next((r for r in reader.list_runs() if r.name == self.name), None)
            except Exception:  # noqa: BLE001 - the index being written: look again
                continue
            if run is not None and (not self.words or self.words[-1] != str(run.status)):
                self.words.append(str(run.status))


def test_a_launcher_killed_before_any_rank_wrote_is_lost_within_its_lease(daemon: Daemon) -> None:
    name, sub = "killed-at-start", "start"
    run_dir = daemon.root / sub / name
    with daemon.launch(sub, name) as launch:
        lease = RunDir(run_dir).lease(0)
        _wait(lease.exists, WAIT_S, "the launcher's first beat", every=0.005)
        launch.proc.kill()  # SIGKILL, as soon as the run folder is there: nothing could forward it
        launch.proc.wait(timeout=30)
        assert all(count_steps(run_dir, r) == 0 for r in (0, 1)), "a rank wrote before the kill"
        assert json.loads((run_dir / "manifest.json").read_text())["status"] == "running"
        _all_surfaces_say(daemon, name, daemon.root / sub, "lost")
        # the launcher's node is not named: the run's word says it (core.state.lost_nodes)
        assert daemon.json_run(name)["lost_nodes"] == [] and daemon.table_cell(name) == "lost"


def test_a_launcher_killed_mid_run_is_never_given_a_final_word_before_lost(daemon: Daemon) -> None:
    name, sub = "killed-mid-run", "mid"
    run_dir = daemon.root / sub / name
    with daemon.launch(sub, name, "--nproc-per-node", "2") as launch:
        _wait(lambda: min(count_steps(run_dir, 0), count_steps(run_dir, 1)) >= 5, WAIT_S, "5 steps of each rank")
        _wait(lambda: (daemon.json_run(name) or {}).get("status") == "running", WAIT_S, "the run shown running")
        watch = _Watch(daemon.index, name)
        watch.start()
        seen: list[tuple[str, str]] = []  # (surface, word) as the real commands and the scrape showed them
        launch.proc.kill()
        launch.proc.wait(timeout=30)
        try:
            def lost_on_json() -> bool:
                word = daemon.json_run(name)["status"]
                seen.append(("json", word))
                seen.append(("metrics", daemon.metrics(name)[0]))
                seen.append(("table", daemon.table_cell(name).split(" ")[0]))
                return word == "lost"

            _wait(lost_on_json, WAIT_S, "status --json saying lost", every=0.0)
        finally:
            watch.stop.set()
            watch.join(timeout=10)
        # the ranks did end: the dying launcher's SIGTERM reached them (`terminated`), which alone once read
        # as `interrupted`, a final word nobody wrote
        ends = [json.loads(line) for r in (0, 1)
                for line in (run_dir / "ranks" / f"rank_{r}" / "steps-0.jsonl").read_text().splitlines()
                if '"rank_end"' in line]
        assert ends, "no rank wrote its end"
        words = watch.words
        assert words and words[-1] == "lost", words
        assert set(words[:-1]) <= TRANSITIONAL, f"a word before lost that is not transitional: {words}"
        first_lost = {surface: i for i, (surface, word) in reversed(list(enumerate(seen))) if word == "lost"}
        for i, (surface, word) in enumerate(seen):
            if i < first_lost.get(surface, len(seen)):
                assert word in TRANSITIONAL, f"{surface} said {word} before lost: {seen}"
        _all_surfaces_say(daemon, name, daemon.root / sub, "lost")


def test_a_node_whose_launcher_was_killed_is_named_lost(daemon: Daemon) -> None:
    name, sub = "two-nodes", "multi"
    run_dir = daemon.root / sub / name
    port = str(_free_port())
    topology = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port]
    with daemon.launch(sub, name, *topology, "--node-rank", "0", log="-n0") as node0, \
            daemon.launch(sub, name, *topology, "--node-rank", "1", log="-n1") as node1:
        _wait(lambda: min(count_steps(run_dir, 0), count_steps(run_dir, 1)) >= 5, WAIT_S, "5 steps of each node")
        node1.proc.kill()  # node 1's launcher dies; node 0's goes on and finishes the run (its rank then fails)
        node1.proc.wait(timeout=30)

        def named() -> Optional[dict]:
            run = daemon.json_run(name)
            return run if run and run["lost_nodes"] == [1] else None

        run = _wait(named, WAIT_S, "status --json naming node 1 lost")
        assert run["status"] != "lost", run["status"]  # node 0's launcher lives, or wrote the final word
        node0.proc.wait(timeout=WAIT_S)
        run = _wait(lambda: (r := named()) and r["manifest_status"] != "running" and r, WAIT_S,
                    "node 0's final word ingested")
        assert run["status"] == "failed" and run["lost_nodes"] == [1]
        cell = daemon.table_cell(name)
        assert cell.startswith("failed") and cell.endswith("· lost node 1"), cell
        oneline = daemon.oneline(daemon.root / sub)
        assert oneline.startswith("traceml: 1 failed") and oneline.endswith("lost node 1"), oneline
        _wait(lambda: daemon.metrics(name) == ("failed", {"1"}), WAIT_S, "the metrics naming node 1 lost")
        assert os.path.exists(RunDir(run_dir).lease(1))


def test_a_resume_judges_the_lease_by_its_folders_clock_and_its_own_length(tmp_path, monkeypatch):
    """`--resume` refuses while the run's lease beats (run/lease.py still_beating). Found by an independent review:
    it compared the lease's mtime with this machine's clock, so a node 90 s ahead of the file server took a
    beating lease for an old one; and it gave up after two beats where the daemon waits a lease length."""
    import os
    import time as clock

    from traceml_tui.core import lease as core_lease
    from traceml_tui.run.lease import LeaseKeeper, still_beating

    path = tmp_path / "node_0" / "launcher.lease"
    path.parent.mkdir()
    keeper = LeaseKeeper(path, 0, lease_s=1.2).start()  # beats every 0.2 s
    real = clock.time
    monkeypatch.setattr(clock, "time", lambda: real() + 90.0)  # this node's clock 90 s ahead
    said: list[str] = []
    try:
        assert still_beating(path, said.append) is True
    finally:
        keeper.finish()
        monkeypatch.setattr(clock, "time", real)
    assert still_beating(path, said.append) is False  # done: at once
    # a launch killed moments ago: `live`, changed just now, then no more beats: gone once a lease length passed
    path.write_bytes(core_lease.encode(node=0, launch="k", beat=3, lease_s=1.2))
    started = clock.monotonic()
    assert still_beating(path, said.append) is False
    assert clock.monotonic() - started >= 1.0 and "lease of 1.2 s" in said[-1]
    path.unlink()
    os.mkfifo(path)  # a FIFO planted there is never waited on
    assert still_beating(path, said.append) is False
