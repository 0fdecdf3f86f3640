"""The live path (docs/daemon.md, "Live path"): descriptors kept open between passes, one transaction per pass.

One real :class:`daemon.service.Ingester` is kept across passes (``run_once`` keeps its descriptors), over
real files, a real SQLite index and the reader.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from daemon import decode
from daemon.reader import Reader
from daemon.service import Ingester

from support.daemon_files import append_raw, header_line, index_rows, step_line, steps_path, write_steps


@pytest.fixture
def live(tmp_path: Path):
    """(root, index, ingester): one ingester kept open across passes, closed at the end."""
    root = tmp_path / "logs"
    root.mkdir()
    index = tmp_path / "index.sqlite"
    ing = Ingester(index, [str(root)], poll_interval=0.05, use_inotify=False)
    yield root, index, ing
    ing.close()


def _open_paths() -> list[str]:
    """What this process's descriptors point at (``… (deleted)`` for a removed file)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def _rank(index: Path, name: str):
    with Reader(index) as r:
        run = r.find_run(name)
        return r.series.step_count(run.run_id), r.rank_rows(run.run_id)[0]


def _stored_rate(index: Path, name: str) -> float:
    """The steps/s the ingester wrote for the run's rank (``rank_live``; the reader applies the silence to it as of
    its decision time: these runs' records are from 1970, so as of now they are stalled, at 0)."""
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT l.steps_per_s FROM rank_live l JOIN runs r USING (run_id) WHERE r.name = ?",
                            (name,)).fetchone()[0]
    finally:
        conn.close()


def _generation(index: Path, rel_end: str) -> int:
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        return next(g for p, g in conn.execute("SELECT path, generation FROM files") if p.endswith(rel_end))
    finally:
        conn.close()


@pytest.mark.faults
def test_a_file_replaced_under_a_cached_descriptor_is_read_as_a_new_generation(live):
    root, index, ing = live
    path = write_steps(root / "r", 0, range(1, 6))
    ing.run_once()
    assert str(path) in _open_paths()  # the descriptor is kept for the next pass
    append_raw(path, step_line("r", 0, 6))
    ing.run_once()
    assert _rank(index, "r")[1].last_step == 6 and _generation(index, "steps-0.jsonl") in (0, None)
    # Replaced (a new header, fewer bytes than were read): the cached descriptor still holds the old file.
    tmp = path.with_name("new.tmp")
    tmp.write_bytes(header_line("r", 0) + b"".join(step_line("r", 0, s, step_ms=50.0) for s in range(1, 4)))
    os.replace(tmp, path)
    ing.run_once()
    count, rank = _rank(index, "r")
    assert _generation(index, "steps-0.jsonl") == 1
    assert rank.last_step == 6 and count == 6  # steps 1-3 re-supplied by the new file, 4-6 kept
    assert not any(p.startswith(str(path)) and p.endswith("(deleted)") for p in _open_paths())  # old file let go
    append_raw(path, step_line("r", 0, 7, step_ms=50.0))
    ing.run_once()
    assert _rank(index, "r")[1].last_step == 7


@pytest.mark.faults
def test_a_file_rewritten_in_place_under_a_cached_descriptor_is_a_new_generation(live):
    root, index, ing = live
    path = write_steps(root / "r", 0, (), header=False)
    path.write_bytes(header_line("r", 0, uuid="aaaa") + b"".join(step_line("r", 0, s) for s in range(1, 4)))
    ing.run_once()
    ino = path.stat().st_ino
    # Same inode, truncated and rewritten longer between two passes, under a header of the same length and
    # the same lines after it: stat and the committed tail look like an append; only the header tells.
    with open(path, "r+b") as fh:
        fh.truncate(0)
        fh.write(header_line("r", 0, uuid="bbbb") + b"".join(step_line("r", 0, s) for s in range(1, 21)))
    assert path.stat().st_ino == ino
    ing.run_once()
    count, rank = _rank(index, "r")
    assert _generation(index, "steps-0.jsonl") == 1 and count == 20 and rank.last_step == 20


@pytest.mark.faults
def test_a_deleted_file_is_not_held_open_past_one_pass(live):
    root, index, ing = live
    keep = write_steps(root / "r", 0, range(1, 4))
    gone = write_steps(root / "r", 1, range(1, 4))
    ing.run_once()
    assert str(gone) in _open_paths()
    os.unlink(gone)
    ing.run_once()
    assert not any(p.startswith(str(gone)) for p in _open_paths())
    assert str(keep) in _open_paths()
    with Reader(index) as r:
        assert r.series.step_count(r.find_run("r").run_id) == 6  # rows are kept (rule 7)


