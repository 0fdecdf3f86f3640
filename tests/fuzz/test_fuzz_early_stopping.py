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
from hypothesis import given

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
