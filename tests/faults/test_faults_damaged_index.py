"""Item 10: a corrupt, truncated or future-schema index: one line naming it and what to do, exit 1, no traceback."""

from __future__ import annotations

import sqlite3

import pytest

from support.daemon_files import write_steps

pytestmark = pytest.mark.faults


def _damage(env, how: str) -> None:
    write_steps(env.root / "r", 0, range(1, 3001))
    env.ingest()
    data = env.index.read_bytes()
    if how == "garbage":
        env.index.write_bytes(b"this is not a database" * 400)
    elif how == "truncated":
        env.index.write_bytes(data[: len(data) // 2])
    elif how == "corrupt-page":  # a header that still says SQLite, a b-tree page overwritten
        page = int.from_bytes(data[16:18], "big")
        env.index.write_bytes(data[: 2 * page] + b"\xff" * page + data[3 * page:])
    elif how == "future":
        db = sqlite3.connect(env.index, isolation_level=None)
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        db.close()  # checkpoints the WAL into the file


@pytest.mark.parametrize("how", ["garbage", "truncated", "corrupt-page", "future"])
@pytest.mark.parametrize("command", ["daemon", "status"])
def test_damaged_index_is_one_line_and_exit_1(env, how, command):
    _damage(env, how)
    before = env.index.read_bytes()
    args = ("daemon", str(env.root), "--once", "--no-inotify") if command == "daemon" else ("status",)
    out = env.cli(*args)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(env.index) in lines[0], out.stderr
    if how != "future":
        assert "move it aside" in lines[0] and "--index" in lines[0]
    assert env.index.read_bytes() == before  # untouched, never deleted


def _chattr(flag: str, path) -> bool:
    import shutil
    import subprocess

    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_immutable_index_is_one_line_for_the_writer_and_still_readable(env):
    """Item 10: an immutable index: the daemon says so in one line (exit 1); `status` still reads it."""
    write_steps(env.root / "r", 0, range(1, 50))
    env.ingest()
    if not _chattr("+i", env.index):
        pytest.skip("chattr +i is not available here (needs root and a filesystem with the flag)")
    try:
        before = env.index.read_bytes()
        out = env.cli("daemon", str(env.root), "--once", "--no-inotify")
        assert out.returncode == 1, (out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
        assert str(env.index) in lines[0] and "writing" in lines[0] and "--index" in lines[0]
        status = env.cli("status")
        assert status.returncode == 0 and any(line.split()[:1] == ["r"] for line in status.stdout.splitlines()), \
            status.stdout + status.stderr
        assert env.index.read_bytes() == before
    finally:
        _chattr("-i", env.index)
