"""Item 8: a rotated stream is drained before its successor, and a NUL-filled region is never committed past."""

from __future__ import annotations

import os

import pytest
from test_daemon_support import header_line, step_line, steps_path, write_steps

from daemon.service import Ingester

pytestmark = pytest.mark.faults


def _lines(*lines: bytes) -> bytes:
    return b"".join(x if x.endswith(b"\n") else x + b"\n" for x in lines)


@pytest.mark.parametrize("restart", [False, True])
def test_rotated_file_is_drained_before_the_new_one(env, restart):
    path = write_steps(env.root / "r", 0, range(1, 6))
    live = Ingester(env.index, [str(env.root)], poll_interval=0.05, use_inotify=False)
    try:
        live.run_once()
        write_steps(env.root / "r", 0, range(6, 11), header=False)  # 5 lines not read yet
        os.rename(path, str(path) + ".1")  # rotation, then a new file at the old name
        path.write_bytes(_lines(header_line("r", 0), *(step_line("r", 0, s) for s in range(11, 16))))
        if restart:
            live.close()
            env.ingest()
        else:
            live.run_once()
    finally:
        live.close()
    _, steps, errors, _ = env.run("r")
    assert steps == 15 and not errors


def test_nul_region_overwritten_later_is_read(env):
    write_steps(env.root / "r", 0, range(1, 4))
    path = steps_path(env.root / "r", 0)
    env.ingest()
    late = _lines(*(step_line("r", 0, s) for s in (4, 5)))
    landed = _lines(step_line("r", 0, 6))
    with open(path, "ab") as fh:  # the file was extended; lines 4-5 have not landed yet, line 6 has
        fh.write(b"\0" * len(late) + landed)
    env.ingest()
    _, steps, errors, _ = env.run("r")
    assert steps == 3 and not errors  # nothing past the NUL line is committed
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, late, os.path.getsize(path) - len(late) - len(landed))
    finally:
        os.close(fd)
    env.ingest()
    _, steps, errors, _ = env.run("r")
    assert steps == 6 and not errors


def test_nul_region_behind_a_line_of_nuls_only_is_waited_for(env):
    """A complete line of NULs only is a bad line (one error row), and the look-out for a NUL region goes on
    behind it: the region holding lines 4-5 (line 6 landed behind them) is not committed past until they land."""
    write_steps(env.root / "r", 0, range(1, 4))
    path = steps_path(env.root / "r", 0)
    env.ingest()
    late = _lines(*(step_line("r", 0, s) for s in (4, 5)))
    landed = _lines(step_line("r", 0, 6))
    with open(path, "ab") as fh:
        fh.write(b"\0" * 8 + b"\n" + b"\0" * len(late) + landed)
    env.ingest()
    _, steps, errors, _ = env.run("r")
    assert steps == 3 and len(errors) == 1  # the line of NULs only; nothing past the region
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, late, os.path.getsize(path) - len(late) - len(landed))
    finally:
        os.close(fd)
    env.ingest()
    _, steps, errors, _ = env.run("r")
    assert steps == 6 and len(errors) == 1
