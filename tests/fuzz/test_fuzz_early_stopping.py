"""``early_stopping.json`` against damage (docs/security.md, "Fuzzing"; docs/hygiene.md).

Start: the state the real :class:`EarlyStopping` writes over the committed hygiene run's receipts. Each example
damages it. Contract: the one reader (``backlog.read_early_stopping``) returns the state or None with exactly one
error line; :class:`EarlyStopping` resumes from a state that decodes and refuses a damaged one with one
``ValueError`` line, never starting afresh over it (the file is left as it was); the summary's ``validation``
section (``validation_report``) and the learning curve's data never raise.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceml_tui.core.jsonsafe import dumps_valid
from traceml_tui.core.rundir import RunDir
from traceml_tui.hygiene.backlog import read_early_stopping
from traceml_tui.hygiene.curve import load_curve_data
from traceml_tui.hygiene.early_stopping import EarlyStopping
from traceml_tui.hygiene.report import validation_report

from support.fuzz_mutations import damaged, strict_json

FIXTURE = Path(__file__).parents[1] / "fixtures" / "runs" / "hygiene"
POLICY = {"metric": "mse", "direction": "min", "patience": 5}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A copy of the hygiene run and the bytes of the state real early stopping wrote over its receipts."""
    run = tmp_path_factory.mktemp("fuzz-es") / "hygiene"
    shutil.copytree(FIXTURE, run)
    EarlyStopping(run, **POLICY).update(step=10)
    return run, RunDir(run).early_stopping.read_bytes()


def test_damaged_states_are_refused_or_resumed(stopped):
    run, good = stopped
    path = RunDir(run).early_stopping

    @given(data=damaged(good))
    def check(data):
        path.write_bytes(data)
        try:
            errors: list[str] = []
            state = read_early_stopping(path, errors)
            assert (state is None) == bool(errors) and len(errors) <= 1
            assert all("\n" not in e and e.startswith("early_stopping.json: ") for e in errors)
            try:
                EarlyStopping(run, **POLICY)
            except ValueError as exc:
                assert "\n" not in str(exc)
                assert path.read_bytes() == data  # never reset over
            strict_json(dumps_valid(validation_report(run, {"early_stopping": dict(POLICY)})))
            load_curve_data(run)
        finally:
            path.write_bytes(good)

    check()


# --------------------------------------------------------------------------- the decision reads only what is new
# ``EarlyStopping.update`` runs every update and reads only the requests it has not consumed
# (``list_requests(skip=...)``, ``RunDir.backlog_files(skip=...)``). Contract: over any history of published,
# evaluated, failed and damaged requests and stray files, its answers and state equal those of the same decision
# reading every request each time (the path before).

_EVENTS = st.lists(st.one_of(
    st.tuples(st.just("publish")),
    st.tuples(st.just("complete"), st.integers(0, 30), st.floats(0.0, 2.0)),
    st.tuples(st.just("fail"), st.integers(0, 30)),
    st.tuples(st.just("damage"), st.integers(0, 30), st.binary(max_size=40)),
    st.tuples(st.just("stray"), st.sampled_from([".x.json", "notes.txt", "dir.json", "step-x.json.tmp"])),
    st.tuples(st.just("decide")),
), max_size=40)


def _apply(run: Path, event: tuple, published: list[str]) -> None:
    from traceml_tui.hygiene import backlog
    from traceml_tui.hygiene.checkpoints import publish_checkpoint

    kind, *args = event
    rd = RunDir(run)
    if kind == "publish":
        weights = run / "w.bin"
        weights.write_bytes(b"w")
        published.append(publish_checkpoint(run, weights, step=10 * (len(published) + 1), config_digest="d"))
    elif kind in ("complete", "fail", "damage") and published:
        ckpt = published[args[0] % len(published)]
        request = backlog.read_json(rd.request(ckpt))
        if kind == "complete" and request is not None and not rd.receipt(ckpt).exists():
            backlog.write_receipt(run, request, {"mse": args[1]})
        elif kind == "fail":
            backlog.write_failure(run, ckpt, "boom")
        elif kind == "damage":
            rd.request(ckpt).write_bytes(args[1])
    elif kind == "stray":
        path = rd.backlog_dir("requests") / args[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        if args[0] == "dir.json":
            path.mkdir(exist_ok=True)
        else:
            path.write_bytes(b"{}")


def test_reading_only_new_requests_decides_as_reading_all(tmp_path_factory, monkeypatch):
    from traceml_tui.hygiene import backlog

    real = backlog.list_requests

    @given(events=_EVENTS)
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    def check(events):
        base = tmp_path_factory.mktemp("es-new")
        fast_run, slow_run = base / "fast", base / "slow"
        fast_run.mkdir()
        slow_run.mkdir()
        fast = EarlyStopping(fast_run, **POLICY, max_attempts=2)
        slow = EarlyStopping(slow_run, **POLICY, max_attempts=2)
        fast_published: list[str] = []
        slow_published: list[str] = []
        for step, event in enumerate([*events, ("decide",)], start=1):
            _apply(fast_run, event, fast_published)
            _apply(slow_run, event, slow_published)
            got = fast.update(step)
            with monkeypatch.context() as m:
                m.setattr(backlog, "list_requests", lambda run, errors=None, kind="validation", skip=():
                          real(run, errors, kind))
                want = slow.update(step)
            assert got == want
            assert {k: v for k, v in fast.summary().items() if k != "updated"} == \
                {k: v for k, v in slow.summary().items() if k != "updated"}

    check()
