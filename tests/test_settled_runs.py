"""A run with a final word is decided once per data version: a reader that keeps it answers as a fresh one.

The runs list re-decides every run on every refresh; a run whose launcher wrote its final word no longer depends on
the clock (core.state.final_word), so the reader keeps its summary until the run's data, its validation marks or its
leases change, and recomputes only its age (docs/daemon.md, "Reader API"). These tests read one index with one reader
at a series of instants and compare every answer with a fresh reader's at the same instant — live runs that stall
as time passes included, so keeping a run that is not settled would fail.
"""

from __future__ import annotations

import shutil

import pytest

from daemon.reader import Reader

from support import realruns
from support import tui_data as d


def _same_answers(index, instants) -> None:
    kept = Reader(index)
    try:
        for now in instants:
            fresh = Reader(index)
            try:
                assert kept.list_runs(now=now) == fresh.list_runs(now=now), now
            finally:
                fresh.close()
    finally:
        kept.close()


def test_a_kept_reader_answers_as_a_fresh_one(tmp_path):
    root = tmp_path / "logs"
    root.mkdir()
    d.write_run(root, "done", ranks=2, steps=30)
    d.write_run(root, "failed", ranks=2, steps=30, failed_rank=1)
    d.write_run(root, "live", ranks=2, steps=30, finished=False)
    d.write_run(root, "goes-silent", ranks=2, steps=30, silent_rank=1, silent_after=10, finished=False)
    index = tmp_path / "index.sqlite"
    d.ingest(index, [root])
    end = d.T0 + 3.0  # just after the last step (steps are 0.1 s apart)
    first = Reader(index)
    states = {r.name: r.status for r in first.list_runs(now=end)}
    later = {r.name: r.status for r in first.list_runs(now=end + 10_000)}
    first.close()
    assert states != later  # the clock moves some runs (a live run stalls): keeping them would show
    _same_answers(index, [end, end + 1, end + 30, end + 10_000, end + 5])


@pytest.mark.slow
@pytest.mark.realruns(*realruns.CASES)
def test_every_real_end_is_kept_as_a_fresh_reader_decides_it(real_runs, tmp_path):
    root = tmp_path / "logs"
    root.mkdir()
    for case in realruns.CASES:
        shutil.copytree(real_runs[case].run_dir, root / real_runs[case].run_dir.name, symlinks=True)
    index = tmp_path / "index.sqlite"
    d.ingest(index, [root])
    hint = max(real_runs[c].now_hint for c in realruns.CASES)
    _same_answers(index, [hint, hint + 5, hint + 600, hint + 86_400, hint + 1])
