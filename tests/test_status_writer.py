"""`traceml status` and the writer's health (docs/daemon.md, "Writer health"): with nobody indexing it says so and
decides every state as of the index's last commit, not now; with a real `traceml daemon` process writing, it
decides at now and says nothing. Real parts: a copy of the committed hung DDP run whose ranks go on writing, a
real `traceml daemon` process, the real `traceml status` command; the rules of daemon/writer_health.py alone."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from daemon import writer_health as wh
from daemon.lock import DaemonInfo, find_running_daemon
from daemon.reader import Reader

from support import fixture_runs as fr

pytestmark = pytest.mark.timeout(240)

#: A rank silent this long is stalled here (`--stall-after`); the ranks below write every 0.2 s.
STALL_AFTER = 5.0
#: Generous waits: the machine is shared and loaded.
WAIT_S = 120.0


def _wait(predicate, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _status(cmd: list[str], env: dict, index: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([*cmd, "status", "--index", str(index), "--stall-after", str(STALL_AFTER), *args], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


class Ranks:
    """The copied run's ranks writing a step every 0.2 s on a thread, until stopped."""

    def __init__(self, run: Path) -> None:
        self.run, self.stop_event = run, threading.Event()
        self.thread = threading.Thread(target=self._go, daemon=True)

    def _go(self) -> None:
        while not self.stop_event.wait(0.2):
            fr.extend(self.run, 1)

    def __enter__(self) -> Ranks:
        fr.extend(self.run, 3)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)


