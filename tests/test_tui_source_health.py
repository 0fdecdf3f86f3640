"""The data source in the header of `traceml watch`: who writes the index, how fresh it is, and the takeover
when the writer exits (docs/watch.md, "Data source"). Real parts: copies of the committed real runs, the real
ingester (embedded, as a watch holds it) and a real `traceml daemon` process, the real App via run_test."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from daemon import service
from daemon.lock import DaemonInfo, find_running_daemon
from traceml_tui.core.state import commit_overdue
from traceml_tui.tui import cli as watch_cli
from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.source import IndexSource

from support import fixture_runs as fr
from support import tui_data as d
from support.fixture_runs import extend, live_copy

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("lasting_toasts")]


aio = d.aio


def title(app) -> str:
    return app.screen.title or ""


def watch_source(index: Path, root: Path, **kw) -> IndexSource:
    """A source as `traceml watch ROOT` builds it (cli.main): filtered by ROOT, probing the lock, able to take over."""
    roots = [str(root)]
    return IndexSource(index, roots=roots, ingest_roots=roots, probe=functools.partial(find_running_daemon, index),
                       takeover=functools.partial(watch_cli._embed_or_join, service, index), **kw)


async def wait_for(pilot, predicate, rounds: int = 1500) -> bool:
    for _ in range(rounds):
        if predicate():
            return True
        await pilot.pause(0.02)
    return predicate()


# --------------------------------------------------------------------------- the rule


def test_commit_overdue_counts_in_the_slower_of_poll_and_step():
    assert not commit_overdue(100.0, 1.0, [])  # nothing live: an idle writer commits nothing, rightly
    assert not commit_overdue(2.5, 1.0, [0.05])
    assert commit_overdue(3.5, 1.0, [0.05, None])
    assert not commit_overdue(25.0, 1.0, [10.0])  # a run stepping every 10 s: a commit every 10 s is on time
    assert commit_overdue(31.0, 1.0, [10.0, 60.0])
    assert commit_overdue(3.5, 1.0, [None])


# --------------------------------------------------------------------------- takeover


@aio
async def test_second_watch_takes_over_when_the_ingesting_watch_quits(tmp_path):
    """Watch A embeds the ingester; watch B joins it. A quits: B takes over for its roots (in a worker), goes on
    showing new records, and the gap is stale data, never a stall or a bell — even a gap longer than the stall
    limit (B's takeover is held back 4 s here, and B's stall floor is 2 s). The ranks write on their own thread,
    every 0.2 s, as real ranks go on writing whatever the watch does: written from the App's loop, a loaded
    machine once spaced two records more than the floor apart, and the watch rightly called the rank stalled."""
    root = tmp_path / "logs"
    root.mkdir()
    run = live_copy(root)
    extend(run, 3)
    index = tmp_path / "state" / "index.sqlite"
    ingester_a, running = watch_cli._embed_or_join(service, index, [str(root)])
    assert running is None
    source_a = watch_source(index, root, ingester=ingester_a)  # watch A: the ingesting one

    gap: dict = {}

    def slow_takeover(roots):  # B's real takeover, after a gap longer than the stall limit
        gap["roots"] = roots
        time.sleep(4.0)
        return watch_cli._embed_or_join(service, index, roots)

    source_b = watch_source(index, root, stall_floor_s=2.0)
    source_b.takeover = slow_takeover
    app = create_app(source_b, poll_interval=0.05)
    bells = []
    app.bell = lambda: bells.append(time.monotonic())
    statuses: set[str] = set()
    titles: set[str] = set()

    def seen() -> None:
        snap = app.runs_snapshot
        if snap is not None:
            statuses.update(r.status for r in snap.rows)
        titles.add(title(app))

    def step_shown(step: int):
        def check() -> bool:
            seen()
            snap = app.runs_snapshot
            return snap is not None and bool(snap.rows) and snap.rows[0].step >= step
        return check

    written = [0]  # the newest step the ranks' thread wrote
    stop_writing = threading.Event()

    def ranks_write() -> None:
        while not stop_writing.wait(0.2):
            written[0] = extend(run, 1)

    ranks = threading.Thread(target=ranks_write, name="ranks", daemon=True)

    try:
        async with app.run_test(size=(120, 24)) as pilot:
            assert await wait_for(pilot, lambda: f"watch pid {os.getpid()}" in title(app) and "commit" in title(app))
            newest = extend(run, 2)
            assert await wait_for(pilot, step_shown(newest))
            ranks.start()  # the ranks go on writing, through the gap and after it
            source_a.close()  # watch A quits: its ingester stops and the lock is free
            assert find_running_daemon(index) is None
            for _ in range(25):
                await pilot.pause(0.2)
                seen()
            assert await wait_for(pilot, lambda: "this watch" in title(app))
            newest = written[0] + 2
            assert await wait_for(pilot, step_shown(newest))  # B ingests: new records keep showing
            seen()
            assert source_b.ingester is not None and find_running_daemon(index).pid == os.getpid()
            assert gap["roots"] == [os.path.realpath(root)]
            assert any(t.startswith("traceml watch · ⚠") for t in titles), titles  # the gap was shown as such
            assert "stalled" not in statuses and statuses == {"running"}, statuses
            assert bells == []
    finally:
        stop_writing.set()
        if ranks.is_alive():
            ranks.join(timeout=30)
        source_b.close()
        source_a.close()
    assert find_running_daemon(index) is None  # B's ingester stopped with B


@aio
async def test_watch_takes_over_from_a_daemon_process_that_exits(tmp_path, cli_env, traceml_cmd):
    """A real `traceml daemon` writes; the header names it with its pid; it is stopped mid-session and the
    watch takes over, showing the records written after."""
    root = tmp_path / "logs"
    root.mkdir()
    run = live_copy(root)
    extend(run, 2)
    index = tmp_path / "state" / "index.sqlite"
    proc = subprocess.Popen([*traceml_cmd, "daemon", str(root), "--index", str(index), "--poll-interval", "0.1"],
                            env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    source = watch_source(index, root)
    app = create_app(source, poll_interval=0.05)
    bells = []
    app.bell = lambda: bells.append(1)
    try:
        async with app.run_test(size=(120, 24)) as pilot:
            assert await wait_for(pilot, lambda: f"daemon pid {proc.pid} · commit" in title(app)), title(app)
            proc.terminate()
            assert proc.wait(timeout=30) == 0
            assert await wait_for(pilot, lambda: "this watch" in title(app)), title(app)
            newest = extend(run, 3)
            assert await wait_for(pilot, lambda: bool(app.runs_snapshot.rows) and app.runs_snapshot.rows[0].step
                                  == newest)
            assert app.runs_snapshot.rows[0].status == "running" and bells == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        source.close()


# --------------------------------------------------------------------------- ROOT filters, notices, missing runs


@aio
async def test_root_arguments_filter_what_is_shown(tmp_path):
    """One index holds two roots' runs; a watch of one root lists only that root's runs, of an empty one none."""
    first, second, empty = tmp_path / "first", tmp_path / "second", tmp_path / "empty"
    for p in (first, second, empty):
        p.mkdir()
    live_copy(first, "completed")
    live_copy(second, "interrupted")
    index = tmp_path / "index.sqlite"
    d.ingest(index, [first, second])
    for root, expected in ((first, ["completed"]), (empty, [])):
        source = IndexSource(index, roots=[str(root)], clock=lambda: fr.SHOWN_AT)
        app = create_app(source, poll_interval=0.02)
        try:
            async with app.run_test(size=(100, 24)) as pilot:
                await d.settle(pilot)
                assert [r.name for r in app.runs_snapshot.rows] == expected
                if not expected:
                    assert "nothing under the watched roots" in str(app.screen.query_one("#runs-empty").render())
        finally:
            source.close()
    everything = IndexSource(index)  # no ROOT argument: every run of the index
    assert sorted(r.name for r in everything.runs().rows) == ["completed", "interrupted"]
    everything.close()


@aio
async def test_another_writers_roots_are_named_in_the_app(tmp_path):
    """A daemon writes the index for another root: the notice is a notification inside the app and the header
    counts the root not indexed (not only a line on stderr before the screen starts)."""
    other, mine = tmp_path / "other", tmp_path / "mine"
    other.mkdir()
    mine.mkdir()
    index = tmp_path / "index.sqlite"
    writer = service.Ingester(index, [str(other)], poll_interval=0.1, use_inotify=False, mode="daemon")
    writer.start()
    source = watch_source(index, mine)
    app = create_app(source, poll_interval=0.05)
    try:
        async with app.run_test(size=(120, 24)) as pilot:
            assert await wait_for(pilot, lambda: "1 root not indexed" in title(app)), title(app)
            texts = [str(n.message) for n in app._notifications]
            assert any(f"daemon pid {os.getpid()} writes this index for other roots" in t and str(mine) in t
                       for t in texts), texts
            assert app.runs_snapshot.rows == ()
            # The empty list says why, not "start a run": the runs may well be there, unindexed.
            note = app.runs_snapshot.note
            assert f"{os.path.realpath(mine)} not indexed" in note and "start a run" not in note, note
            assert title(app).startswith("traceml watch · ⚠")
            writer.stop()  # the daemon exits: this watch takes over for its root and the daemon's
            assert await wait_for(pilot, lambda: "this watch" in title(app)), title(app)
            assert source.ingester.roots == [os.path.realpath(mine), os.path.realpath(other)]
            assert not title(app).startswith("traceml watch · ⚠")
    finally:
        source.close()
        writer.stop()


@aio
async def test_overdue_commit_warns_in_the_header(tmp_path):
    """A running run and a writer whose newest commit is older than 3 poll intervals: ⚠ and the warning colour."""
    root = tmp_path / "logs"
    root.mkdir()
    run = live_copy(root)
    at = fr.INGESTED_AT
    extend(run, 3, ts=at - 0.5)
    index = tmp_path / "index.sqlite"
    ing = service.Ingester(index, [str(root)], use_inotify=False, mode="test", clock=lambda: at)
    ing.run_once()
    ing.close()
    daemon = DaemonInfo(pid=4242, roots=(str(root),), index=str(index), mode="daemon", started=None)
    for shown_at, warns in ((at + 2.0, False), (at + 5.0, True)):
        source = IndexSource(index, clock=lambda t=shown_at: t, probe=lambda: daemon, poll_s=1.0)
        app = create_app(source, poll_interval=0.02)
        try:
            async with app.run_test(size=(100, 24)) as pilot:
                await d.settle(pilot)
                from textual.widgets import Header

                assert app.runs_snapshot.rows[0].status == "running"
                header = app.screen.query_one(Header)
                if warns:
                    assert title(app) == "traceml watch · ⚠ daemon pid 4242 · last commit 5s ago"
                    assert header.has_class("-source-stale")
                else:
                    assert title(app) == "traceml watch · daemon pid 4242 · commit 2s ago"
                    assert not header.has_class("-source-stale")
        finally:
            source.close()


@aio
async def test_a_deleted_run_shows_missing_on_its_run_screen(tmp_path):
    root = tmp_path / "logs"
    root.mkdir()
    run = live_copy(root, "completed")
    index = tmp_path / "index.sqlite"
    ingester = service.Ingester(index, [str(root)], poll_interval=0.05, rescan_interval=0.2, use_inotify=False,
                                mode="watch")
    ingester.start()
    source = IndexSource(index, ingester=ingester)
    app = create_app(source, poll_interval=0.05)
    try:
        async with app.run_test(size=(120, 30)) as pilot:
            assert await wait_for(pilot, lambda: app.runs_snapshot is not None and bool(app.runs_snapshot.rows))
            app.open_run(app.runs_snapshot.rows[0].run_id)
            assert await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.detail is not None)
            assert app.screen.detail.run.status == "completed"
            shutil.rmtree(run)
            assert await wait_for(pilot, lambda: app.screen.detail.run.status == "missing")
            await pilot.pause()
            assert "MISSING" in app.screen.query_one("#headline").data[1][0][0]
            assert any("its folder is gone from disk" in str(n.message) for n in app._notifications)
    finally:
        source.close()


def test_header_with_a_daemon_writer(snap_compare, tmp_path):
    """The header names the daemon and its pid and the age of its newest commit (fixed clock and pid)."""
    root, index = fr.build_real_index(tmp_path)
    daemon = DaemonInfo(pid=4242, roots=(str(root),), index=str(index), mode="daemon", started=None)
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT, probe=lambda: daemon, poll_s=1.0)
    try:
        assert snap_compare(create_app(source, poll_interval=0.02), terminal_size=(100, 14),
                            run_before=lambda pilot: d.settle(pilot))
    finally:
        source.close()


def header_line(app) -> str:
    """The header's title line as drawn (Textual cuts what does not fit with an ellipsis)."""
    from textual.geometry import Region
    from textual.widgets._header import HeaderTitle

    line = app.screen.query_one(HeaderTitle)
    return line.render_lines(Region(0, 0, line.size.width, 1))[0].text.strip()


