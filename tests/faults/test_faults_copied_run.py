"""Item 6: a copied run folder (identical stream headers) gets its own events and error rows."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from support.daemon_files import append_raw, write_steps

pytestmark = pytest.mark.faults


def _make_run(env) -> None:
    path = write_steps(env.root / "runA", 0, range(1, 6))
    append_raw(path, b'{"kind":"eval","v":1,"run":"runA","rank":0,"attempt":0,"step":5,"ts":2.0,'
                     b'"metrics":{"acc":0.5}}\n')
    append_raw(path, b"not json\n")
    append_raw(path, b'{"kind":"rank_end","v":1,"run":"runA","rank":0,"attempt":0,"step":5,"ts":3.0,'
                     b'"status":"completed","exit_code":0}\n')


def _kinds(env, name):
    _, steps, errors, events = env.run(name)
    return steps, len(errors), sorted(e.kind for e in events)


def test_copied_run_gets_its_events_and_errors(env):
    _make_run(env)
    shutil.copytree(env.root / "runA", env.root / "runA-copy")
    env.ingest()
    assert _kinds(env, "runA") == (5, 1, ["eval", "rank_end"])
    assert _kinds(env, "runA-copy") == (5, 1, ["eval", "rank_end"])
    with sqlite3.connect(env.index) as db:
        assert db.execute("SELECT count(*) FROM rank_live WHERE ended = 'completed'").fetchone() == (2,)


def test_index_keyed_without_the_run_is_rekeyed_on_open(env):
    _make_run(env)
    env.ingest()
    # The earlier layout: events and error rows unique on (identity, generation, offset) only.
    db = sqlite3.connect(env.index, isolation_level=None)
    for table, key in (("events", "PRIMARY KEY (identity, generation, offset)"),
                       ("errors", "UNIQUE (identity, generation, offset)")):
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
        old = sql.replace(key.replace("(", "(run_id, ", 1), key)
        assert old != sql
        db.execute(f"ALTER TABLE {table} RENAME TO {table}_x")
        db.execute(old)
        db.execute(f"INSERT INTO {table} SELECT * FROM {table}_x")
        db.execute(f"DROP TABLE {table}_x")
    db.close()
    shutil.copytree(env.root / "runA", env.root / "runA-copy")
    env.ingest()
    assert _kinds(env, "runA") == (5, 1, ["eval", "rank_end"])
    assert _kinds(env, "runA-copy") == (5, 1, ["eval", "rank_end"])
    with sqlite3.connect(env.index) as db:
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"events_run", "errors_run"} <= names