def test_descriptors_stay_within_the_cache_bound(live):
    root, index, ing = live
    for rank in range(12):
        write_steps(root / "r", rank, range(1, 3))
    ing.open()
    ing.streams.fds.cap = 5  # a tiny bound; every file is still read (re-opened when evicted)
    ing.run_once()
    for rank in range(12):
        append_raw(write_steps(root / "r", rank, (), header=False), step_line("r", rank, 3))
    ing.run_once()
    assert sum(p.startswith(str(root)) for p in _open_paths()) <= 5
    with Reader(index) as r:
        run = r.find_run("r")
        assert r.series.step_count(run.run_id) == 36
        assert {k.last_step for k in r.rank_rows(run.run_id)} == {3}


def test_one_transaction_for_a_pass_over_many_files(live):
    root, index, ing = live
    paths = [write_steps(root / f"r{i}", rank, range(1, 3)) for i in range(4) for rank in range(4)]
    ing.run_once()
    with Reader(index) as r:
        v0 = r.data_version()
    for n, path in enumerate(paths):
        append_raw(path, step_line(path.parents[2].name, n % 4, 3))
    ing.run_once()
    with Reader(index) as r:
        assert r.data_version() == v0 + 1  # sixteen files grew: one commit holds them all
        assert sum(run.records for run in r.list_runs()) == 16 * 3


def test_series_folded_pass_by_pass_equal_a_cold_ingest(tmp_path):
    """Live appends are folded together at commit (one statement per pass): same buckets as one cold read."""
    live_root, cold_root = tmp_path / "live", tmp_path / "cold"
    ranks, steps = 3, 700  # past 512 steps: the bucket width doubles on the way, merging stored buckets
    for root in (live_root, cold_root):
        for rank in range(ranks):
            write_steps(root / "r", rank, (), header=False)
    heads = {rank: header_line("r", rank, uuid=f"u{rank}") for rank in range(ranks)}
    lines = {rank: [step_line("r", rank, s, step_ms=100.0 + (s * 7 + rank) % 13, ratio=0.1 * (s % 5))
                    for s in range(1, steps + 1)] for rank in range(ranks)}
    for rank in range(ranks):
        (cold_root / "r" / "ranks" / f"rank_{rank}" / "steps-0.jsonl").write_bytes(heads[rank] + b"".join(lines[rank]))
        (live_root / "r" / "ranks" / f"rank_{rank}" / "steps-0.jsonl").write_bytes(heads[rank])
    cold = Ingester(tmp_path / "cold.sqlite", [str(cold_root)], use_inotify=False)
    cold.run_once()
    cold.close()
    live = Ingester(tmp_path / "live.sqlite", [str(live_root)], use_inotify=False)
    s = 0
    while s < steps:
        chunk = 1 + s % 3
        for rank in range(ranks):
            append_raw(live_root / "r" / "ranks" / f"rank_{rank}" / "steps-0.jsonl",
                       b"".join(lines[rank][s:s + chunk]))
        s += chunk
        live.run_once()
    live.close()
    with Reader(tmp_path / "cold.sqlite") as a, Reader(tmp_path / "live.sqlite") as b:
        ra, rb = a.find_run("r").run_id, b.find_run("r").run_id
        for rank in range(ranks):
            for metric in ("step_ms", "input_wait_ms", "loss", "ratio/mse"):
                sa, sb = a.series.points(ra, rank, metric), b.series.points(rb, rank, metric)
                assert sa.width == sb.width > 1
                assert [(p.step_lo, p.step_hi, p.vmin, p.vmax, p.n) for p in sa.points] == \
                       [(p.step_lo, p.step_hi, p.vmin, p.vmax, p.n) for p in sb.points]
                assert [p.mean for p in sa.points] == pytest.approx([p.mean for p in sb.points], rel=1e-12)


def _wait_for(cond, timeout: float = 20.0) -> bool:
    """Poll ``cond`` until it holds or ``timeout`` passes (a bound for a hung test, not a measured time)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.mark.parametrize("backend", ["inotify", "watchdog"])
def test_the_watcher_hints_appends_and_files_in_folders_made_after_it_started(tmp_path, backend):
    """inotify on Linux; watchdog's observer where inotify is not available (macOS) gives the same hints."""
    from daemon.watcher import Watcher

    root = tmp_path / "logs"
    old = write_steps(root / "a", 0, range(1, 3))
    seen: set[str] = set()
    w = Watcher([str(root)], seen.update, backend=backend)
    assert w.start()
    try:
        append_raw(old, step_line("a", 0, 3))
        assert _wait_for(lambda: str(old) in seen)
        # A run made after the watch started: its folders get watches, and a file written before that
        # (the race a new folder always has) is hinted too.
        new = write_steps(root / "b", 0, range(1, 3))
        assert _wait_for(lambda: str(new) in seen)
        seen.clear()
        append_raw(new, step_line("b", 0, 3))
        assert _wait_for(lambda: str(new) in seen)
        assert not any(p.endswith(".tmp") for p in seen)
    finally:
        w.stop()
        w.stop()  # idempotent
    assert w._thread is None and w._ino is None and w._observer is None


