"""The daemon as users run it: real `traceml daemon` / `traceml status` subprocesses."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon.lock import find_running_daemon
from daemon.reader import Reader

from support import python_env
from support.daemon_files import append_raw, step_line, steps_path, write_steps, writer_command


def _wait(predicate, timeout: float, interval: float = 0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def _daemon(traceml_cmd, cli_env, *args) -> subprocess.Popen:
    return subprocess.Popen([*traceml_cmd, "daemon", *map(str, args)], env=cli_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _lines_on_disk(path: Path) -> set[int]:
    steps = set()
    data = path.read_bytes()
    for line in data[: data.rfind(b"\n") + 1].splitlines()[1:]:
        steps.add(json.loads(line)["step"])
    return steps


@pytest.mark.faults
def test_sigkilled_daemon_ingests_every_line_exactly_once(tmp_path, traceml_cmd, cli_env):
    root = tmp_path / "logs"
    index = tmp_path / "idx" / "index.sqlite"
    run_dir = root / "killrun"
    writers = []
    for rank in range(4):
        path = steps_path(run_dir, rank)
        path.parent.mkdir(parents=True)
        writers.append(subprocess.Popen(writer_command(path, rank, 100000, rank), env=python_env()))
    rng = random.Random(4)
    kills = 0
    # Fifty kills is the point, not their pace: a loaded machine starts daemons slower (42 kills in 60 s once,
    # under four pytest workers on two cores), so the bound only stops a daemon that never starts.
    deadline = time.monotonic() + 300
    while kills < 50 and time.monotonic() < deadline:
        proc = _daemon(traceml_cmd, cli_env, root, "--index", index, "--poll-interval", "0.05",
                       "--rescan-interval", "0.2", *(["--no-inotify"] if kills % 2 else []))
        if kills % 3:  # most kills land while ingesting (after the lock is taken), the rest anywhere in startup
            _wait(lambda p=proc: (find_running_daemon(index) or None) and find_running_daemon(index).pid == p.pid, 5)
        time.sleep(rng.uniform(0.05, 0.4))
        proc.kill()
        proc.wait()
        kills += 1
    for w in writers:
        w.kill() if w.poll() is None else None
        w.wait()
    assert kills >= 50
    final = subprocess.run([*traceml_cmd, "daemon", str(root), "--index", str(index), "--once"], env=cli_env,
                           capture_output=True, text=True, timeout=120)
    assert final.returncode == 0, final.stderr
    late = int(final.stdout.split("ingested ")[1].split()[0])
    con = sqlite3.connect(index)
    total_disk = 0
    for rank in range(4):
        disk = _lines_on_disk(steps_path(run_dir, rank))
        total_disk += len(disk)
        rows = [r[0] for r in con.execute("SELECT step FROM steps WHERE rank = ? ORDER BY step", (rank,))]
        assert len(rows) == len(set(rows))
        assert set(rows) == disk
    count, distinct = con.execute(
        "SELECT count(*), count(DISTINCT run_id || '/' || rank || '/' || attempt || '/' || step) FROM steps").fetchone()
    assert count == distinct == total_disk > 0
    assert late < total_disk  # the killed daemons had ingested part of it
    assert con.execute("SELECT count(*) FROM errors").fetchone()[0] == 0
    with Reader(index) as r:
        run = r.find_run("killrun")
        assert run.records == total_disk
        assert sum(k.records for k in r.rank_rows(run.run_id)) == total_disk


def test_polling_makes_appends_visible_within_two_intervals(tmp_path, traceml_cmd, cli_env):
    root = tmp_path / "logs"
    index = tmp_path / "index.sqlite"
    path = write_steps(root / "r", 0, range(1, 3))
    poll = 1.0
    proc = _daemon(traceml_cmd, cli_env, root, "--index", index, "--poll-interval", poll, "--no-inotify")
    try:
        assert _wait(lambda: index.exists() and _last_step(index) == 2, 30)
        for step in (3, 4, 5):
            time.sleep(random.uniform(0, poll))
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-c", "import sys; from support.daemon_files import append_raw, step_line;"
                            f"append_raw(__import__('pathlib').Path(sys.argv[1]), step_line('r', 0, {step}))",
                            str(path)], check=True, env=python_env())
            written = time.monotonic()
            assert _wait(lambda s=step: _last_step(index) == s, 10, 0.005)
            assert time.monotonic() - written < 2 * poll, f"step {step} took {time.monotonic() - t0:.2f}s"
    finally:
        _stop(proc)
    assert proc.returncode == 0


def _last_step(index: Path):
    try:
        with Reader(index) as r:
            runs = r.list_runs()
            return runs[0].last_step if runs else None
    except (FileNotFoundError, sqlite3.Error):
        return None


@pytest.mark.faults
def test_second_daemon_on_the_same_index_refuses(tmp_path, traceml_cmd, cli_env):
    root = tmp_path / "logs"
    root.mkdir()
    index = tmp_path / "index.sqlite"
    first = _daemon(traceml_cmd, cli_env, root, "--index", index, "--poll-interval", "0.1")
    try:
        # the lock is taken a moment before the writer's details are in it (a DaemonInfo without a pid till then)
        info = _wait(lambda: (found := find_running_daemon(index)) is not None and found.pid is not None and found, 30)
        assert info and info.pid == first.pid and info.roots == (str(root.resolve()),)
        second = subprocess.run([*traceml_cmd, "daemon", str(root), "--index", str(index), "--once"], env=cli_env,
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert f"pid {first.pid}" in second.stderr and "already writes the index" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        _stop(first)
    assert first.returncode == 0
    assert find_running_daemon(index) is None


def test_index_on_a_network_filesystem_is_refused(tmp_path, traceml_cmd, cli_env):
    root = tmp_path / "logs"
    root.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nfiler:/export {shared} nfs4 rw,relatime 0 0\n")
    env = dict(cli_env, TRACEML_MOUNTS_FILE=str(mounts))
    out = subprocess.run([*traceml_cmd, "daemon", str(root), "--index", str(shared / "sub" / "index.sqlite"), "--once"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "network filesystem (nfs4)" in out.stderr and "Traceback" not in out.stderr
    assert not (shared / "sub" / "index.sqlite").exists()
    ok = subprocess.run([*traceml_cmd, "daemon", str(root), "--index", str(tmp_path / "local.sqlite"), "--once"],
                        env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.faults
def test_fifo_does_not_block_and_status_reports(tmp_path, traceml_cmd, cli_env):
    root = tmp_path / "logs"
    write_steps(root / "a", 0, range(1, 11))
    write_steps(root / "a", 1, range(1, 6))
    fifo = steps_path(root / "b", 0)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    append_raw(steps_path(root / "a", 1), b"{broken\n")
    index = tmp_path / "index.sqlite"
    out = subprocess.run([*traceml_cmd, "daemon", str(root), "--index", str(index), "--once"], env=cli_env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    js = subprocess.run([*traceml_cmd, "status", "--index", str(index), "--json"], env=cli_env, capture_output=True,
                        text=True, timeout=60)
    assert js.returncode == 0, js.stderr
    runs = {r["name"]: r for r in json.loads(js.stdout)["runs"]}
    a = runs["a"]
    assert a["dir"] == str((root / "a").resolve()) and a["status"] in ("running", "stalled")
    assert a["error_count"] == 1
    assert [(k["rank"], k["attempt"], k["records"], k["last_step"]) for k in a["ranks"]] == [(0, 0, 10, 10), (1, 0, 5, 5)]
    assert a["ranks"][0]["last_record_ts"] == 1010.0
    assert runs["b"]["ranks"] == []
    line = subprocess.run([*traceml_cmd, "status", "--index", str(index), "--oneline", "--stall-after", "3600"],
                          env=cli_env, capture_output=True, text=True, timeout=60)
    # "a"'s records are stamped decades before the ingester read them: its ranks are stalled; "b" has no records
    assert line.stdout.strip() == "traceml: 1 stalled · 1 running · silent r0,r1"
    missing = subprocess.run([*traceml_cmd, "status", "--index", str(tmp_path / "nope.sqlite")], env=cli_env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no index at" in missing.stderr and "Traceback" not in missing.stderr


def test_daemon_never_imports_textual_or_torch(tmp_path):
    root = tmp_path / "logs"
    write_steps(root / "r", 0, range(1, 4))
    code = (
        "import sys;"
        "import daemon.cli, daemon.status_cli, daemon.reader, daemon.service;"
        "from daemon.service import Ingester;"
        "ing = Ingester(sys.argv[1] + '/i.sqlite', [sys.argv[2]]); n = ing.run_once(); ing.close();"
        "daemon.status_cli.main(['--index', sys.argv[1] + '/i.sqlite']);"
        "bad = [m for m in ('textual', 'torch') if m in sys.modules]; assert n == 3, n;"
        "print('BAD' if bad else 'CLEAN', bad)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(root)], capture_output=True, text=True,
                         timeout=60, env=python_env())
    assert out.returncode == 0, out.stderr
    assert "CLEAN" in out.stdout


def test_bad_arguments_give_one_line_and_exit_2(tmp_path, traceml_cmd, cli_env):
    out = subprocess.run([*traceml_cmd, "daemon", str(tmp_path / "nowhere"), "--once"], env=cli_env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "root is not a folder" in out.stderr and "Traceback" not in out.stderr
    assert not Path(cli_env["XDG_STATE_HOME"], "traceml", "index.sqlite").exists()


@pytest.mark.faults
def test_run_folder_deleted_while_the_daemon_reads_it(tmp_path, traceml_cmd, cli_env):
    root = tmp_path / "logs"
    index = tmp_path / "index.sqlite"
    doomed = steps_path(root / "doomed", 0)
    doomed.parent.mkdir(parents=True)
    writer = subprocess.Popen(writer_command(doomed, 0, 1000000, 7), env=python_env())
    write_steps(root / "alive", 0, range(1, 3))
    proc = _daemon(traceml_cmd, cli_env, root, "--index", index, "--poll-interval", "0.05", "--rescan-interval", "0.2")
    try:
        assert _wait(lambda: _records(index, "doomed") > 100, 30)
        shutil.rmtree(root / "doomed", ignore_errors=True)
        writer.kill()
        writer.wait()
        shutil.rmtree(root / "doomed", ignore_errors=True)
        assert _wait(lambda: _status(index, "doomed") == "missing", 30)
        append_raw(steps_path(root / "alive", 0), step_line("alive", 0, 3))
        assert _wait(lambda: _last(index, "alive") == 3, 30)
        assert proc.poll() is None  # still serving
    finally:
        _stop(proc)
    assert proc.returncode == 0, proc.stderr.read()
    assert _records(index, "doomed") > 100  # rows of a removed run are kept


def _find(index: Path, name: str):
    try:
        with Reader(index) as r:
            return r.find_run(name)
    except (FileNotFoundError, sqlite3.Error):
        return None


def _records(index: Path, name: str) -> int:
    run = _find(index, name)
    return run.records if run else 0


def _status(index: Path, name: str):
    run = _find(index, name)
    return run.status if run else None


def _last(index: Path, name: str):
    run = _find(index, name)
    return run.last_step if run else None


def test_embedded_ingester_announces_itself_and_stops(tmp_path):
    from daemon.service import Ingester

    root = tmp_path / "logs"
    path = write_steps(root / "r", 0, range(1, 4))
    index = tmp_path / "index.sqlite"
    ing = Ingester(index, [str(root)], poll_interval=0.05, use_inotify=True, mode="embedded")
    ing.start()
    try:
        info = find_running_daemon(index)
        assert info is not None and info.mode == "embedded" and info.pid == os.getpid()
        append_raw(path, step_line("r", 0, 4))
        assert _wait(lambda: _last(index, "r") == 4, 10)
    finally:
        ing.stop()
    assert find_running_daemon(index) is None


def test_an_ingester_dropped_without_close_does_not_keep_the_index_locked(tmp_path):
    """An ingester that is simply dropped (a caller forgot close()) lets the lock go with it: another writer
    may open the index in the same process, and no lock named after the index file's inode stays held for
    a later index that reuses the inode number."""
    import gc

    from daemon.service import IndexLockedError, Ingester

    root = tmp_path / "logs"
    write_steps(root / "r", 0, range(1, 4))
    index = tmp_path / "index.sqlite"
    first = Ingester(index, [str(root)], use_inotify=False)
    first.run_once()
    with pytest.raises(IndexLockedError):
        Ingester(index, [str(root)], use_inotify=False).open()  # held while the first one lives
    del first
    gc.collect()
    assert find_running_daemon(index) is None
    second = Ingester(index, [str(root)], use_inotify=False)
    try:
        assert second.run_once() == 0  # opened and writable; nothing new to read
    finally:
        second.close()


def test_a_lock_a_forked_child_still_shares_is_waited_for_not_refused(tmp_path):
    """A writer lock this process just released can still be held by a child another thread forked while it
    was ours (until the child's exec closes the inherited descriptor): the next writer in this process waits
    for it instead of refusing the index to itself; a lock it really holds is still refused at once."""
    from daemon import lock

    index = tmp_path / "index.sqlite"
    index.write_bytes(b"")  # an existing file: the lock named by its inode is taken too
    fd = lock.acquire_lock(index, [str(tmp_path)])
    with pytest.raises(lock.IndexLockedError):
        lock.acquire_lock(index, [str(tmp_path)])  # held by this process: refused at once
    pid = os.fork()
    if pid == 0:  # the child holds the inherited lock descriptors for a moment, as one before its exec
        time.sleep(0.3)
        os._exit(0)
    try:
        lock.release_lock(fd)
        again = lock.acquire_lock(index, [str(tmp_path)])  # waits for the child, then takes it
        lock.release_lock(again)
    finally:
        os.waitpid(pid, 0)
