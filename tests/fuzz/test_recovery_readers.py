"""Readers of a run's recovery saves and split records against arbitrary bytes (docs/hygiene.md).

Contracts: ``recovery.load_newest`` never raises on a damaged newest save — it names it once and
restores the older complete one; ``split.record`` on a damaged split record refuses in one line
(``SplitChanged``) and never rewrites the record.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from traceml_tui.sdk import recovery, split

from support.lanes import IMPORTS_TORCH, needs

pytestmark = [needs("torch"), IMPORTS_TORCH]  # saves are torch files: the reader imports it


@given(st.binary(max_size=2048))
def test_a_damaged_newest_save_falls_back_to_the_older_one(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        recovery.write_save(run_dir, 0, 5, 0, {"format": recovery.FORMAT, "step": 5, "extras": {}})
        damaged = recovery.write_save(run_dir, 0, 10, 0, {})
        damaged.write_bytes(data)
        said: list[str] = []
        found = recovery.load_newest(run_dir, 0, warn=said.append)
        assert found is not None and found[0].step == 5 and found[1]["step"] == 5
        assert len(said) == 1 and "step-00000010.attempt-0.pt" in said[0] and "\n" not in said[0]


@given(st.binary(max_size=512))
def test_a_damaged_split_record_is_refused_in_one_line_and_kept(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        path = split.split_path(run_dir, "val")
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        try:
            split.record(run_dir, "val", range(10), policy="first ten", write=True)
        except split.SplitChanged as exc:
            assert "\n" not in str(exc) and "provenance/splits/val.json" in str(exc)
        assert path.read_bytes() == data