def test_the_watcher_names_files_under_a_renamed_run_folder_by_their_new_path(tmp_path):
    """A run folder renamed while watched keeps its inotify watch: appends under it are hinted with the new
    path (a hint under the old name would point the ingester at a file that is no longer there)."""
    from daemon.watcher import Watcher

    root = tmp_path / "logs"
    first = write_steps(root / "a", 0, range(1, 3))
    seen: set[str] = set()
    w = Watcher([str(root)], seen.update, backend="inotify")
    assert w.start()
    try:
        append_raw(first, step_line("a", 0, 3))  # the old path is named (and remembered) once
        assert _wait_for(lambda: str(first) in seen)
        (root / "a").rename(root / "b")
        moved = root / "b" / first.relative_to(root / "a")
        assert _wait_for(lambda: str(root / "b") in seen)
        seen.clear()
        append_raw(moved, step_line("a", 0, 4))
        assert _wait_for(lambda: str(moved) in seen)
        assert str(first) not in seen
    finally:
        w.stop()


def test_the_watcher_reports_every_appended_file_once_per_read(tmp_path):
    """Many appends to many files come as sets of paths, one per read of the inotify queue: every file that
    changed is in them, and nothing else is."""
    from daemon.watcher import Watcher

    root = tmp_path / "logs"
    paths = [write_steps(root / f"r{i % 4}", i // 4, range(1, 2)) for i in range(40)]
    calls: list[set[str]] = []
    w = Watcher([str(root)], calls.append, backend="inotify")
    assert w.start()
    try:
        for s in range(2, 5):
            for path in paths:
                append_raw(path, step_line(path.parts[-4], int(path.parts[-2][5:]), s))
        assert _wait_for(lambda: set().union(*calls) >= {str(p) for p in paths})
    finally:
        w.stop()
    assert all(isinstance(c, set) and c for c in calls)
    assert set().union(*calls) == {str(p) for p in paths}
    assert len(calls) < 3 * len(paths)  # each call covers every event of its read, not one event


def _raw_event(wd: int, mask: int, name: bytes = b"") -> bytes:
    """One ``struct inotify_event`` as the kernel writes it (name NUL-padded to a multiple of 16)."""
    import struct

    padded = name.ljust(-(-(len(name) + 1) // 16) * 16, b"\0") if name else b""
    return struct.pack("iIII", wd, mask, 0, len(padded)) + padded


def test_the_watcher_decodes_a_read_into_one_set_of_paths(tmp_path):
    """Repeated events of a file are one path; a gone folder's watch is forgotten and its later events are
    dropped; a lost-events overflow reports every root."""
    from inotify_simple import parse_events

    from daemon import watcher

    root = tmp_path / "logs"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    calls: list[set[str]] = []
    w = watcher.Watcher([str(root)], calls.append, backend="inotify")
    assert w.start()
    w.stop()  # the reading thread is not needed: _dispatch is fed here
    w._dirs = {1: str(root), 2: str(root / "a"), 3: str(root / "b")}
    data = b"".join([_raw_event(2, watcher.IN_MODIFY, b"steps-0.jsonl")] * 5
                    + [_raw_event(2, watcher.IN_CLOSE_WRITE, b"steps-0.jsonl"),
                       _raw_event(2, watcher.IN_MODIFY, b"steps-1.jsonl"),
                       _raw_event(3, watcher.IN_DELETE_SELF), _raw_event(3, watcher.IN_IGNORED)])
    w._dispatch(parse_events(data))
    assert calls == [{str(root / "a" / "steps-0.jsonl"), str(root / "a" / "steps-1.jsonl"), str(root / "b")}]
    assert 3 not in w._dirs
    calls.clear()
    w._dispatch(parse_events(_raw_event(3, watcher.IN_MODIFY, b"late.jsonl")))
    assert calls == []
    w._dispatch(parse_events(_raw_event(-1, watcher.IN_Q_OVERFLOW)))
    assert calls == [{str(root)}]


def _has_run(index: Path, name: str) -> bool:
    if not index.exists():
        return False
    with Reader(index) as r:
        return r.find_run(name) is not None


def test_an_inotify_hint_makes_an_append_visible_before_the_next_poll(tmp_path):
    root = tmp_path / "logs"
    path = write_steps(root / "r", 0, range(1, 4))
    index = tmp_path / "index.sqlite"
    # Polls and rescans an hour apart: only a hint can make the append visible while the test waits.
    ing = Ingester(index, [str(root)], poll_interval=3600, rescan_interval=3600, use_inotify=True)
    ing.start()
    try:
        assert _wait_for(lambda: _has_run(index, "r"))
        append_raw(path, step_line("r", 0, 4))
        assert _wait_for(lambda: _rank(index, "r")[1].last_step == 4)
    finally:
        ing.stop()


@pytest.mark.parametrize("odd", [None, b"{not json\n", b"\n", "header"])
def test_blocks_decoded_together_equal_blocks_decoded_one_by_one(odd):
    """A live pass decodes every file's small append at once (decode.prepare_blocks): the same rows, errors and
    other records as one prepare_block per file, also when one block holds a bad line, a blank line or a header."""
    blocks = []
    for rank in range(6):
        data = b"".join(step_line("r", rank, s, ratio=0.1 * s) for s in range(5 + rank, 7 + rank))
        if odd is not None and rank == 3:
            data = (header_line("r", rank) if odd == "header" else odd) + data
        blocks.append((data, 1000 * rank + 17))
    together = decode.prepare_blocks(blocks)
    one_by_one = [decode.prepare_block(b, base) for b, base in blocks]
    assert together == one_by_one
    assert sum(len(p.errors) for p in together) == (1 if odd == b"{not json\n" else 0)


def test_a_repeated_step_in_a_pass_of_one_line_appends_counts_like_a_cold_ingest(tmp_path):
    """A pass's one-line appends share one INSERT; a line repeating a stored step (the row is ignored) sends
    the pass's rows through one INSERT per rank, so each rank's counts and series equal a cold read's."""
    live_root, cold_root = tmp_path / "live", tmp_path / "cold"
    ranks = 4
    heads = {rank: header_line("r", rank, uuid=f"u{rank}") for rank in range(ranks)}
    plan = [list(range(1, 9)) for _ in range(ranks)]
    plan[2][5] = 3  # rank 2 writes step 3 again in the sixth pass
    lines = {rank: [step_line("r", rank, s, step_ms=100.0 + s + rank) for s in plan[rank]] for rank in range(ranks)}
    for rank in range(ranks):
        folder = cold_root / "r" / "ranks" / f"rank_{rank}"
        folder.mkdir(parents=True)
        (folder / "steps-0.jsonl").write_bytes(heads[rank] + b"".join(lines[rank]))
        folder = live_root / "r" / "ranks" / f"rank_{rank}"
        folder.mkdir(parents=True)
        (folder / "steps-0.jsonl").write_bytes(heads[rank])
    cold = Ingester(tmp_path / "cold.sqlite", [str(cold_root)], use_inotify=False)
    cold.run_once()
    cold.close()
    live = Ingester(tmp_path / "live.sqlite", [str(live_root)], use_inotify=False)
    live.run_once()
    for i in range(len(plan[0])):
        for rank in range(ranks):
            append_raw(live_root / "r" / "ranks" / f"rank_{rank}" / "steps-0.jsonl", lines[rank][i])
        live.run_once()
    live.close()
    with Reader(tmp_path / "cold.sqlite") as a, Reader(tmp_path / "live.sqlite") as b:
        ra, rb = a.find_run("r").run_id, b.find_run("r").run_id
        assert a.series.step_count(ra) == b.series.step_count(rb) == ranks * 8 - 1
        rows_a, rows_b = a.rank_rows(ra), b.rank_rows(rb)
        assert [(x.rank, x.records, x.first_step, x.last_step, x.median_step_ms) for x in rows_a] == \
               [(x.rank, x.records, x.first_step, x.last_step, x.median_step_ms) for x in rows_b]
        assert a.find_run("r").records == b.find_run("r").records == ranks * 8 - 1
        for rank in range(ranks):  # each stored step folded once, the repeated line not at all
            points = b.series.points(rb, rank, "step_ms").points
            assert [(p.step_lo, p.n) for p in points] == [(s, 1) for s in sorted(set(plan[rank]))]


def test_repeated_and_already_stored_steps_in_a_multi_line_read_are_folded_once(live):
    """A block of several lines repeating a step (within the block, or one stored by an earlier read) stores
    the first line of each step; the series and the ratio series count each stored step once, with the
    stored line's values, exactly as the steps table holds them."""
    root, index, ing = live
    path = root / "r" / "ranks" / "rank_0" / "steps-0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(header_line("r", 0, uuid="u")
                     + b"".join(step_line("r", 0, s, step_ms=10.0 * s, ratio=0.1 * s) for s in (1, 2, 3, 2)))
    ing.run_once()
    # a later read of several lines: step 3 again (stored by the first read), new steps, and 5 twice
    append_raw(path, b"".join(step_line("r", 0, s, step_ms=999.0, ratio=9.0) for s in (3, 4, 5)))
    append_raw(path, step_line("r", 0, 5, step_ms=777.0, ratio=7.0))
    ing.run_once()
    with Reader(index) as r:
        run_id = r.find_run("r").run_id
        assert r.series.step_count(run_id) == 5
        points = r.series.points(run_id, 0, "step_ms").points
        assert [(p.step_lo, p.n) for p in points] == [(s, 1) for s in range(1, 6)]
        ratios = r.series.points(run_id, 0, "ratio/mse").points
        assert [(p.step_lo, p.n) for p in ratios] == [(s, 1) for s in range(1, 6)]
        # the first line of each step won: 2 kept 0.2 (not the repeat), 3 kept 0.3 (stored first), 4 and 5 the new
        assert [round(p.vmax, 6) for p in ratios] == [0.1, 0.2, 0.3, 9.0, 9.0]
        assert r.rank_rows(run_id)[0].records == 5


def test_passes_under_load_are_further_apart_but_bounded():
    """The gap after a hint-driven pass (docs/daemon.md, "Live path"): a pass over one stream leaves the
    next one MIN_PASS_GAP_S after it; the gap grows with the streams a pass read, never past
    MAX_PASS_GAP_S after the pass began, and a pass longer than that leaves MIN_PASS_GAP_S after it."""
    from daemon import plan

    start = 100.0
    assert plan.next_hint(start, start + 0.001, 1) == pytest.approx(start + 0.001 + plan.MIN_PASS_GAP_S)
    gaps = [plan.next_hint(start, start + 0.01, n) - start for n in (1, 50, 200, 400, 1280, 100_000)]
    assert gaps == sorted(gaps) and gaps[0] < gaps[-1]
    assert gaps[-1] == pytest.approx(plan.MAX_PASS_GAP_S)
    slow = start + 2 * plan.MAX_PASS_GAP_S
    assert plan.next_hint(start, slow, 100_000) == pytest.approx(slow + plan.MIN_PASS_GAP_S)


def test_a_live_daemon_under_load_reads_every_stream_to_its_last_line(tmp_path):
    """Many streams appended round after round while the daemon serves with inotify (passes spread by the
    load): every stream's last step becomes visible, none is left behind by the wider gaps."""
    root = tmp_path / "logs"
    runs, ranks, rounds = 4, 16, 12
    paths = {(r, k): write_steps(root / f"run{r}", k, range(1, 2)) for r in range(runs) for k in range(ranks)}
    index = tmp_path / "index.sqlite"
    # Polls and rescans an hour apart: only hint-driven passes read the appends while the test waits.
    ing = Ingester(index, [str(root)], poll_interval=3600, rescan_interval=3600, use_inotify=True)
    ing.start()
    try:
        assert _wait_for(lambda: all(_has_run(index, f"run{r}") for r in range(runs)))
        for step in range(2, 2 + rounds):
            for (r, k), path in paths.items():
                append_raw(path, step_line(f"run{r}", k, step))

        def done() -> bool:
            with Reader(index) as rd:
                return all(rd.series.step_count(rd.find_run(f"run{r}").run_id) == ranks * (1 + rounds)
                           for r in range(runs))

        assert _wait_for(done, timeout=60)
    finally:
        ing.stop()
    with Reader(index) as rd:
        for r in range(runs):
            rows = rd.rank_rows(rd.find_run(f"run{r}").run_id)
            assert [(x.rank, x.last_step, x.records) for x in rows] == [(k, 1 + rounds, 1 + rounds) for k in range(ranks)]


def test_the_run_rollup_counts_every_attempt_and_rolls_up_the_newest(tmp_path):
    """The run's row (one scan of its rank rows): records of every attempt, but steps, ends and failures of
    each rank's newest attempt only (a failed attempt that was resumed is not a failed rank)."""
    from traceml_tui.core import records

    root = tmp_path / "logs"
    old = write_steps(root / "r", 0, range(1, 10), attempt=0)
    append_raw(old, records.encode(records.RankEnd(v=1, run="r", rank=0, attempt=0, step=9, ts=2000.0,
                                                   status="failed", exit_code=1)))
    write_steps(root / "r", 0, range(1, 4), attempt=1)
    write_steps(root / "r", 1, range(1, 5))
    ing = Ingester(tmp_path / "index.sqlite", [str(root)], use_inotify=False)
    ing.run_once()
    ing.close()
    conn = sqlite3.connect(tmp_path / "index.sqlite")
    try:
        row = conn.execute("SELECT records, last_step, ranks_total, ranks_ended, ranks_failed FROM runs").fetchone()
    finally:
        conn.close()
    assert row == (9 + 3 + 4, 4, 2, 0, 0)


def test_the_run_rates_and_straggler_are_not_stored_and_not_read(live):
    """The run's steps/s, examples/s, slowest rank and straggler score are the reader's (computed when read by the
    rate rule and the straggler rule): the ingester leaves those `runs` columns unwritten, and no reader answer
    depends on them (garbage written there changes nothing anyone shows)."""
    root, index, ing = live
    t0 = time.time() - 30  # records of the last half minute, one step a second: a running run with a pace
    ms = {0: 100.0, 1: 100.0, 2: 150.0}  # rank 2 is a straggler
    for rank in ms:
        write_steps(root / "r", rank, ())
    for steps in (range(1, 21), range(21, 24)):  # a first pass, and a live pass on top
        for step in steps:
            for rank in ms:
                append_raw(steps_path(root / "r", rank), step_line("r", rank, step, step_ms=ms[rank], ts=t0 + step))
        ing.run_once()
    now = time.time()  # one decision time for every answer: the ranks were just heard from, so they are running
    dead = "SELECT steps_per_s, examples_per_s, slowest_rank, straggler_score FROM runs"

    def answers():
        with Reader(index) as r:
            run = r.find_run("r", now=now)
            fig = r.figures(run, now=now)
            return (run.steps_per_s, run.examples_per_s, run.slowest_rank, run.straggler_score, fig.slowest_rank,
                    fig.straggler_score, fig.straggler, fig.steps_per_s, fig.examples_per_s,
                    [(k.rank, k.steps_per_s) for k in r.rank_rows(run.run_id)])

    assert index_rows(index, dead) == [(None, None, None, None)]
    before = answers()
    assert before[4] == 2 and before[5] == pytest.approx(1.5, rel=1e-3) and before[6] is True
    assert before[7] is not None and before[7] > 0  # the rate rule found a pace: the figures are there to compare
    conn = sqlite3.connect(index)
    try:
        conn.execute("UPDATE runs SET steps_per_s = 1e9, examples_per_s = -1, slowest_rank = 7, straggler_score = 99")
        conn.commit()
    finally:
        conn.close()
    assert answers() == before


def test_a_live_pass_runs_with_the_cyclic_collector_paused_and_gives_it_back(live, monkeypatch):
    """A live pass (reads, routing, the end of the pass, its merge) makes thousands of short-lived tuples and no
    cycles: the collector is paused through it (docs/daemon.md, "Live path") and on again after it; ``--once``
    keeps it on outside each block, so that a long backlog never holds garbage for the whole read."""
    import gc

    from daemon import store as store_mod

    root, index, ing = live
    seen = []
    finish = store_mod.Store.finish

    def spy_finish(self, *a, **kw):
        seen.append(("finish", gc.isenabled()))
        return finish(self, *a, **kw)

    monkeypatch.setattr(store_mod.Store, "finish", spy_finish)
    path = write_steps(root / "r", 0, range(1, 4))
    assert gc.isenabled()
    ing.run_once()  # --once: the end of its pass with the collector on
    assert seen == [("finish", True)] and gc.isenabled()
    ing.live_settings()
    moves = []
    real_move = ing.store.live.move
    monkeypatch.setattr(ing.store.live, "move", lambda *a, **kw: (moves.append(gc.isenabled()), real_move(*a, **kw))[1])
    append_raw(path, step_line("r", 0, 4))
    ing.poll(ing.plan.everything())
    ing.commit_pass()
    ing.merge_live()
    assert seen[1:] == [("finish", False)] and moves == [False]
    assert gc.isenabled()  # given back after the pass
    with Reader(index) as r:
        assert r.find_run("r").last_step == 4


def test_a_timed_poll_reads_the_hinted_streams_even_quiet_ones(live):
    """A timed poll re-stats the recent streams and a share of the quiet ones; a hint waiting for it names a
    stream quiet for an hour (a rank in a long evaluation) that is not in this round's share: the poll reads
    it too, instead of dropping the hint until the stream's turn comes round (seconds later)."""
    root, index, ing = live
    busy = write_steps(root / "r", 0, range(1, 4))
    quiet = write_steps(root / "r", 1, range(1, 4))
    ing.run_once()
    for _, f in ing.plan.paths.values():
        f.changed = -1e9  # quiet for ages: polled only in its turn
    rounds = max(1, int(ing.rescan_interval / ing.poll_interval))
    assert rounds > len(ing.plan.paths) + 1
    ing.plan.poll_round = rounds - 2  # the next round is nobody's turn
    append_raw(busy, step_line("r", 0, 4))
    append_raw(quiet, step_line("r", 1, 4))
    ing.plan.mark_dirty({str(quiet)})
    ing.timed_pass()
    ing.commit()
    with Reader(index) as r:
        rows = {x.rank: x.last_step for x in r.rank_rows(r.find_run("r").run_id)}
    assert rows[1] == 4  # the hinted quiet stream was read by this poll
    assert rows[0] == 3  # the unhinted quiet one waits for its turn, as designed


def test_a_timed_poll_leaves_streams_inotify_names_to_their_hints_until_events_are_lost(tmp_path):
    """With inotify (which reports lost events), a stream it named lately is written on this machine: the
    timed poll leaves it to its hints (and its share of the quiet rounds) instead of re-stat'ing it every
    second; a stream never named (written from another node over NFS) keeps its poll; after lost events the
    next poll looks at every active stream again."""
    root = tmp_path / "logs"
    local = write_steps(root / "r", 0, range(1, 4))
    remote = write_steps(root / "r", 1, range(1, 4))
    ing = Ingester(tmp_path / "index.sqlite", [str(root)], poll_interval=0.05, use_inotify=True)
    try:
        ing.run_once()
        from daemon import plan, watcher

        ing.plan.watcher = watcher.Watcher(ing.roots, ing.plan.mark_dirty)
        assert ing.plan.watcher.start() and ing.plan.watcher.reports_losses
        rounds = max(1, int(ing.rescan_interval / ing.poll_interval))
        assert rounds > len(ing.plan.paths) + 1

        def polled() -> set[str]:
            ing.plan.poll_round = rounds - 2  # the next round is nobody's share
            return {f.path for _, f in ing.plan.poll_targets()}

        assert polled() == {str(local), str(remote)}  # both changed lately, neither named yet
        append_raw(local, step_line("r", 0, 4))
        assert _wait_for(lambda: str(local) in ing.plan.dirty_paths(), timeout=10)
        ing.hinted_pass()  # the hint-driven pass reads it and remembers the hint
        ing.commit()
        assert polled() == {str(remote)}
        ing.plan.watcher._dispatch([(-1, watcher.IN_Q_OVERFLOW, 0, "")])  # the kernel's queue overflowed
        assert ing.plan.watcher.losses == 1 and ing.plan.take_dirty() == set(ing.roots)
        assert polled() == {str(local), str(remote)}
        assert polled() == {str(remote)}  # one full poll, then hints are trusted again
        # The named stream still has its share of the quiet rounds (an append inotify missed waits for it).
        order = [f.path for _, f in ing.plan.paths.values()]
        ing.plan.poll_round = order.index(str(local)) % rounds - 1
        assert str(local) in {f.path for _, f in ing.plan.poll_targets()}
        # A name older than HINTED_WITHIN_S is not trusted any more.
        hit = ing.plan.paths[str(local)][1]
        hit.hinted -= plan.HINTED_WITHIN_S + 1
        assert polled() == {str(local), str(remote)}
        hit.hinted += plan.HINTED_WITHIN_S + 1
        assert polled() == {str(remote)}
        # A reader that died, or watchdog's observer (it drops an overflow silently), is never trusted.
        ing.plan.watcher.stop()
        assert not ing.plan.watcher.reports_losses and polled() == {str(local), str(remote)}
        ing.plan.watcher = watcher.Watcher(ing.roots, ing.plan.mark_dirty, backend="watchdog")
        assert ing.plan.watcher.start() and not ing.plan.watcher.reports_losses
        assert polled() == {str(local), str(remote)}
    finally:
        ing.close()


def test_a_live_rank_recomputes_its_figures_when_half_its_window_is_new_or_ten_seconds_passed(live):
    """The live daemon's rolling figures (docs/daemon.md, "Live path"): not more often than every
    FIGURES_EVERY_S, and then once half of the window they were computed over is new records (a young
    window: as soon as it doubles), or FIGURES_MAX_S after the last time; the rank's current columns (last
    step, records, and the rates of daemon/rates.py) are always written. Observed through the window's mean
    step time (its parts' whole), which every new step moves: new steps take 200 ms against the first 100."""
    from daemon import live as live_mod
    from daemon import service

    root, index, ing = live
    path = write_steps(root / "r", 0, range(1, 71))  # ts = 1000 + step: 1 step/s over a full window
    ing.open()
    ing.live_settings()
    clock = [0.0]
    ing.store.agg.tick = lambda: clock[0]
    assert service.FIGURES_NEW_STEPS == live_mod.WINDOW // 2

    def after(seconds: float, steps=(), ts_base: float = 0.0, run: str = "r", stream=None, pace: float = 1.0):
        clock[0] += seconds
        for s in steps:
            append_raw(stream or path, step_line(run, 0, s, step_ms=200.0, ts=ts_base + s / pace))
        ing.run_once()
        ing.commit_pass()  # as the serve loop ends each pass: quiet ranks whose figures fell due get them
        row = _rank(index, run)[1]
        return row.last_step, round(row.step_parts["whole"], 4), round(_stored_rate(index, run), 4)

    first = after(0)  # first figures at once
    assert first == (70, 110.0, 1.0)
    # 5 new records at 2 steps/s: the current columns (the rate over the last 5 s of records among them) only
    assert after(3, range(71, 76), 2000, pace=2.0) == (75, 110.0, 2.0)
    assert after(6) == (75, 110.0, 2.0)  # 9 s: within FIGURES_MAX_S, nothing new
    seen = _rank(index, "r")[1].last_seen
    due = after(1.5)  # 10.5 s: due, written without a new record
    assert due == (75, round((59 * 110 + 5 * 220) / 64, 4), 2.0)
    # ... which keeps saying when the rank's records last came in (the stall and rate rules' silence)
    assert _rank(index, "r")[1].last_seen == seen
    half = after(2.5, range(76, 108), 3000)  # half the window is new
    assert half[0] == 107 and half[1] != due[1] and half[2] == 1.0
    assert after(1, range(108, 148), 4000)[:2] == (147, half[1])  # 1 s: not yet
    assert after(1) == (147, 220.0, 1.0)  # 2 s after the last time, quiet since: due (the window all new)
    # A young window (3 warm-up steps) is refreshed as soon as it doubles, 2 s after its first figures.
    young = write_steps(root / "y", 0, range(1, 4))
    assert after(0, run="y", stream=young) == (3, 110.0, 1.0)
    assert after(2.5, (4, 5, 6), 1500, run="y", stream=young)[:2] == (6, 165.0)


def test_figures_left_stale_are_written_after_a_rollback_and_when_the_daemon_stops(tmp_path):
    """A rank whose figures were left for later and that then goes quiet (a rank killed without a rank_end)
    still gets them: after a rolled-back transaction (its window reloaded from the index) and when the
    live daemon stops. Observed through the window's mean step time (new steps take 200 ms, the first 100)."""
    root = tmp_path / "logs"
    path = write_steps(root / "r", 0, range(1, 71))  # ts = 1000 + step: 1 step/s
    index = tmp_path / "index.sqlite"
    fresh = round((59 * 110 + 5 * 220) / 64, 4)  # the window's mean once steps 71-75 are in

    def whole() -> float:
        return round(_rank(index, "r")[1].step_parts["whole"], 4)

    # After a rollback, with the ingester's clock held still (nothing else would make them due).
    ing = Ingester(index, [str(root)], use_inotify=False)
    ing.open()
    ing.live_settings()
    ing.store.agg.tick = lambda: 0.0
    ing.run_once()
    for s in range(71, 76):
        append_raw(path, step_line("r", 0, s, step_ms=200.0, ts=2000.0 + s))
    ing.run_once()
    assert (_rank(index, "r")[1].last_step, whole()) == (75, 110.0)  # stale: current columns only
    ing.begin()
    ing.rollback()
    assert ing.store.agg.stale and ing.store.agg.due_stale()
    ing.commit_pass()  # the serve loop's next pass
    assert whole() == fresh
    ing.close()

    # When the live daemon stops (serve in a thread, as `traceml watch` embeds it).
    for s in range(76, 81):
        append_raw(path, step_line("r", 0, s, step_ms=200.0, ts=3000.0 + s))
    live = Ingester(index, [str(root)], poll_interval=0.05, use_inotify=False)
    live.start()
    last = round((51 * 110 + 13 * 220) / 64, 4)  # steps 20-83 in the window
    try:
        assert _wait_for(lambda: _rank(index, "r")[1].last_step == 80)
        for s in range(81, 84):
            append_raw(path, step_line("r", 0, s, step_ms=200.0, ts=4000.0 + s))
        assert _wait_for(lambda: _rank(index, "r")[1].last_step == 83)
        assert whole() != last  # left for later
    finally:
        live.stop()
    assert whole() == last


@pytest.mark.parametrize("between", [1, 7, 64, 129, 300])
def test_a_window_split_when_figures_are_asked_equals_one_split_at_every_append(between):
    """RankWindow splits steps into their parts only when figures are asked for (docs/daemon.md, "Live path"):
    whatever number of steps came in between (more than twice the window too), the figures are those of a
    window whose every step was split as it came; rows read back from the index and older or repeated
    steps included."""
    from daemon import live as live_mod

    lines = b"".join(step_line("r", 0, s, step_ms=50.0 + (s * 37) % 23, ts=1000.0 + s * (1 + (s % 5) / 10))
                     for s in range(1, 400))
    rows = decode.prepare_block(lines, 0).groups[(0, 0)][0]
    stored = [tuple(r[c] for c in (2, 3, 19, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 22, 23)) for r in rows[:40]]
    eager, lazy = live_mod.RankWindow(), live_mod.RankWindow()
    for w in (eager, lazy):
        w.add_stored(stored)
    eager.figures()
    feed = rows[40:] + rows[100:103]  # the last three: older steps again, which must not enter the window
    for i, r in enumerate(feed, 1):
        for w in (eager, lazy):
            w.add_row(r, 1)
        eager.figures()
        if i % between == 0:
            assert lazy.figures() == eager.figures()
    assert lazy.figures() == eager.figures()
    assert list(lazy.cpu) == list(eager.cpu) and len(lazy.cpu) == len(lazy.steps) == live_mod.WINDOW