@aio
async def test_at_80_columns_the_header_keeps_the_run_name_whole(tmp_path):
    """With a daemon named in the header, the Describe and Run screens at 80 columns show the run's whole name
    (the source line once took the room and left `describe · …`); the source line gives way a fact at a time."""
    root, index = fr.build_real_index(tmp_path)
    daemon = DaemonInfo(pid=4242, roots=(str(root),), index=str(index), mode="daemon", started=None)
    source = IndexSource(index, clock=lambda: fr.SHOWN_AT, probe=lambda: daemon, poll_s=1.0)
    name = fr.name_of("completed_finish")
    try:
        app = create_app(source, poll_interval=0.02)
        async with app.run_test(size=(80, 24)) as pilot:
            await d.settle(pilot)
            run_id = next(r.run_id for r in app.runs_snapshot.rows if r.name == name)
            app.open_describe(run_id)
            assert await wait_for(pilot, lambda: getattr(app.screen, "loaded", False))
            await d.settle(pilot)
            assert header_line(app) == f"daemon pid 4242 · commit 2m ago — describe · {name}"
            app.open_run(run_id)
            await d.settle(pilot)
            assert header_line(app).endswith(f" — {name}")
            await pilot.resize_terminal(60, 24)
            await d.settle(pilot)
            assert header_line(app) == f"daemon pid 4242 — {name}"
            await pilot.resize_terminal(120, 24)
            await d.settle(pilot)
            assert header_line(app) == f"traceml watch · daemon pid 4242 · commit 2m ago — {name}"
    finally:
        source.close()


