"""Item 11: two daemons on aliases of one index (a symlink or a hard link to it) — the second is refused."""

from __future__ import annotations

import os

import pytest

from daemon.service import IndexLockedError, Ingester

from support.daemon_files import write_steps

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("alias", ["symlink", "hardlink"])
def test_second_writer_on_an_alias_of_the_index_is_refused(env, tmp_path, alias):
    write_steps(env.root / "r", 0, range(1, 4))
    env.ingest()  # the index exists
    other = tmp_path / "elsewhere" / "alias.sqlite"
    other.parent.mkdir()
    (os.symlink if alias == "symlink" else os.link)(env.index, other)
    first = Ingester(env.index, [str(env.root)], use_inotify=False)
    first.open()
    try:
        second = Ingester(other, [str(env.root)], use_inotify=False)
        with pytest.raises(IndexLockedError, match="already writes the index"):
            second.open()
    finally:
        first.close()
    again = Ingester(other, [str(env.root)], use_inotify=False)
    again.open()  # released with the first writer: the alias can be opened now
    again.close()
