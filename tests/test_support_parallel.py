"""The suite on pytest-xdist workers (tests/support/parallel.py; README, "test lanes"): a module-scoped fixture
is made once although its module's tests could run on two workers, and the workers of a session share one
folder for what is built once (the real runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import python_env

CONFTEST = '''
import pytest

from support.parallel import group_module_fixtures


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    group_module_fixtures(items)
'''

TESTS = '''
import os

import pytest

from support.parallel import session_dir


def _note(name, text):
    with open(os.path.join(os.environ["NOTES"], name), "a") as f:
        f.write(text + "\\n")


@pytest.fixture(scope="module")
def made():
    _note("made", os.environ.get("PYTEST_XDIST_WORKER", "-"))


def _where(tmp_path_factory):
    _note("shared", os.environ.get("PYTEST_XDIST_WORKER", "-") + " " + str(session_dir(tmp_path_factory, "shared")))


@pytest.mark.parametrize("i", range(12))
def test_uses_the_module_fixture(made, tmp_path_factory, i):
    _where(tmp_path_factory)


@pytest.mark.parametrize("i", range(12))
def test_plain(tmp_path_factory, i):
    _where(tmp_path_factory)
'''


def _session(project: Path, notes: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in python_env().items() if not k.startswith(("PYTEST_", "TRACEML_"))}
    env["NOTES"] = str(notes)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only xdist: the other plugins cost seconds a worker to load
    return subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "xdist", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "--basetemp", str(project / "tmp")], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_module_fixture_is_made_once_and_the_workers_share_one_session_folder(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(CONFTEST)
    (project / "test_lanes.py").write_text(TESTS)
    notes = tmp_path / "notes"
    notes.mkdir()
    proc = _session(project, notes)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "24 passed" in proc.stdout
    assert "[gw0]" in proc.stdout and "[gw1]" in proc.stdout  # both workers ran tests
    made = (notes / "made").read_text().split()
    assert len(made) == 1 and made[0] in ("gw0", "gw1")  # made once, on one worker
    shared = [line.split(" ", 1) for line in (notes / "shared").read_text().splitlines()]
    assert {worker for worker, _ in shared} == {"gw0", "gw1"}
    (folder,) = {path for _, path in shared}  # one folder for both workers …
    assert Path(folder) == project / "tmp" / "shared"  # … in the session's basetemp (pytest empties it each session)