def test_a_subject_too_wide_for_the_header_keeps_its_start():
    """Only a subject wider than the whole line is cut, at its end: the name's start is what tells runs apart
    in a list of the same experiment; the source line is left out, never cut inside a fact."""
    from traceml_tui.tui.widgets.screen_header import fit_title

    title, long_name = "⚠ daemon pid 4242 · last commit 12s ago · 1 root not indexed", "resnet50-imagenet-" + "x" * 60
    assert fit_title(title, f"describe · {long_name}", 62) == ("", f"describe · {long_name}"[:61] + "…")
    assert fit_title(title, "describe · short", 100) == (title, "describe · short")
    assert fit_title(title, "describe · short", 62) == ("⚠ daemon pid 4242 · last commit 12s ago", "describe · short")
    assert fit_title(title, "describe · a-run-name-0123456789", 62) == (
        "⚠ daemon pid 4242", "describe · a-run-name-0123456789")
    assert fit_title("traceml watch", "describe · " + "n" * 50, 62) == ("", "describe · " + "n" * 50)


# --------------------------------------------------------------------------- end to end, in a real terminal


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30).stdout


def _wait_pane(sock: str, target: str, pattern: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = _tmux(sock, "capture-pane", "-p", "-t", target)
        if re.search(pattern, text, re.MULTILINE):
            return text
        time.sleep(0.3)
    others = _tmux(sock, "list-panes", "-a", "-F", "#{session_name}: dead=#{pane_dead} status=#{pane_dead_status}")
    raise AssertionError(f"pane {target} never showed {pattern!r} ({others.strip()}); last screen:\n{text}")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.xdist_group("external")  # a real terminal: one such test at a time (README, test lanes)
def test_two_watches_in_tmux_the_second_takes_over(tmp_path, cli_env):
    """`traceml watch logs` twice on one index (two tmux panes): the second names the first as the writer;
    the first quits (q); the second takes over, shows the records written after, and never shows a stall.
    A third `traceml watch empty` lists none of the index's runs."""
    root = tmp_path / "logs"
    root.mkdir()
    (tmp_path / "empty").mkdir()
    run = live_copy(root)
    sock = f"traceml-health-{os.getpid()}"
    env = " ".join(f"{k}={shlex_quote(cli_env[k])}" for k in ("XDG_STATE_HOME", "OMP_NUM_THREADS", "PATH"))

    def watch(arg: str) -> str:
        return (f"cd {shlex_quote(str(tmp_path))} && env {env} TERM=xterm-256color "
                f"{shlex_quote(sys.executable)} -m traceml_tui watch {arg} --stall-after 2")

    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g remain-on-exit on\n")
    # The ranks write a step every 0.3 s all along (a live run), so a 2 s silence would be a stall.
    newest = [extend(run, 2)]
    stop = threading.Event()

    def train() -> None:
        while not stop.wait(0.3):
            newest[0] = extend(run, 1)

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        def start(name: str, arg: str) -> None:
            subprocess.run(["tmux", "-L", sock, "-f", str(conf), "new-session", "-d", "-s", name, "-x", "120",
                            "-y", "24", watch(arg)], check=True, timeout=30)

        def pane(name: str) -> str:
            return _tmux(sock, "capture-pane", "-p", "-t", name)

        start("a", "logs")
        _wait_pane(sock, "a", r"this watch · commit")
        start("b", "logs")
        first = re.search(r"watch pid (\d+) · commit", _wait_pane(sock, "b", r"watch pid \d+ · commit")).group(1)
        start("empty", "empty")
        text = _wait_pane(sock, "empty", r"No runs yet")
        assert "hung" not in text
        seen = [pane("b")]
        _tmux(sock, "send-keys", "-t", "a", "q")
        for _ in range(16):
            time.sleep(0.5)
            seen.append(pane("b"))
        # B, or the third watch (then for both roots), takes over: a live writer, not A, indexes logs again.
        text = _wait_pane(sock, "b", r"(this watch|watch pid \d+) · commit")
        # The header names the new writer (a toast below may still say that pid {first} stopped writing).
        header = text.splitlines()[0]
        assert f"pid {first}" not in header and "⚠" not in header, text
        step = newest[0]
        # It keeps up: the run's Step column (a Topo column such as "1×2" may stand before it, when the widths of
        # the other values leave room for it).
        seen.append(_wait_pane(sock, "b", rf"hung\s+(?:\d+×\d+\s+)?({step}|{step + 1}|{step + 2})\s"))
        assert "dead=1" in _tmux(sock, "list-panes", "-t", "a", "-F", "dead=#{pane_dead}")
        assert not any("stalled" in s for s in seen), "\n---\n".join(seen)
    finally:
        stop.set()
        trainer.join(timeout=10)
        _tmux(sock, "kill-server")


def shlex_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)
