"""What launcher leases cost the daemon: a rescan of the roots, and ``Reader.list_runs``, with and without them.

Runs × nodes node folders, each with a ``system.jsonl`` and (except in the baseline) a ``launcher.lease``
written by the real LeaseKeeper. Three cases measured in the same run, on the same machine:

* baseline — no lease files (a run written before leases);
* live — every lease beats before every rescan (each scan reads and records every one of them);
* settled — every lease done (read once, then only listed).

Prints CPU ms per rescan (scan + commit) and per ``list_runs``, and each case's ratio to the baseline.

    python tests/benchmarks/bench_lease.py [--runs 20] [--nodes 8] [--scans 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from daemon.reader import Reader  # noqa: E402
from daemon.service import Ingester  # noqa: E402
from traceml_tui.core.rundir import RunDir  # noqa: E402
from traceml_tui.run.lease import LeaseKeeper  # noqa: E402


def _build(root: Path, runs: int, nodes: int, leases: bool) -> list[LeaseKeeper]:
    keepers = []
    for r in range(runs):
        run = RunDir(root / f"run-{r:03d}")
        for n in range(nodes):
            run.node_dir(n).mkdir(parents=True)
            run.system(n).write_bytes(b"")
            if leases:
                keeper = LeaseKeeper(run.lease(n), n, 30.0)
                keeper._write()
                keepers.append(keeper)
    return keepers


def _measure(tmp: Path, case: str, runs: int, nodes: int, scans: int) -> tuple[float, float]:
    root = tmp / case
    keepers = _build(root, runs, nodes, leases=case != "baseline")
    if case == "settled":
        for k in keepers:
            k.finish()
    index = tmp / f"{case}.sqlite"
    ingester = Ingester(index, [str(root)], use_inotify=False)
    ingester.run_once()
    scan_ms = []
    for _ in range(scans):
        if case == "live":
            for k in keepers:  # every launcher beat since the last scan (the writer's cost is not counted)
                k._write()
        t = time.process_time()
        ingester.scan()
        ingester.commit()
        scan_ms.append((time.process_time() - t) * 1000)
    ingester.close()
    with Reader(index) as reader:
        list_ms = []
        for _ in range(scans):
            t = time.process_time()
            reader.list_runs()
            list_ms.append((time.process_time() - t) * 1000)
    return statistics.median(scan_ms), statistics.median(list_ms)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--scans", type=int, default=30)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {case: _measure(Path(tmp), case, a.runs, a.nodes, a.scans) for case in ("baseline", "live", "settled")}
    base_scan, base_list = results["baseline"]
    print(f"{a.runs} runs x {a.nodes} nodes, median of {a.scans} (CPU ms)")
    print(f"{'case':<10} {'rescan':>9} {'ratio':>7} {'list_runs':>10} {'ratio':>7}")
    for case, (scan, listing) in results.items():
        print(f"{case:<10} {scan:>9.2f} {scan / base_scan:>6.2f}x {listing:>10.2f} {listing / base_list:>6.2f}x")


if __name__ == "__main__":
    main()
