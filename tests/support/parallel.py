"""The test suite on several pytest-xdist workers (README, "test lanes"): what the workers share and which
tests stay together.

``pytest -n 4 --dist loadgroup`` runs the tests in four worker processes. Session- and module-scoped fixtures
are set up once *per worker*; what is too costly to make twice is made once in a folder every worker of the
session shares (:func:`session_dir`, under a lock: :mod:`support.shared_runs`), and a module whose tests
share a module-scoped fixture is kept on one worker (:func:`group_module_fixtures`).

A fixture the tests only read (the committed runs' index, ``committed_index`` in tests/conftest.py) is better
session-scoped and built once for every worker (:func:`built_once`): module scope would keep its module's tests
on one worker, and the longest such module would set the lane's wall time.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

#: Files a read-only user of a built folder may still create or touch: SQLite's write-ahead log and shared
#: memory, which a read-only connection to a WAL index maps (docs/daemon.md).
SCRATCH_SUFFIXES = ("-wal", "-shm", "-journal")


def worker_count() -> int:
    """How many worker processes run this session's tests (1 without pytest-xdist or with ``-n 0``)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def session_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder of this test session that every worker of it sees (a fresh one per session)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # A worker's basetemp is <session>/popen-gwN: its parent belongs to this session and all its workers.
        path = tmp_path_factory.getbasetemp().parent / name
        path.mkdir(exist_ok=True)
        return path
    path = tmp_path_factory.getbasetemp() / name  # the session's own basetemp; asked again, the same folder
    path.mkdir(exist_ok=True)
    return path


def group_module_fixtures(items: list[pytest.Item]) -> None:
    """Put each test that uses a module-, package- or class-scoped fixture in the ``xdist_group`` of its file,
    so ``--dist loadgroup`` runs the file's users of that fixture on one worker and the fixture (a real run it
    launches, a daemon it starts) is made once, not once a worker. A test already in a group keeps it."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        chains = info.name2fixturedefs.values() if info is not None else ()
        if any(fixture.scope in ("module", "package", "class") for chain in chains for fixture in chain):
            item.add_marker(pytest.mark.xdist_group(f"module:{item.nodeid.split('::', 1)[0]}"))


def tree_fingerprint(root: Path) -> dict[str, list[int]]:
    """Every file under ``root`` but SQLite's scratch files, by path relative to ``root``: ``[size, mtime_ns]``."""
    files: dict[str, list[int]] = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if name.endswith(SCRATCH_SUFFIXES):
                continue
            path = Path(folder, name)
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            files[str(path.relative_to(root))] = [st.st_size, st.st_mtime_ns]
    return files


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """The folder ``name`` of this session, filled by ``build(folder)`` once for every worker: the first
    worker to get here builds it under a lock file, the others wait for it and use the same folder. What
    the build left is recorded (:func:`tree_fingerprint`) for :func:`changed_since_built`. A build that
    raises leaves no record, so the next worker to ask builds again (and fails the same way)."""
    shared = session_dir(tmp_path_factory, "built-once")
    folder = shared / name
    record = shared / f"{name}.json"
    with FileLock(shared / f"{name}.lock"):
        if not record.exists():
            if folder.exists():  # a build that raised left it half made
                shutil.rmtree(folder)
            folder.mkdir()
            build(folder)
            tmp = record.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(tree_fingerprint(folder)))
            os.replace(tmp, record)
    return folder


def changed_since_built(folder: Path) -> list[str]:
    """``"<path>: changed|added|removed"`` for each file of a :func:`built_once` folder that differs from
    what its build left (a test wrote into a folder the workers share instead of into a copy of it)."""
    return fingerprint_changes(json.loads(folder.with_name(f"{folder.name}.json").read_text()), tree_fingerprint(folder))


def fingerprint_changes(before: dict[str, list[int]], now: dict[str, list[int]]) -> list[str]:
    """``"<path>: changed|added|removed"`` for each path whose fingerprint differs between ``before`` and ``now``."""
    out = []
    for path in sorted(set(before) | set(now)):
        if path not in now:
            out.append(f"{path}: removed")
        elif path not in before:
            out.append(f"{path}: added")
        elif now[path] != before[path]:
            out.append(f"{path}: changed")
    return out
