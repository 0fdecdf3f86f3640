"""Item 2: a folder swapped for a symbolic link after discovery is never followed out of the root."""

from __future__ import annotations

import os
import shutil

import pytest

from daemon.service import Ingester
from traceml_tui.core.rundir import open_under

from support.daemon_files import write_steps

pytestmark = pytest.mark.faults


def _outside(tmp_path):
    """A rank folder outside every root, holding a longer stream with the same header."""
    outside = tmp_path / "outside"
    write_steps(outside / "r", 0, range(1, 50))
    return outside / "r" / "ranks" / "rank_0"


@pytest.mark.parametrize("restart", [False, True])
def test_rank_folder_swapped_for_a_link_is_not_followed(env, tmp_path, restart):
    write_steps(env.root / "r", 0, range(1, 4))
    live = Ingester(env.index, [str(env.root)], poll_interval=0.05, use_inotify=False)
    try:
        live.run_once()
        rank_dir = env.root / "r" / "ranks" / "rank_0"
        shutil.rmtree(rank_dir)
        os.symlink(_outside(tmp_path), rank_dir)
        if restart:
            live.close()
            env.ingest()  # a new ingester over the same index
        else:
            live.run_once()  # the same, live ingester: its cached path now leads through the link
    finally:
        live.close()
    _, steps, _, _ = env.run("r")
    assert steps == 3  # the 49 lines outside the root were never read


def test_run_folder_swapped_for_a_link_is_not_followed(env, tmp_path):
    write_steps(env.root / "r", 0, range(1, 4))
    env.ingest()
    outside = tmp_path / "outside-run"
    write_steps(outside, 0, range(1, 50))
    shutil.rmtree(env.root / "r")
    os.symlink(outside, env.root / "r")
    env.ingest()
    run, steps, _, _ = env.run("r")
    assert steps == 3 and run.missing


def test_open_under_refuses_a_link_anywhere_below_the_root(tmp_path):
    (tmp_path / "root" / "a").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f").write_text("secret\n")
    (tmp_path / "root" / "a" / "f").write_text("ok\n")
    fd = open_under(tmp_path / "root", tmp_path / "root" / "a" / "f")
    assert os.read(fd, 10) == b"ok\n"
    os.close(fd)
    os.symlink(tmp_path / "elsewhere", tmp_path / "root" / "b")
    with pytest.raises(OSError):
        open_under(tmp_path / "root", tmp_path / "root" / "b" / "f")
    with pytest.raises(OSError):
        open_under(tmp_path / "root", tmp_path / "elsewhere" / "f")
