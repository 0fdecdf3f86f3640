"""The test suite on several pytest-xdist workers (README, "test lanes"): what the workers share and which
tests stay together.

``pytest -n 2 --dist loadgroup`` runs the tests in two worker processes. Session- and module-scoped fixtures
are set up once *per worker*; what is too costly to make twice is made once in a folder every worker of the
session shares (:func:`session_dir`, under a lock: :mod:`support.shared_runs`), and a module whose tests
share a module-scoped fixture is kept on one worker (:func:`group_module_fixtures`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


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
    return tmp_path_factory.mktemp(name, numbered=False)


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
