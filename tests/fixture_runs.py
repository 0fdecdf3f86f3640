"""The committed real run directories (``tests/fixtures/runs/``) as an index, deterministically.

The runs were written by the real SDK and ``traceml run`` (see that folder's
README); here they are copied and ingested by the real ingester with its clock
fixed at the moment the last run ended, and screens are shown at a fixed time
after that, so snapshots and screenshots do not move between machines.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURE_RUNS = Path(__file__).resolve().parent / "fixtures" / "runs"
FACTS: dict = json.loads((FIXTURE_RUNS / "facts.json").read_text())
#: When the ingester stored the runs ("last seen"): right after the last one ended.
INGESTED_AT = max(f["now_hint"] for f in FACTS.values())
#: When the screens look: late enough that the hung run's silence is a stall (default limit 30 s).
SHOWN_AT = INGESTED_AT + 90.0


def name_of(case: str) -> str:
    """The run name of a case (``rank_raises`` → ``rank-raises``)."""
    return FACTS[case]["name"]


def build_real_index(tmp: Path) -> tuple[Path, Path]:
    """Copy the committed runs under ``tmp/logs`` and index them; returns (root, index)."""
    from daemon.service import Ingester

    root = tmp / "logs"
    shutil.copytree(FIXTURE_RUNS, root, ignore=shutil.ignore_patterns("*.md", "facts.json"))
    index = tmp / "state" / "index.sqlite"
    ingester = Ingester(index, [str(root)], poll_interval=0.1, use_inotify=False, mode="test",
                        clock=lambda: INGESTED_AT)
    try:
        ingester.run_once()
    finally:
        ingester.close()
    return root, index
