"""Regenerate the real-run fixtures (tests/support/realruns.py) into a folder, e.g. to take screenshots of real runs.

    python scripts/make_fixture_runs.py OUT_DIR [--case NAME ...]

Every run goes to OUT_DIR/logs/<run-name> (one logs dir: `traceml watch
OUT_DIR/logs` lists them all); each case's scratch (launch folder, launcher
output, pid files) to OUT_DIR/work/<case>. OUT_DIR/realruns.json records each
case's facts (run dir, now_hint, captured_at, expected_backlog, ...). A case
that fails is reported and the others are still built; the exit code is 1 if
any failed. OUT_DIR must not hold runs of these names already (run names are
never reused).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support import realruns  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--case", action="append", choices=realruns.CASES,
                        help="build only this case (repeatable; default: all)")
    args = parser.parse_args(argv)
    out = args.out_dir.resolve()
    logs = out / "logs"
    cases = args.case or list(realruns.CASES)
    taken = [case for case in cases if (logs / case.replace("_", "-")).exists()]
    if taken:
        print(f"make_fixture_runs: {logs} already holds {', '.join(taken)}; use a fresh OUT_DIR", file=sys.stderr)
        return 2
    index_path = out / "realruns.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    failed = []
    for case in cases:
        started = time.monotonic()
        try:
            run = realruns.build_case(case, out / "work" / case, logs_dir=logs)
        except Exception as exc:  # noqa: BLE001 - report it, build the others
            failed.append(case)
            print(f"{case:<18} FAILED after {time.monotonic() - started:.1f} s: {exc}", file=sys.stderr)
            continue
        index[case] = run.to_json()
        index_path.parent.mkdir(parents=True, exist_ok=True)
        index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        print(f"{case:<18} {run.build_s:5.1f} s  {run.run_dir}")
    print(f"facts: {index_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
