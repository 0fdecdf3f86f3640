"""The suite on pytest-xdist workers (tests/support/parallel.py; README, "test lanes"): a module-scoped fixture
is made once although its module's tests could run on two workers, and the workers of a session share one
folder for what is built once (the real runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import python_env
from support.parallel import built_once, changed_since_built

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

from support.parallel import built_once, session_dir


def _note(name, text):
    with open(os.path.join(os.environ["NOTES"], name), "a") as f:
        f.write(text + "\\n")


@pytest.fixture(scope="module")
def made():
    _note("made", os.environ.get("PYTEST_XDIST_WORKER", "-"))


def _where(tmp_path_factory):
    _note("shared", os.environ.get("PYTEST_XDIST_WORKER", "-") + " " + str(session_dir(tmp_path_factory, "shared")))


def _build(folder):
    _note("built", os.environ.get("PYTEST_XDIST_WORKER", "-"))
    (folder / "data.txt").write_text("made once")


@pytest.fixture(scope="session")
def thing(tmp_path_factory):
    return built_once(tmp_path_factory, "thing", _build)


def _uses(thing):
    _note("thing", os.environ.get("PYTEST_XDIST_WORKER", "-") + " " + str(thing) + " " + (thing / "data.txt").read_text())


@pytest.mark.parametrize("i", range(12))
def test_uses_the_module_fixture(made, tmp_path_factory, thing, i):
    _where(tmp_path_factory)
    _uses(thing)  # (every test uses it: on a loaded machine one worker may run all the plain tests)


@pytest.mark.parametrize("i", range(12))
def test_plain(tmp_path_factory, thing, i):
    _where(tmp_path_factory)
    _uses(thing)
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
    # a session-scoped fixture built with built_once: built by one worker, the same folder for both
    assert len((notes / "built").read_text().split()) == 1
    things = [line.split(" ", 1) for line in (notes / "thing").read_text().splitlines()]
    assert {worker for worker, _ in things} == {"gw0", "gw1"}
    assert {rest for _, rest in things} == {f"{project / 'tmp' / 'built-once' / 'thing'} made once"}


def test_a_folder_built_once_says_which_files_a_test_changed(tmp_path_factory) -> None:
    """The read-only agreement of a shared folder (support/parallel.py): asked again it is not rebuilt; a file
    changed, added or removed under it is named; SQLite's scratch files beside an index are not."""
    builds = []

    def build(folder: Path) -> None:
        builds.append(folder)
        (folder / "state").mkdir()
        (folder / "state" / "index.sqlite").write_bytes(b"index")
        (folder / "a.txt").write_text("a")
        (folder / "b.txt").write_text("b")

    folder = built_once(tmp_path_factory, "agreement", build)
    assert built_once(tmp_path_factory, "agreement", build) == folder and builds == [folder]
    (folder / "state" / "index.sqlite-wal").write_bytes(b"wal")  # a reader of a WAL index maps these
    (folder / "state" / "index.sqlite-shm").write_bytes(b"shm")
    assert changed_since_built(folder) == []
    (folder / "a.txt").write_text("changed, and longer")
    (folder / "b.txt").unlink()
    (folder / "c.txt").write_text("c")
    assert changed_since_built(folder) == ["a.txt: changed", "b.txt: removed", "c.txt: added"]


LANES_CONFTEST = '''
import pytest

from support.lanes import check_lanes


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end to end")
    config.addinivalue_line("markers", "realruns(*cases): uses these real runs")


@pytest.fixture(scope="session")
def real_runs():
    raise AssertionError("collection alone must decide; no real run is built")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    check_lanes(items)
'''

LANES_TESTS = '''
import pytest


@pytest.mark.slow
def test_reads_a_real_run_marked_slow(real_runs):
    pass


@pytest.mark.slow
@pytest.mark.realruns("completed")
def test_names_its_case_marked_slow():
    pass


def test_plain():
    pass
'''


def _collect(project: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in python_env().items() if not k.startswith(("PYTEST_", "TRACEML_"))}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                           "-m", "not slow"], cwd=project, env=env, capture_output=True, text=True, timeout=300)


def test_a_test_that_reads_the_real_runs_outside_slow_refuses_the_session_naming_it(tmp_path: Path) -> None:
    """The fast lane builds no real run (support/lanes.py): marked slow is fine; the fixture or the marker
    without slow refuses the session, naming each such test, even when ``-m`` would deselect it."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(LANES_CONFTEST)
    (project / "test_lanes.py").write_text(LANES_TESTS)
    fine = _collect(project)
    assert fine.returncode == 0, fine.stdout[-3000:] + fine.stderr[-2000:]
    assert "1/3 tests collected (2 deselected)" in fine.stdout
    (project / "test_lanes.py").write_text(LANES_TESTS.replace("@pytest.mark.slow\n", ""))
    refused = _collect(project)
    assert refused.returncode == 4, refused.stdout[-3000:] + refused.stderr[-2000:]  # pytest's usage error
    (said,) = [line for line in (refused.stdout + refused.stderr).splitlines() if line.startswith("ERROR: ")]
    assert said == ('ERROR: tests that use the real runs must be marked @pytest.mark.slow (README, "test lanes"): '
                    "test_lanes.py::test_reads_a_real_run_marked_slow, test_lanes.py::test_names_its_case_marked_slow")
