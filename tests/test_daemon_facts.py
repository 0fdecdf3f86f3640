"""The facts the state rules need, as the ingester stores them (docs/daemon.md, "What the index stores").

Rank ends, their time and node, node outcomes and the manifest's declared
limits go into ``rank_live`` and ``runs`` decided by ``traceml_tui.core``
rules only; an index of schema version 1 is upgraded in place.
"""

from __future__ import annotations

import ast
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon import index as idx
from daemon import sidefiles
from daemon.reader import Reader
from traceml_tui.core import artifacts, records
from traceml_tui.core.atomic import atomic_write_bytes, atomic_write_json

from support.daemon_files import append_raw, make_v2_index, step_line, steps_path
from support.daemon_files import index_rows as _rows

DAEMON = Path(__file__).resolve().parents[1] / "daemon"


def _rank(run_dir: Path, rank: int, steps, *, node=None, end=None, exit_code=None, end_ts=None, header=True) -> None:
    """One rank stream: a header naming its node, steps 1 s apart from ts 1001, and maybe a rank_end."""
    path = steps_path(run_dir, rank)
    if header:
        append_raw(path, records.encode(records.Header(v=1, run=run_dir.name, rank=rank, attempt=0,
                                                       uuid=f"{run_dir.name}-{rank}", ts=1000.0, node_rank=node)))
    for s in steps:
        append_raw(path, step_line(run_dir.name, rank, s))
    if end is not None:
        last = max(steps) if steps else 0
        append_raw(path, records.encode(records.RankEnd(
            v=1, run=run_dir.name, rank=rank, attempt=0, step=last, ts=end_ts if end_ts is not None else 2000.0 + rank,
            status=end, exit_code=exit_code)))


def _run_row(index: Path, name: str, cols: str):
    return _rows(index, f"SELECT {cols} FROM runs WHERE name = ?", (name,))[0]


def _outcome(node_dir: Path, node: int, status: str, exit_code) -> None:
    atomic_write_json(node_dir / "guard_outcome.json", {"schema_version": 1, "run_name": "r", "node_rank": node,
                                                        "training": {"status": status, "exit_code": exit_code}})


# --------------------------------------------------------------------------- rank ends


def test_a_clean_exit_is_not_a_failed_rank(env):
    """``exited`` is what the SDK writes after a normal return: the review found every such run shown failed."""
    root, index, ingest = env
    run_dir = root / "r"
    _rank(run_dir, 0, range(1, 4), node=0, end="exited", end_ts=2000.5)
    _rank(run_dir, 1, range(1, 4), node=0, end="completed", exit_code=0)
    _rank(run_dir, 2, range(1, 4), node=1, end="exited", exit_code=0)
    ingest()
    assert _run_row(index, "r", "ranks_total, ranks_ended, ranks_failed") == (3, 3, 0)
    assert _rows(index, "SELECT rank, ended, exit_code, end_ts, node FROM rank_live ORDER BY rank") == [
        (0, "exited", None, 2000.5, 0), (1, "completed", 0, 2001.0, 0), (2, "exited", 0, 2002.0, 1)]
    with Reader(index) as r:
        assert r.find_run("r").status == "completed"


@pytest.mark.parametrize("status, exit_code, failed", [
    ("failed", None, 1), ("failed", 1, 1), ("exited", 3, 1), ("completed", -9, 1), ("interrupted", None, 0),
    ("exited", None, 0), ("weird", None, 1),
])
def test_ranks_failed_follows_the_core_rank_rule(env, status, exit_code, failed):
    root, index, ingest = env
    _rank(root / "r", 0, range(1, 3), end=status, exit_code=exit_code)
    _rank(root / "r", 1, range(1, 3), end="exited")
    ingest()
    assert _run_row(index, "r", "ranks_ended, ranks_failed") == (2, failed)


