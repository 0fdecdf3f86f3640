"""Shared fixtures: a clean environment for subprocesses of the real CLI."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# The suite caches bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE): otherwise every
# pytest-xdist worker re-rewrites the asserts of every test module and plugin, and every `traceml …`
# subprocess recompiles the package, on every run — about half of collection's CPU and a tenth of a second
# per CLI call (README, "test lanes"). The files land in __pycache__ folders, which git ignores. Workers and
# subprocesses inherit the environment; this process writes from here on.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def signal_dispositions_kept():
    """No test leaves its worker handling SIGINT or SIGTERM differently: an ignored signal is inherited by
    every process the worker starts afterwards (it survives exec), and a later test's child then sleeps
    through the SIGTERM it is sent (a launcher's finalize once left SIGTERM ignored). The handlers are put
    back and the test that changed them fails, naming them."""
    import signal

    watched = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.getsignal(sig) for sig in watched}
    yield
    changed = {sig: signal.getsignal(sig) for sig in watched if signal.getsignal(sig) != before[sig]}
    for sig in changed:
        signal.signal(sig, before[sig])
    assert not changed, "the test left these signals handled otherwise: " + ", ".join(
        f"{signal.Signals(sig).name} {before[sig]!r} -> {handler!r}" for sig, handler in changed.items())


@pytest.fixture(autouse=True)
def traceml_threads_stopped():
    """No test leaves a thread of traceml's running (they are all named ``traceml-…``): a launcher's lease
    thread that outlived its test went on beating into whatever folder later tests had moved to. A thread
    still ending gets a few seconds; one left after that fails the test, named."""
    import threading
    import time

    before = set(threading.enumerate())

    def left() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t not in before and t.name.startswith("traceml-") and t.is_alive()]

    yield
    deadline = time.monotonic() + 5.0
    while left() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not left(), "the test left traceml threads running: " + ", ".join(t.name for t in left())


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for `traceml …` subprocesses: one BLAS thread, a private state dir."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env.pop("TRACEML_RUN_DIR", None)
    return env


@pytest.fixture
def lasting_toasts(monkeypatch):
    """Toasts (3–8 s on screen) stay for the test: a loaded machine that takes longer from the event to the
    assertion or the snapshot must not decide whether a toast is still there. Toasts show no timeout, so a
    snapshot is the picture a user sees right after the event."""
    from textual.app import App

    notify = App.notify

    def lasting(self, message, *args, timeout=None, **kwargs):
        return notify(self, message, *args, timeout=600, **kwargs)

    monkeypatch.setattr(App, "notify", lasting)


@pytest.fixture
def traceml_cmd() -> list[str]:
    """The `traceml` command as run by users (module form: no PATH dependence)."""
    return [sys.executable, "-m", "traceml_tui"]


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (the package, Textual, hypothesis, the test modules) lives for the whole
    session: frozen, it is out of every later collection's walk."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``pytest -n N --dist loadgroup``: a module's users of a module-scoped fixture stay on one worker; a test
    that reads the real runs is marked slow (support/lanes.py), so the fast lane builds none."""
    from support.lanes import check_lanes
    from support.parallel import group_module_fixtures

    check_lanes(items)
    group_module_fixtures(items)


#: The test processes' garbage collector runs a young collection every 10,000 container allocations instead of
#: every 700. A worker's heap holds Textual apps, hypothesis and (on one worker) torch, and the screen tests
#: allocate hundreds of thousands of short-lived render objects each: at Python's default a fifth of their CPU
#: went to collections, most of it full ones over that heap (README, "test lanes"). Subprocesses keep the default.
TEST_PROCESS_GC_THRESHOLD = (10_000, 10, 10)


def pytest_configure(config: pytest.Config) -> None:
    from support import lanes

    gc.set_threshold(*TEST_PROCESS_GC_THRESHOLD)

    # before any test module is imported: their @settings(max_examples=lanes.examples(n)) read it
    lanes.session_profile = lanes.hypothesis_profile(config.getoption("markexpr") or "")
    config.addinivalue_line(
        "markers",
        "realruns(*cases): the test uses these real_runs cases; they are built in the background, "
        "two at a time, as soon as the real_runs fixture is first set up",
    )


@pytest.fixture(scope="session")
def real_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Real run directories by case name (tests/support/realruns.py), each built once per session.

    ``real_runs["rank_raises"]`` is a :class:`support.realruns.RealRun`, built on
    first access; a case that fails to build raises its error for the tests
    using it and leaves the other cases alone. The cases named by the
    ``@pytest.mark.realruns(...)`` markers of the selected tests start
    building in the background when the fixture is set up: two at a time in
    all, whether one process runs the tests or ``pytest -n N`` workers do.

    The runs are shared by every worker of the session (support/shared_runs.py):
    a test that changes a run copies it first; the session fails the last test
    using the runs when one of them changed.
    """
    from support.parallel import session_dir, worker_count
    from support.shared_runs import SharedRealRuns

    runs = SharedRealRuns(session_dir(tmp_path_factory, "realruns"), builders=max(1, 2 // worker_count()))
    wanted: list[str] = []
    for item in request.session.items:
        for mark in item.iter_markers("realruns"):
            wanted += [case for case in mark.args if case not in wanted]
    runs.prefetch(wanted)
    yield runs
    runs.close()
    changed = runs.changed()
    assert not changed, "tests changed shared real runs (copy a run before changing it):\n" + "\n".join(changed[:20])


@pytest.fixture(scope="session")
def committed_index(tmp_path_factory: pytest.TempPathFactory):
    """(root, index): the committed real runs (tests/fixtures/runs) copied and indexed by the real ingester
    (``support.fixture_runs.build_real_index``) once per session for every worker (``support.parallel.built_once``),
    for the screen tests that only read them; session scope lets those tests spread over the workers (README,
    "test lanes"). A test that changes the runs or the index builds its own copy; the session fails the last
    test of a worker that used the index when a file under it changed."""
    from support import fixture_runs
    from support.parallel import built_once, changed_since_built

    folder = built_once(tmp_path_factory, "committed-index", fixture_runs.build_real_index)
    yield folder / "logs", folder / "state" / "index.sqlite"
    changed = changed_since_built(folder)
    assert not changed, "tests changed the shared committed index (copy it before changing it):\n" + "\n".join(
        changed[:20])


@pytest.fixture
def env(tmp_path: Path):
    """(root, index, ingest): an empty log root, an index path, and one pass of the real ingester over them."""
    from daemon.service import Ingester

    root = tmp_path / "logs"
    root.mkdir()
    index = tmp_path / "state" / "index.sqlite"

    def ingest() -> int:
        ing = Ingester(index, [str(root)], poll_interval=0.05, use_inotify=False)
        try:
            return ing.run_once()
        finally:
            ing.close()

    yield root, index, ingest

_RESULTS: list[tuple[str, str, str]] = []


def pytest_runtest_logreport(report) -> None:
    """Collect (case, expected, observed) of every ``faults``-marked test for the table printed at the end."""
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    if "faults" not in report.keywords:
        return
    expected = getattr(report, "fault_expected", "")
    _RESULTS.append((report.nodeid.split("::", 1)[-1], expected, report.outcome))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    doc = (item.function.__doc__ or item.module.__doc__ or "").strip().splitlines()
    report.fault_expected = doc[0] if doc else ""


def pytest_terminal_summary(terminalreporter) -> None:
    """The fault suite's table: case, observed, expected.

    Point the suite at a new filesystem with ``pytest -m faults --basetemp /that/filesystem/tmp``.
    """
    if not _RESULTS:
        return
    tr = terminalreporter
    tr.section("fault suite")
    width = min(70, max(len(case) for case, _, _ in _RESULTS))
    tr.write_line(f"{'case':<{width}}  {'observed':<8}  expected")
    for case, expected, observed in _RESULTS:
        tr.write_line(f"{case[:width]:<{width}}  {observed:<8}  {expected[:100]}")
