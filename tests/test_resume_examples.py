"""Examples seen are cumulative across attempts (seed 004): records, curve label, summary and export.

A real run (tests/scripts/ddp_train.py, one process, batch 16) is launched for
3 updates and resumed for 2 more with `traceml run --resume`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.core import records
from traceml_tui.export import cursor as cursor_mod
from traceml_tui.export.trackio_export import plan_export
from traceml_tui.hygiene.curve import _x_label, load_curve_data
from traceml_tui.sdk.session import examples_before

from support import realruns

BATCH = 16


def _launch(work: Path, steps: int, *extra: str) -> None:
    args = [sys.executable, "-m", "traceml_tui", "run", str(realruns.DDP_SCRIPT), "--run-name", "resumed",
            "--logs-dir", str(work / "logs"), *extra, "--args", "--steps", str(steps), "--batch-size", str(BATCH)]
    done = subprocess.run(args, cwd=work, env=realruns.subprocess_env(work / "state"), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def _examples(run_dir: Path, attempt: int) -> list[tuple[int, int]]:
    lines = (run_dir / "ranks/rank_0" / f"steps-{attempt}.jsonl").read_bytes().splitlines()
    return [(r.step, r.examples) for r in map(records.decode, lines) if isinstance(r, records.Step)]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("resume")
    _launch(work, 3)
    _launch(work, 2, "--resume")
    return work / "logs" / "resumed"


@pytest.mark.slow
def test_records_count_on_from_the_previous_attempt(resumed: Path) -> None:
    assert _examples(resumed, 0) == [(1, 16), (2, 32), (3, 48)]
    assert _examples(resumed, 1) == [(4, 64), (5, 80)]
    assert examples_before(resumed, 0, 6) == 80 and examples_before(resumed, 0, 3) == 32
    assert examples_before(resumed, 0, 1) is None and examples_before(resumed, 0, 99) is None


@pytest.mark.slow
def test_curve_label_summary_and_export_say_80(resumed: Path) -> None:
    assert _x_label(load_curve_data(resumed)).endswith("(examples seen: 80 at update 5)")
    summary = json.loads((resumed / "final_summary.json").read_text())
    assert summary["training"]["examples"] == 80 and summary["training"]["steps_completed"] == 5
    delivery, _ = plan_export(resumed, cursor_mod.Cursor())
    info = {row[0]: row[1] for key, _, rows, _ in delivery.tables if key == "info/run" for row in rows}
    assert info["examples seen"] == "80" and info["optimizer updates"] == "5" and info["batch size"] == str(BATCH)