def test_node_comes_from_the_header_even_when_steps_arrive_after_a_restart(env):
    root, index, ingest = env
    run_dir = root / "r"
    _rank(run_dir, 0, [], node=3)  # header only: no rank row yet
    _rank(run_dir, 1, range(1, 3), header=True)  # no node_rank in its header
    ingest()
    assert _rows(index, "SELECT rank, node FROM rank_live ORDER BY rank") == [(1, None)]
    for s in (1, 2):
        append_raw(steps_path(run_dir, 0), step_line("r", 0, s))
    ingest()  # a new ingester: the node is read back from the committed header
    assert _rows(index, "SELECT rank, node, records, end_ts FROM rank_live ORDER BY rank") == [
        (0, 3, 2, None), (1, None, 2, None)]


# --------------------------------------------------------------------------- side files


def test_outcomes_nodes_and_failures(env):
    root, index, ingest = env
    run_dir = root / "r"
    _rank(run_dir, 0, range(1, 3), node=0)
    nodes = run_dir / "nodes"
    _outcome(nodes / "node_0", 0, "completed", 0)
    _outcome(nodes / "node_1", 1, "completed", 137)  # a non-zero exit code is a failure
    _outcome(nodes / "node_10", 10, "completed", None)
    atomic_write_json(nodes / "node_2" / "guard_outcome.json", {"training": "oops"})  # not an outcome
    ingest()
    assert _run_row(index, "r", "outcomes_total, outcomes_failed, outcome_nodes") == (3, 1, "0,1,10")
    with Reader(index) as r:
        run = r.find_run("r")
        errors = r.events.errors(run.run_id)
        assert [e.path for e in errors] == ["nodes/node_2/guard_outcome.json"]
        assert "not a valid outcome" in errors[0].message
        assert run.status == "failed"
        assert dict(run.rank_states) == {0: "lost"}  # its node's outcome is written and it never ended
    (nodes / "node_1" / "guard_outcome.json").unlink()
    ingest()
    assert _run_row(index, "r", "outcomes_total, outcomes_failed, outcome_nodes") == (2, 0, "0,10")


def test_manifest_facts_come_from_the_typed_manifest(env):
    root, index, ingest = env
    run_dir = root / "r"
    _rank(run_dir, 0, range(1, 3))  # still a run without its manifest
    manifest = artifacts.Manifest(
        run_name="pretty", status="completed", started_at=0.0, ended_at=60.0,
        topology=artifacts.Topology(nnodes=2, nproc_per_node=4, world_size=8),
        guard=artifacts.Guard(training=artifacts.GuardTraining(status="incomplete")),
        hygiene={"validation": {"max_attempts": 5}})
    atomic_write_bytes(run_dir / "manifest.json", artifacts.encode(manifest))
    ingest()
    assert _run_row(index, "pretty", "manifest_status, training_status, nnodes, nproc_per_node, world_size,"
                    " started_at, ended_at, max_attempts") == (
        "completed", "incomplete", 2, 4, 8, "1970-01-01T00:00:00Z", "1970-01-01T00:01:00Z", 5)
    with Reader(index) as r:
        assert r.find_run("pretty").status == "failed"  # a completed launch with an incomplete guard outcome
    atomic_write_bytes(run_dir / "manifest.json", artifacts.encode(artifacts.Manifest(run_name="pretty")))
    ingest()
    assert _run_row(index, "pretty", "manifest_status, nnodes, max_attempts") == ("running", None, None)
    (run_dir / "manifest.json").unlink()
    ingest()  # its facts go with it; the run is named after its folder again
    assert _rows(index, "SELECT name, manifest_status FROM runs") == [("r", None)]


def test_summary_status_and_a_bad_summary(env):
    root, index, ingest = env
    run_dir = root / "r"
    _rank(run_dir, 0, range(1, 3))
    atomic_write_json(run_dir / "final_summary.json", {"run_context": {"run": {"status": "completed"}}})
    ingest()
    assert _run_row(index, "r", "summary_status, errors") == ("completed", 0)
    atomic_write_json(run_dir / "final_summary.json", {"run_context": {"run": {"status": 3}}})
    ingest()
    assert _run_row(index, "r", "summary_status, errors") == (None, 1)


