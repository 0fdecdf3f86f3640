"""The committed real run directories (``tests/fixtures/runs/``) as an index, deterministically.

The runs were written by the real SDK and ``traceml run`` (see that folder's
README); here they are copied and ingested by the real ingester with its clock
fixed at the moment the last run ended, and screens are shown at a fixed time
after that, so snapshots and screenshots do not move between machines.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Optional

FIXTURE_RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
FACTS: dict = json.loads((FIXTURE_RUNS / "facts.json").read_text())
#: When the ingester stored the runs ("last seen"): right after the last one ended.
INGESTED_AT = max(f["now_hint"] for f in FACTS.values())
#: When the screens look: late enough that the hung run's silence is a stall (default limit 30 s).
SHOWN_AT = INGESTED_AT + 90.0


def name_of(case: str) -> str:
    """The run name of a case (``rank_raises`` → ``rank-raises``)."""
    return FACTS[case]["name"]


def build_real_index(tmp: Path, prepare: Optional[Callable[[Path], object]] = None) -> tuple[Path, Path]:
    """Copy the committed runs under ``tmp/logs`` and index them; returns (root, index).

    ``prepare(root)`` runs on the copies before they are indexed (e.g. :func:`stop_hygiene_early`).
    """
    from daemon.service import Ingester

    root = tmp / "logs"
    shutil.copytree(FIXTURE_RUNS, root, ignore=shutil.ignore_patterns("*.md", "facts.json"))
    if prepare is not None:
        prepare(root)
    index = tmp / "state" / "index.sqlite"
    ingester = Ingester(index, [str(root)], poll_interval=0.1, use_inotify=False, mode="test",
                        clock=lambda: INGESTED_AT)
    try:
        ingester.run_once()
    finally:
        ingester.close()
    return root, index


def stop_hygiene_early(root: Path) -> dict:
    """Run the real early-stopping rule (r2, lower is better, patience 1) over the copied hygiene run's own
    receipts and write its ``validation`` section into the run's summary, as the launcher does at the end.

    The committed run declared early stopping off (a fixed 10 updates); this gives the watch an enabled,
    stopped state made by the real code: r2 0.5 at step 0, then 0.75 at step 2 (no improvement), so
    patience 1 is exhausted at step-00000002 and step-00000000 stays the best. Returns the section.
    """
    from traceml_tui.hygiene.early_stopping import EarlyStopping
    from traceml_tui.summary.store import refresh_validation

    run_dir = root / name_of("hygiene")
    if not EarlyStopping(run_dir, metric="r2", direction="min", patience=1).update(step=10):
        raise AssertionError("the hygiene run's receipts no longer exhaust patience 1 on r2")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return refresh_validation(run_dir, manifest)["validation"]  # the one rebuild of the section


def live_copy(root: Path, case: str = "hung") -> Path:
    """A copy of a committed real run (the hung DDP run: two ranks, no end record) under ``root``."""
    run = root / name_of(case)
    shutil.copytree(FIXTURE_RUNS / name_of(case), run)
    return run


def extend(run: Path, steps: int = 1, ts: Optional[float] = None) -> int:
    """Append ``steps`` step records to every rank of a copied real run, as its ranks would go on writing: each
    a copy of the rank's own newest step record with the next step number, stamped ``ts`` (default now).
    Returns the newest step written."""
    from traceml_tui.core import atomic
    from traceml_tui.core.rundir import RunDir

    newest = 0
    for rank_dir in sorted((run / "ranks").iterdir()):
        rank = int(rank_dir.name.split("_")[1])
        path = RunDir(run).steps_file(rank, 0)
        last = json.loads(path.read_bytes().splitlines()[-1])
        fd = atomic.open_append(path)
        try:
            for _ in range(steps):
                last = dict(last, step=last["step"] + 1, ts=time.time() if ts is None else ts)
                atomic.append_line(fd, json.dumps(last).encode() + b"\n")
        finally:
            os.close(fd)
        newest = last["step"]
    return newest


#: The heavy QC block :func:`declare_worker_qc` adds to the copied hygiene run (docs/qc.md, "The QC block").
WORKER_QC_BLOCK = {
    "cadence": 4, "owner": "fixture-qc", "output": "qc",
    "roster": {"name": "fixed-3", "members": ["a", "b", "c"], "selection": "three named cases"},
    "items": {"batch_grid": {"inapplicable": "fixture"}, "field_stats": {"inapplicable": "fixture"},
              "galleries": {"inapplicable": "fixture"}, "worker_qc": "required"},
    "recipe": "fixture-heavy-qc-v1",
}


def declare_worker_qc(root: Path, plan_dir: Path) -> Path:
    """Give the copied hygiene run a heavy QC backlog made by the real code (docs/qc.md): its manifest declares
    ``worker_qc: required`` (parsed by the real ``traceml.yaml`` parser), each checkpoint at a QC point (updates 0,
    4, 8) gets its QC request from :func:`traceml_tui.hygiene.qc_backlog.publish_qc_request` (created when its
    validation request was), and sessions of the real drainer run the real test worker
    (tests/scripts/validator.py ``--qc``) as its ``max_attempts`` allows: update 4 fails once and then
    completes, update 8 fails every time and is blocked. The committed run keeps no checkpoint files, so an empty
    stand-in is put at each published path (the worker only checks that it exists). Returns the run's folder."""
    from traceml_tui.core import atomic
    from traceml_tui.hygiene import drain, qc_backlog
    from traceml_tui.hygiene.config import parse_hygiene

    from support.realruns import VALIDATOR_SCRIPT

    run = root / name_of("hygiene")
    manifest = json.loads((run / "manifest.json").read_text())
    worker = [sys.executable, str(VALIDATOR_SCRIPT), "--checkpoint", "{checkpoint}", "--step", "{step}", "--qc"]
    raw = {key: value for key, value in manifest["hygiene"].items() if key != "qc"}
    raw["curve"] = {k: v for k, v in raw["curve"].items() if k != "path"}
    hygiene = parse_hygiene({**raw, "qc": {**WORKER_QC_BLOCK, "worker": worker}})
    manifest["hygiene"] = {**manifest["hygiene"], "qc": hygiene["qc"]}
    atomic.atomic_write_json(run / "manifest.json", manifest)
    for path in sorted((run / "validation" / "requests").glob("*.json")):
        request = json.loads(path.read_text())
        if qc_backlog.publish_qc_request(run, request, qc=hygiene["qc"]) is not None:
            checkpoint = run / request["path"]
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            checkpoint.touch()
    plan = plan_dir / "qc_plan.json"
    plan.write_text(json.dumps({"step-00000004": "fail_once", "step-00000008": "fail"}))
    before = os.environ.get("REALRUNS_QC_PLAN")
    os.environ["REALRUNS_QC_PLAN"] = str(plan)  # the worker's plan, through the environment it inherits
    try:
        attempts = manifest["hygiene"]["validation"]["max_attempts"]  # one set of retry rules for both kinds
        for _ in range(attempts):  # a failed attempt is retried by the next session (no backoff here)
            drain.drain(run, worker, kind="qc", max_attempts=attempts, retry_backoff_s=0, log=lambda _msg: None)
    finally:
        if before is None:
            os.environ.pop("REALRUNS_QC_PLAN", None)
        else:
            os.environ["REALRUNS_QC_PLAN"] = before
    return run
