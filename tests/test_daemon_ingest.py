"""Ingestion rules (docs/daemon.md, "Rules") through the real ingester, a real SQLite file and the reader."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from daemon.reader import Reader
from traceml_tui.core import records
from traceml_tui.core.atomic import atomic_write_json

from support.daemon_files import append_raw, header_line, step_line, steps_path, write_steps


def _run(index: Path, name: str):
    with Reader(index) as r:
        run = r.find_run(name)
        assert run is not None, f"run {name} not in the index"
        return run, r.series.step_count(run.run_id), r.events.errors(run.run_id), r.rank_rows(run.run_id)


@pytest.mark.faults
def test_partial_line_waits_until_complete(env):
    root, index, ingest = env
    path = write_steps(root / "r", 0, range(1, 3))
    line = step_line("r", 0, 3)
    append_raw(path, line[:25])
    for _ in range(20):
        ingest()
    run, count, errors, _ = _run(index, "r")
    assert count == 2 and errors == ()
    append_raw(path, line[25:])
    ingest()
    run, count, errors, ranks = _run(index, "r")
    assert count == 3 and errors == ()
    assert ranks[0].last_step == 3 and ranks[0].records == 3


@pytest.mark.faults
def test_truncate_and_regrow_starts_a_new_generation(env):
    root, index, ingest = env
    path = write_steps(root / "r", 0, range(1, 11))
    ingest()
    os.truncate(path, 0)
    # Regrown past the old offset before the next poll: only the header tells.
    write_steps(root / "r", 0, range(1, 41))
    ingest()
    run, count, errors, ranks = _run(index, "r")
    assert count == 40 and errors == ()
    assert ranks[0].last_step == 40


@pytest.mark.faults
def test_rename_replace_is_read_from_the_start(env):
    root, index, ingest = env
    path = write_steps(root / "r", 0, range(1, 6))
    ingest()
    tmp = path.with_name("new.tmp")
    tmp.write_bytes(header_line("r", 0) + b"".join(step_line("r", 0, s) for s in range(1, 9)))
    os.replace(tmp, path)
    ingest()
    _, count, errors, ranks = _run(index, "r")
    assert count == 8 and errors == () and ranks[0].last_step == 8


@pytest.mark.faults
def test_headers_identical_in_first_64_bytes_are_different_files(env):
    root, index, ingest = env
    prefix = '{"kind":"header","v":1,"run":"' + "x" * 60 + '",'
    for rank in (0, 1):
        path = steps_path(root / "r", rank)
        path.parent.mkdir(parents=True)
        head = (prefix + f'"rank":{rank},"attempt":0,"uuid":"u{rank}","ts":1.0}}\n').encode()
        path.write_bytes(head + b"".join(step_line("r", rank, s) for s in range(1, 4)))
    a = steps_path(root / "r", 0)
    assert a.read_bytes()[:64] == steps_path(root / "r", 1).read_bytes()[:64]
    ingest()
    # Replace rank 0's file by one whose first 64 bytes match but whose header differs (new uuid).
    head = (prefix + '"rank":0,"attempt":0,"uuid":"other","ts":2.0}\n').encode()
    tmp = a.with_name("x.tmp")
    tmp.write_bytes(head + b"".join(step_line("r", 0, s) for s in range(1, 7)))
    os.replace(tmp, a)
    ingest()
    _, count, errors, ranks = _run(index, "r")
    assert errors == ()
    assert {(k.rank, k.last_step) for k in ranks} == {(0, 6), (1, 3)}
    assert count == 9


@pytest.mark.faults
def test_long_line_is_one_error_and_the_skip_persists(env):
    root, index, ingest = env
    path = write_steps(root / "r", 0, range(1, 3))
    append_raw(path, b'{"v":1,"kind":"step","pad":"' + b"a" * (5 << 20) + b'"}\n')
    append_raw(path, step_line("r", 0, 3))
    ingest()
    ingest()  # a fresh ingester: the skip was committed with the offset
    _, count, errors, _ = _run(index, "r")
    assert count == 3
    assert len(errors) == 1 and "longer than" in errors[0].message


@pytest.mark.faults
def test_lines_after_a_long_line_ending_near_a_read_windows_end_are_all_stored(env):
    """Found by fuzzing: a line over the limit and over one read (4 MiB) that ends less than the limit before
    the next read's end, the next line crossing that end: the read stopped there, and every line after the long
    one was lost until the file changed (a second ingest read nothing: the size was recorded)."""
    from daemon import stream

    root, index, ingest = env
    path = write_steps(root / "r", 0, range(1, 3))
    start = path.stat().st_size
    # the long line ends 100 bytes before the end of the second read window from its start
    append_raw(path, b"x" * (2 * stream.READ_BYTES - 100 - 1) + b"\n")
    assert path.stat().st_size == start + 2 * stream.READ_BYTES - 100
    append_raw(path, b"".join(step_line("r", 0, s) for s in range(3, 9)))  # step 3 crosses that end
    ingest()
    ingest()
    _, count, errors, ranks = _run(index, "r")
    assert count == 8 and ranks[0].last_step == 8
    assert len(errors) == 1 and "longer than" in errors[0].message


@pytest.mark.faults
def test_long_line_still_being_written_is_skipped_once(env):
    root, index, ingest = env
    path = write_steps(root / "r", 0, range(1, 2))
    append_raw(path, b'{"pad":"' + b"b" * (2 << 20))
    ingest()
    append_raw(path, b"b" * (1 << 20) + b'"}\n' + step_line("r", 0, 2))
    ingest()
    _, count, errors, _ = _run(index, "r")
    assert count == 2 and len(errors) == 1


BAD_LINES = [
    b'{"v":1,"kind":"step"',  # truncated object
    b"not json at all",
    b"[1, 2, 3]",
    b"42",
    b'"a string"',
    b"{}",
    b'{"v":1,"kind":"step","run":"r","rank":0,"attempt":0,"step":"seven","ts":1}',
    b'{"a":1},{"b":2}',
    b'{"v":1,"kind":"step","run":"r\xff\xfe","rank":0,"attempt":0,"step":9,"ts":1}',  # bad UTF-8
    b'{"v":1,"kind":"step","run":"r","rank":0,"attempt":0,"step":9,"ts":1,"note":"\xc3\x28"}',
    b"\x00\x00\x00\x00",
]


@pytest.mark.faults
def test_malformed_lines_become_error_rows_and_never_stall(env):
    root, index, ingest = env
    path = write_steps(root / "r", 0, range(1, 3))
    write_steps(root / "r", 1, range(1, 4))  # another stream of the run goes on
    for i, bad in enumerate(BAD_LINES):
        append_raw(path, bad + b"\n")
        append_raw(path, step_line("r", 0, 3 + i))
    ingest()
    _, count, errors, ranks = _run(index, "r")
    assert len(errors) == len(BAD_LINES)
    assert count == 2 + len(BAD_LINES) + 3
    assert all(e.path == "ranks/rank_0/steps-0.jsonl" for e in errors)
    assert any("UTF-8" in e.message for e in errors)
    ingest()  # nothing is reported twice
    assert len(_run(index, "r")[2]) == len(BAD_LINES)


@pytest.mark.faults
def test_nul_padding_and_crlf(env):
    root, index, ingest = env
    path = write_steps(root / "r", 0, range(1, 3))
    append_raw(path, b"\x00" * 64)  # preallocated tail seen over NFS: not a line yet
    ingest()
    assert _run(index, "r")[1] == 2
    crlf = write_steps(root / "r", 1, [], header=True)
    append_raw(crlf, b"".join(step_line("r", 1, s)[:-1] + b"\r\n" for s in range(1, 5)))
    ingest()
    _, count, errors, ranks = _run(index, "r")
    assert count == 6 and errors == ()
    assert {k.rank: k.last_step for k in ranks} == {0: 2, 1: 4}


@pytest.mark.faults
def test_symlinks_out_of_the_root_and_fifos_are_not_followed(env, tmp_path):
    root, index, ingest = env
    outside = tmp_path / "outside"
    write_steps(outside / "elsewhere", 0, range(1, 5))
    os.symlink(outside / "elsewhere", root / "linked")
    os.symlink(outside, root / "linkdir")
    write_steps(root / "r", 0, range(1, 3))
    os.symlink(steps_path(outside / "elsewhere", 0), steps_path(root / "r", 0).with_name("steps-1.jsonl"))
    fifo = steps_path(root / "r", 2)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    ingest()
    with Reader(index) as r:
        assert [run.name for run in r.list_runs()] == ["r"]
        run = r.list_runs()[0]
        assert r.series.step_count(run.run_id) == 2
        assert [(k.rank, k.attempt) for k in r.rank_rows(run.run_id)] == [(0, 0)]


@pytest.mark.faults
def test_a_linked_run_subfolder_is_not_followed(env, tmp_path):
    root, index, ingest = env
    outside = tmp_path / "outside"
    atomic_write_json(outside / "requests" / "ck9.json", {"checkpoint": "ck9", "step": 9, "path": "p",
                                                          "config_digest": "d", "created": 1.0})
    write_steps(root / "r", 0, range(1, 3))
    os.symlink(outside, root / "r" / "validation")
    ingest()
    with Reader(index) as r:
        assert r.backlog.entries(r.find_run("r").run_id) == ()


@pytest.mark.faults
def test_removed_run_keeps_rows_and_is_marked_missing(env):
    root, index, ingest = env
    write_steps(root / "gone", 0, range(1, 6))
    write_steps(root / "kept", 0, range(1, 3))
    ingest()
    shutil.rmtree(root / "gone")
    ingest()
    with Reader(index) as r:
        runs = {run.name: run for run in r.list_runs()}
        assert runs["gone"].status == "missing" and runs["gone"].records == 5
        assert r.series.step_count(runs["gone"].run_id) == 5
        assert runs["kept"].status != "missing"
    from daemon import cli

    assert cli.main(["--prune-missing", "--index", str(index)]) == 0  # the only way rows leave
    with Reader(index) as r:
        assert [run.name for run in r.list_runs()] == ["kept"]
        assert r.series.step_count(runs["gone"].run_id) == 0 and r.series.step_count(runs["kept"].run_id) == 2


def test_live_aggregates_series_and_status(env):
    root, index, ingest = env
    run_dir = root / "big"
    for rank, ms in ((0, 100.0), (1, 100.0), (2, 200.0)):
        write_steps(run_dir, rank, range(1, 5001), step_ms=ms, ratio=0.5)
    ingest()
    with Reader(index, stall_floor_s=3600) as r:
        run = r.find_run("big")
        # records stamped long before the ingester read them to the end: found silent, so stalled (core rule)
        assert run.status == "stalled" and run.ranks == 3 and run.last_step == 5000
        assert run.slowest_rank == 2 and run.straggler_score == pytest.approx(2.0)
        assert run.steps_per_s == 0.0  # stalled: a run that does not move (daemon/rates.py)
        at_end = r.run(run.run_id, now=run.last_ts)  # as of its newest record it was running ...
        assert at_end.status == "running" and at_end.steps_per_s == pytest.approx(1.0)  # ... 1 step per s of ts
        rows = r.rank_rows(run.run_id)
        # step time = gap (step_ms / 10 in these records) + traced step (core.steptime)
        assert rows[2].median_step_ms == pytest.approx(220.0) and rows[0].median_input_wait_ms == pytest.approx(10.0)
        parts = rows[2].step_parts
        assert parts["whole"] == pytest.approx(220.0) and parts["between_steps"] == pytest.approx(20.0)
        assert parts["residual"] == pytest.approx(200.0) and parts["data_wait"] is None and parts["steps"] == 64
        assert parts["clock"] == "cpu"
        assert rows[0].ratios == (("mse", 0.5),)
        s = r.series.points(run.run_id, 0, "loss")
        assert 0 < len(s.points) <= 2000
        assert sum(p.n for p in s.points) == 5000
        assert s.points[0].vmax == pytest.approx(1.0) and s.points[0].vmin < s.points[0].vmax
        assert s.points[-1].step_hi == 5000
        assert len(r.series.points(run.run_id, 0, "ratio/mse").points) == len(s.points)
        assert len(r.series.points(run.run_id, 0, "step_ms", max_points=100).points) <= 100
        step_ms = r.series.points(run.run_id, 0, "step_ms").points
        assert all(p.vmin == p.vmax == pytest.approx(110.0) for p in step_ms)  # gap + traced step
        assert "step_ms" in r.series.metrics(run.run_id)
        v = r.data_version()
    # Append more: version moves, changes name this run, and an appended rank_end completes it.
    append_raw(steps_path(run_dir, 0), records.encode(records.Eval(
        v=1, run="big", rank=0, attempt=0, step=5000, ts=6999.0, checkpoint="ck5000", split="val",
        metrics={"auc": 0.75})))
    for rank in range(3):
        append_raw(steps_path(run_dir, rank), records.encode(records.RankEnd(
            v=1, run="big", rank=rank, attempt=0, step=5000, ts=7000.0, status="completed", exit_code=0)))
    ingest()
    with Reader(index, stall_floor_s=0.0) as r:
        ch = r.changes_since(v)
        assert ch.version > v and ch.run_ids == (run.run_id,)
        assert r.run(run.run_id).status == "completed"
        evals = r.events.recent(run.run_id, "eval")
        assert [(e.step, e.body["checkpoint"], e.body["metrics"]) for e in evals] == [(5000, "ck5000", {"auc": 0.75})]
        assert {k.rank: k.ended for k in r.rank_rows(run.run_id)} == {0: "completed", 1: "completed", 2: "completed"}


def test_stalled_failed_outcomes_backlog_and_nodes(env):
    root, index, ingest = env
    run_dir = root / "r"
    write_steps(run_dir, 0, range(1, 4))
    node = run_dir / "nodes" / "node_0"
    node.mkdir(parents=True)
    sysfile = node / "system.jsonl"
    append_raw(sysfile, records.encode(records.Header(v=1, run="r", rank=-1, attempt=0, uuid="n0", ts=1.0,
                                                      node_rank=0, stream="system")))
    for t in range(5):
        append_raw(sysfile, records.encode(records.SystemSample(
            v=1, run="r", node_rank=0, ts=10.0 + t, cpu_pct=50.0 + t,
            gpus=[records.GpuSample(index=0, util_pct=90.0)])))
    v = run_dir / "validation"
    now = time.time()
    atomic_write_json(v / "requests" / "ck1.json", {"checkpoint": "ck1", "step": 100, "path": "ck/1", "config_digest": "d", "created": now})
    atomic_write_json(v / "requests" / "ck2.json", {"checkpoint": "ck2", "step": 200, "path": "ck/2", "config_digest": "d", "created": now})
    atomic_write_json(v / "requests" / "ck3.json", {"checkpoint": "ck3", "step": 300, "path": "ck/3", "config_digest": "d", "created": now})
    atomic_write_json(v / "receipts" / "ck1.json", {"checkpoint": "ck1", "step": 100, "config_digest": "d", "metrics": {"auc": 0.9}, "completed": now})
    atomic_write_json(v / "claims" / "ck2.json", {"checkpoint": "ck2", "owner": {"host": "h", "pid": 1, "start_time": 1}, "claimed": now, "heartbeat": now, "lease_s": 600})
    atomic_write_json(v / "failures" / "ck3-1.json", {"checkpoint": "ck3", "attempt": 1, "error": "OOM", "failed": now})
    (v / "requests" / "broken.json").write_text("{not json")
    ingest()
    with Reader(index, stall_floor_s=0.0) as r:  # steps are 1 s apart: the stall limit is 10 intervals
        run = r.find_run("r")
        later = time.time() + 60  # nothing recorded nor ingested for longer than the limit
        assert r.run(run.run_id, now=later).status == "stalled"
        assert r.rank_rows(run.run_id, now=later)[0].stalled
        items = {b.checkpoint: b for b in r.backlog.entries(run.run_id)}
        assert {k: b.state for k, b in items.items()} == {"ck1": "completed", "ck2": "claimed", "ck3": "failed"}
        assert items["ck1"].metrics == (("auc", 0.9),) and items["ck3"].last_error == "OOM"
        samples = r.series.node_samples(run.run_id)
        assert [s.cpu_pct for s in samples] == [50.0, 51.0, 52.0, 53.0, 54.0] and samples[0].gpus[0]["util_pct"] == 90.0
        assert any(e.path == "validation/requests/broken.json" for e in r.events.errors(run.run_id))
    atomic_write_json(node / "guard_outcome.json", {"schema_version": 1, "run_name": "r", "node_rank": 0,
                                                    "training": {"status": "failed", "exit_code": 3}})
    os.unlink(v / "claims" / "ck2.json")  # claim released: back to pending
    ingest()
    with Reader(index) as r:
        detail = r.run_detail(r.find_run("r").run_id)
        assert detail.run.status == "failed"
        assert [(o.node, o.status, o.exit_code) for o in detail.outcomes] == [(0, "failed", 3)]
        assert {b.checkpoint: b.state for b in r.backlog.entries(detail.run.run_id)}["ck2"] == "pending"
        assert detail.nodes == (0,)


def test_an_undecodable_manifest_leaves_its_facts_null_and_is_one_error(env):
    root, index, ingest = env
    run_dir = root / "m"
    # A wrong-typed field makes the whole manifest unreadable (core.artifacts): no half of one is used.
    atomic_write_json(run_dir / "manifest.json", {"run_name": "pretty", "status": "completed", "nnodes": "two",
                                                  "guard": {"training": "oops"}, "world_size": 4})
    ingest()
    ingest()
    with Reader(index) as r:
        run = r.list_runs()[0]
        assert run.name == "m" and run.manifest_status is None and run.world_size is None and run.nnodes is None
        errors = r.events.errors(run.run_id)
        assert len(errors) == 1 and errors[0].path == "manifest.json"
        assert errors[0].message.startswith("manifest.json: not a valid manifest")
        assert run.errors == 1