def test_sidefiles_parse_is_pure_and_typed():
    m = sidefiles.parse("manifest", "manifest.json", None, artifacts.encode(artifacts.Manifest(
        run_name="x", status="failed", hygiene={"validation": {"max_attempts": 2}})))
    assert m.error is None and m.facts.status == "failed" and m.facts.max_attempts == 2 and m.facts.run_name == "x"
    bad = sidefiles.parse("manifest", "manifest.json", None, b'{"status": "completed"}')  # run_name is required
    assert bad.facts is None and bad.content == '{"status": "completed"}' and "run_name" in bad.error
    assert sidefiles.parse("summary", "final_summary.json", None, b"[1]") == (
        None, "final_summary.json: not a JSON object", None, None)
    o = sidefiles.parse("outcome", "nodes/node_4/guard_outcome.json", "4",
                        b'{"training": {"status": "completed", "exit_code": 0}}')
    assert o.facts == sidefiles.OutcomeFacts(4, "completed", 0, False)
    claim = sidefiles.parse("claim", "validation/claims/ck-7.json", "ck-7", b'{"checkpoint": "ck-7"}')
    assert claim.key == "ck-7" and claim.facts is None and claim.error is None
    # A backlog file is decoded by the one backlog decoder (core.hygiene_files): one that names another
    # checkpoint than its file is kept as content, keyed by what it says, and named as an error.
    other = sidefiles.parse("claim", "validation/claims/a.json", "a", b'{"checkpoint": "ck-7"}')
    assert other.key == "ck-7" and other.facts is None and "names checkpoint 'ck-7'" in other.error
    assert sidefiles.outcome_rollup([o.facts, None, sidefiles.OutcomeFacts(1, "failed", 1, True)]) == (2, 1, "1,4")
    assert sidefiles.outcome_rollup([]) == (0, 0, None)


# --------------------------------------------------------------------------- an index of an older version


def _downgrade_to_v1(index: Path) -> None:
    """Make ``index`` look written by schema version 1 (no new columns, the old ranks_failed rule's count)."""
    added = [(table, column) for table, column, _ in reversed(idx.ADDED_COLUMNS)]
    make_v2_index(index, lacking=tuple(column for table, column in added if table == "steps"))
    conn = sqlite3.connect(index)
    try:
        for table, column in added:
            if table != "steps":
                conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.execute("UPDATE rank_live SET node = NULL")  # version 1 never wrote it
        conn.execute("UPDATE runs SET ranks_failed = ranks_ended")  # every 'exited' counted as failed
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        conn.commit()
    finally:
        conn.close()


@pytest.mark.skipif(sqlite3.sqlite_version_info < (3, 35), reason="DROP COLUMN needs SQLite 3.35")
def test_a_version_1_index_is_upgraded_in_place_and_keeps_missing_runs(env):
    root, index, ingest = env
    for name in ("kept", "gone"):
        run_dir = root / name
        _rank(run_dir, 0, range(1, 4), node=1, end="exited", end_ts=2100.0)
        _outcome(run_dir / "nodes" / "node_1", 1, "completed", 0)
        atomic_write_bytes(run_dir / "manifest.json", artifacts.encode(artifacts.Manifest(
            run_name=name, status="completed", hygiene={"validation": {"max_attempts": 4}})))
    ingest()
    shutil.rmtree(root / "gone")
    ingest()
    expected = _rows(index, "SELECT name, missing, records, ranks_failed, outcome_nodes, max_attempts, outcomes_total"
                            " FROM runs ORDER BY name")
    assert expected == [("gone", 1, 3, 0, "1", 4, 1), ("kept", 0, 3, 0, "1", 4, 1)]
    steps_before = _rows(index, "SELECT count(*) FROM steps")
    _downgrade_to_v1(index)
    assert _rows(index, "SELECT ranks_failed FROM runs") == [(1,), (1,)]

    ingest()  # the writer upgrades: columns added, values derived from what the index holds
    assert _rows(index, "SELECT value FROM meta WHERE key = 'schema_version'") == [(str(idx.SCHEMA_VERSION),)]
    assert _rows(index, "SELECT value FROM meta WHERE key = 'rederive'") == []
    assert _rows(index, "SELECT name, missing, records, ranks_failed, outcome_nodes, max_attempts, outcomes_total"
                        " FROM runs ORDER BY name") == expected
    assert _rows(index, "SELECT node, end_ts FROM rank_live") == [(1, 2100.0), (1, 2100.0)]
    assert _rows(index, "SELECT count(*) FROM steps") == steps_before
    assert _rows(index, "SELECT count(*) FROM errors") == [(0,)]
    with Reader(index) as r:
        assert {run.name: str(run.status) for run in r.list_runs()} == {"kept": "completed", "gone": "missing"}


