"""Item 9: a full disk under the index is an error (exit 1, committed counts only); the live daemon backs off."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

import pytest

from daemon import cli
from daemon.service import IndexWriteError, Ingester

from support.daemon_files import write_steps

pytestmark = pytest.mark.faults


def _full(ing: Ingester, spare_pages: int = 2) -> None:
    """Test hook: cap the open index a few pages above its size (SQLITE_FULL: "database or disk is full")."""
    pages = ing.conn.execute("PRAGMA page_count").fetchone()[0]
    ing.conn.execute(f"PRAGMA max_page_count = {pages + spare_pages}")


def test_run_once_on_a_full_index_raises_and_counts_only_what_committed(env):
    write_steps(env.root / "r", 0, range(1, 20001))
    ing = Ingester(env.index, [str(env.root)], use_inotify=False)
    ing.open()
    try:
        _full(ing)
        with pytest.raises(IndexWriteError, match="database or disk is full"):
            ing.run_once()
        committed = ing.records_ingested
    finally:
        ing.close()
    with sqlite3.connect(env.index) as db:
        assert db.execute("SELECT count(*) FROM steps").fetchone()[0] == committed < 20000


def test_cli_once_on_a_full_index_exits_1_with_one_line(env, monkeypatch, capsys):
    write_steps(env.root / "r", 0, range(1, 20001))
    real_open = Ingester.open

    def open_full(self):
        real_open(self)
        _full(self)

    monkeypatch.setattr(Ingester, "open", open_full)
    rc = cli.main([str(env.root), "--index", str(env.index), "--once", "--no-inotify"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "ingested" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "database or disk is full" in lines[0] and str(env.index) in lines[0]


def test_live_daemon_backs_off_on_a_full_index(env, caplog):
    write_steps(env.root / "r", 0, range(1, 20001))
    ing = Ingester(env.index, [str(env.root)], poll_interval=0.02, rescan_interval=0.02, use_inotify=False)
    ing.open()
    _full(ing)
    caplog.set_level(logging.ERROR, logger="traceml.daemon")
    t = threading.Thread(target=ing.serve)
    t.start()
    time.sleep(1.5)
    ing.request_stop()
    t.join(10)
    ing.close()
    assert not t.is_alive()
    failures = [r for r in caplog.records if "full" in r.getMessage()]
    assert 1 <= len(failures) <= 2, [r.getMessage() for r in caplog.records]
