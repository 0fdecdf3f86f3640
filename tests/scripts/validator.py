"""Validation worker for tests/support/realruns.py: one checkpoint in, metrics JSON out (no torch: fast).

    python validator.py --checkpoint PATH --step N

What it does with a checkpoint is read from the JSON plan named by
$REALRUNS_VALIDATION_PLAN (``--qc``: $REALRUNS_QC_PLAN, as the heavy QC worker of docs/qc.md),
``{"<checkpoint id>": "ok" | "fail" | "fail_once" | "hang"}`` (a checkpoint not in the plan, or no plan at
all: "ok"):

* ok   — print ``{"r2": …, "mse": …}`` as the last stdout line, exit 0 (a receipt);
* fail — print an error on stderr, exit 3 (a failure record);
* fail_once — the first attempt fails as ``fail`` (it leaves ``<plan>.<id>.failed``), the next ones are ``ok``;
* hang — write ``<plan>.<id>.started`` (holding this pid), then sleep (the harness kills the drainer).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--step", type=int, default=0)
    parser.add_argument("--qc", action="store_true", help="the heavy QC worker: plan from $REALRUNS_QC_PLAN")
    args = parser.parse_args()
    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_file():
        print(f"validator: checkpoint not found: {checkpoint}", file=sys.stderr)
        return 2
    plan_path = os.environ.get("REALRUNS_QC_PLAN" if args.qc else "REALRUNS_VALIDATION_PLAN")
    plan = json.loads(Path(plan_path).read_text()) if plan_path else {}
    action = plan.get(checkpoint.stem, "ok")
    if action == "fail_once":
        marker = Path(f"{plan_path}.{checkpoint.stem}.failed")
        if marker.exists():
            action = "ok"
        else:
            marker.write_text("1")
            action = "fail"
    if action == "fail":
        print(f"validator: simulated failure on {checkpoint.stem}", file=sys.stderr)
        return 3
    if action == "hang":
        Path(f"{plan_path}.{checkpoint.stem}.started").write_text(str(os.getpid()))
        time.sleep(600)
        return 4
    step = max(args.step, 0)
    print(f"validating {checkpoint.name}")
    if args.qc:  # heavy QC's own figures (a receipt's metrics are the worker's to choose)
        print(json.dumps({"coverage": 1.0, "dead_units": 0, "step": step}))
        return 0
    print(json.dumps({"r2": round(1.0 - 1.0 / (2.0 + step), 6), "mse": round(1.0 / (2.0 + step), 6)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