def test_status_without_a_writer_says_so_and_decides_at_the_last_commit(tmp_path, cli_env, traceml_cmd):
    """A real daemon indexes a run whose ranks are live; while it runs, `traceml status` decides at now and prints
    no writer line. The daemon stops, the ranks stop with it; long after, the ranks are silent past the stall
    limit — yet status says `running` (as of the last commit, when they were live), with one line saying so;
    decided at now (what the reader says without the writer's health) the same run is `stalled`."""
    root = tmp_path / "logs"
    root.mkdir()
    run = fr.live_copy(root)
    index = tmp_path / "state" / "index.sqlite"
    proc = subprocess.Popen([*traceml_cmd, "daemon", str(root), "--index", str(index), "--poll-interval", "0.1"],
                            env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with Ranks(run):
            def current():
                out = _status(traceml_cmd, cli_env, index, "--json") if index.is_file() else None
                return json.loads(out.stdout) if out is not None and json.loads(out.stdout)["runs"] else None

            as_json = _wait(lambda: (got := current()) and got["writer"]["current"] and got, "the daemon caught up")
            assert as_json["writer"]["kind"] == "daemon" and as_json["writer"]["pid"] == proc.pid
            assert as_json["writer"]["roots"] == [os.path.realpath(root)]
            (run_json,) = as_json["runs"]
            assert run_json["status"] == "running"
            table = _status(traceml_cmd, cli_env, index)
            assert "running" in table.stdout and table.stderr == "", table
            proc.terminate()  # the writer stops while the ranks still write …
            assert proc.wait(timeout=60) == 0
        assert find_running_daemon(index) is None  # … and then the ranks stop too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stderr.close()

    with Reader(index, stall_floor_s=STALL_AFTER) as reader:
        last = reader.last_commit()
        # Long after: at now, the ranks' silence is a stall (the reader decides at now when told nothing else).
        _wait(lambda: str(reader.list_runs(now=time.time())[0].status) == "stalled", "the silence to pass the limit")
        at_commit = reader.list_runs(now=last)[0]
    assert last is not None and str(at_commit.status) == "running"

    shown = _status(traceml_cmd, cli_env, index)
    table = shown.stdout.splitlines()
    (row,) = [ln for ln in table if ln.startswith(run.name)]
    assert row.split()[1] == "running", table
    # one line, on stderr: the table on stdout stays only the table (scripts read its rows)
    assert shown.stderr == f"no writer — states as of {time.strftime('%H:%M:%S', time.localtime(last))}\n"
    assert len(table) == 2, table

    as_json = json.loads(_status(traceml_cmd, cli_env, index, "--json").stdout)
    assert as_json["writer"] == {"kind": "none", "pid": None, "roots": [], "unwatched": [], "started": None,
                                 "last_commit": last, "catching_up": False, "current": False, "decided_at": last}
    (run_json,) = as_json["runs"]
    assert run_json["status"] == "running"
    assert {r["rank"]: r["state"] for r in run_json["ranks"] if r["latest"]} == {0: "running", 1: "running"}
    oneline = _status(traceml_cmd, cli_env, index, "--oneline").stdout
    assert oneline.startswith("traceml: 1 running") and "stalled" not in oneline, oneline


# --------------------------------------------------------------------------- the rules (pure)


def _daemon(roots=("/data/logs",), started=None, mode="daemon") -> DaemonInfo:
    return DaemonInfo(pid=4242, roots=tuple(roots), index="index.sqlite", mode=mode, started=started)


def test_no_writer_decides_at_the_last_commit():
    h = wh.of_holder(None, 1000.0, 5000.0)
    assert (h.writer, h.running, h.current) == (wh.WRITER_NONE, False, False)
    assert h.as_of(5000.0) == 1000.0
    assert h.status_line().startswith("no writer — states as of ")
    assert wh.of_holder(None, None, 5000.0).as_of(5000.0) == 5000.0  # nothing committed: nothing to decide
    assert wh.of_holder(None, None, 5000.0).status_line() == "no writer — nothing committed yet"
    assert wh.of_holder(None, 6000.0, 5000.0).as_of(5000.0) == 5000.0  # a commit "after" now: never later than now


def test_a_writer_covering_the_roots_decides_at_now():
    h = wh.of_holder(_daemon(), 4990.0, 5000.0, asked=["/data/logs/exp1"])
    assert h.current and h.as_of(5000.0) == 5000.0 and h.status_line() is None
    assert h.who() == "daemon pid 4242"
    assert wh.of_holder(_daemon(mode="watch"), 4990.0, 5000.0).who() == "watch pid 4242"


def test_a_new_writer_catches_up_until_it_commits_or_the_grace_passes():
    started = 4995.0
    h = wh.of_holder(_daemon(started=started), 1000.0, 5000.0)  # took the lock after the last commit
    assert h.catching_up and not h.current and h.as_of(5000.0) == 1000.0
    assert h.status_line().startswith("daemon pid 4242 catching up — states as of ")
    assert not wh.of_holder(_daemon(started=started), 4996.0, 5000.0).catching_up  # it committed since
    later = started + wh.NEW_WRITER_GRACE_S + 1
    assert not wh.of_holder(_daemon(started=started), 1000.0, later).catching_up  # an idle index: the grace
    embedded = wh.embedded(os.getpid(), ["/data/logs"], started, 1000.0, 5000.0)
    assert embedded.catching_up and embedded.writer == wh.WRITER_EMBEDDED and embedded.who() == "this watch"


def test_a_writer_of_other_roots_does_not_cover_them():
    h = wh.of_holder(_daemon(), 4990.0, 5000.0, asked=["/data/mine", "/data/logs/exp1"])
    assert h.unwatched == ("/data/mine",) and h.covers and h.current  # one of the roots is indexed
    h = wh.of_holder(_daemon(), 1000.0, 5000.0, asked=["/data/mine"])
    assert h.unwatched == ("/data/mine",) and not h.covers and not h.current and h.as_of(5000.0) == 1000.0
    assert h.status_line().startswith("daemon pid 4242 indexes other roots — states as of ")
    assert not wh.under("/data/logs-old", ["/data/logs"]) and wh.under("/data/logs/a", ["/data/logs/"])


def test_coverage_remembers_when_the_roots_were_last_indexed(tmp_path):
    cov = wh.Coverage()
    assert cov.decide_at(100.0) == 100.0 and not cov.frozen  # never seen a writer: now
    cov.observe(wh.of_holder(_daemon(roots=[str(tmp_path)]), 99.0, 100.0), 100.0)
    assert not cov.frozen and cov.decide_at(101.0) == 101.0
    cov.observe(wh.of_holder(None, 99.0, 130.0), 130.0)  # the writer left
    assert cov.frozen and cov.decide_at(130.0) == 100.0
    assert cov.takeover_roots(["/data/mine"]) == ["/data/mine", str(tmp_path)]  # the leaver's roots, still folders
    cov.observe(wh.embedded(os.getpid(), ["/data/mine"], 130.0, 99.0, 131.0), 131.0)  # taken over, catching up
    assert cov.frozen and cov.decide_at(131.0) == 100.0
    cov.observe(wh.embedded(os.getpid(), ["/data/mine"], 130.0, 132.0, 133.0), 133.0)  # it committed
    assert not cov.frozen and cov.decide_at(133.0) == 133.0
