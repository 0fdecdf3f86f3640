"""The Trackio export cursor against damage (docs/security.md, "Fuzzing"; docs/export.md).

Start: a real cursor, written by exporting the committed completed run (tests/fixtures/runs/completed) to a
destination that accepts everything (trackio itself is optional). Each example damages the cursor. Contract:
:func:`export_run` either refuses the cursor with one ``ValueError`` line naming it — leaving its bytes as
they were — or reads it and exports without raising, never moving an offset backwards past zero nor beyond
the file (a damaged offset must never stop the export of a file for good). A readable cursor that names another
run directory or Trackio run is refused as such (``IdentityCollision``, docs/export.md), also in one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given

from traceml_tui.export import cursor as cm
from traceml_tui.export import trackio_export as tx

from support.fuzz_mutations import damaged

FIXTURE = Path(__file__).parents[1] / "fixtures" / "runs" / "completed"
CORPUS = Path(__file__).parent / "corpus" / "cursor"
REGISTRATION = tx.Registration(project="fuzz-lab", group="g", description="a damaged cursor", server_url=None)


class Sink:
    """Accepts everything."""

    def open(self, **kwargs): pass
    def log(self, points, step): pass
    def table(self, *args): pass
    def image(self, *args): pass
    def close(self): pass


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A copy of the completed run and the bytes of its real cursor after one full export."""
    run = tmp_path_factory.mktemp("fuzz-cursor") / "run"
    shutil.copytree(FIXTURE, run)
    tx.export_run(run, REGISTRATION, Sink())
    return run, cm.cursor_path(run, REGISTRATION.project).read_bytes()


def _check(exported, data: bytes) -> None:
    run, good = exported
    path = cm.cursor_path(run, REGISTRATION.project)
    path.write_bytes(data)
    try:
        try:
            tx.export_run(run, REGISTRATION, Sink())
        except ValueError as exc:
            message = str(exc)
            # a damaged cursor is named; a readable one of another run or Trackio name is refused as such
            assert "\n" not in message and (path.name in message or isinstance(exc, tx.IdentityCollision)), message
            assert path.read_bytes() == data  # refused: nothing overwritten
            return
        after = cm.load(path)  # what it wrote back is a cursor it can read
        sizes = {f"ranks/{p.parent.name}/{p.name}": p.stat().st_size for p in run.glob("ranks/*/*.jsonl")}
        for rel, mark in after.files.items():
            assert 0 <= mark["offset"] <= sizes.get(rel, mark["offset"]), (rel, mark)
    finally:
        path.write_bytes(good)


def test_damaged_real_cursors_are_refused_or_read(exported):
    @given(data=damaged(exported[1]))
    def check(data):
        _check(exported, data)

    check()


@pytest.mark.parametrize("found", sorted(p.name for p in CORPUS.glob("*.json")), ids=str)
def test_cursor_corpus(exported, found):
    """Damaged cursors kept as regression inputs (the R6 repros among them)."""
    _check(exported, (CORPUS / found).read_bytes())