def test_an_index_of_a_newer_version_is_refused_untouched(env, tmp_path):
    root, index, ingest = env
    _rank(root / "r", 0, range(1, 3))
    ingest()
    conn = sqlite3.connect(index)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(idx.IndexSchemaError):
        ingest()
    from daemon import cli

    assert cli.main([str(root), "--index", str(index), "--once"]) == 1
    assert _rows(index, "SELECT value FROM meta WHERE key = 'schema_version'") == [("99",)]
    assert _rows(index, "SELECT count(*) FROM steps") == [(2,)]


# --------------------------------------------------------------------------- boundaries


def test_the_daemon_imports_only_the_core():
    """daemon/ may import traceml_tui.core (and stdlib, msgspec, numpy, inotify_simple, psutil, prometheus_client
    for --metrics), never other parts."""
    allowed_third_party = {"msgspec", "numpy", "inotify_simple", "watchdog", "psutil", "prometheus_client"}
    import sys

    stdlib = set(sys.stdlib_module_names)
    bad = []
    for path in sorted(DAEMON.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                ok = (name == "traceml_tui.core" or name.startswith("traceml_tui.core.") or top == "daemon"
                      or top in stdlib or top in allowed_third_party)
                if not ok:
                    bad.append(f"{path.name}: {name}")
    assert bad == []


@given(st.floats(0, 4e9, allow_nan=False))
def test_a_stored_launch_time_reads_back_to_the_millisecond(seconds):
    """The runs table keeps the manifest's start and end as text (sidefiles.time_text); the run's duration is
    computed from them (views.run_times), so they keep milliseconds and read back within half of one."""
    text = sidefiles.time_text(seconds)
    assert sidefiles.time_of_text(text) == pytest.approx(seconds, abs=5e-4 + 1e-6)
    if seconds == int(seconds):
        assert text.endswith(":" + time.strftime("%S", time.gmtime(seconds)) + "Z")  # whole seconds as before


def test_a_run_lasts_from_its_launch_to_its_end_on_every_surface():
    """A run that hung 45 s after its last record and was then stopped read 1 s in the Runs table (first record
    to newest) and 53 s on its Run screen (the manifest's start and end): one rule, the launch's span
    widened by its records, to now while it is live (found trying the product)."""
    from daemon.views import run_times
    from traceml_tui.core.state import RunStatus

    # launched at 100, records from 106 to 107, stopped at 153
    assert run_times(RunStatus.INTERRUPTED, 106.0, 107.0, 500.0, 100.0, 153.0) == (393.0, 53.0)
    assert run_times(RunStatus.COMPLETED, 106.0, 107.0, 500.0) == (393.0, 1.0)  # no launcher: the records
    assert run_times(RunStatus.STALLED, 106.0, 107.0, 500.0, 100.0, 90.0) == (393.0, 400.0)  # live: to now
    assert run_times(RunStatus.RUNNING, None, None, 500.0, 100.0, None) == (None, 400.0)  # launched, no record
    assert run_times(RunStatus.LOST, 106.0, 107.0, 500.0, 100.0, None) == (393.0, 7.0)
