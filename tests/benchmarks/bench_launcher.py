"""Wall time added by `traceml run` (issue 2 budgets).

* a trivial script under `traceml run` vs `python script.py` (target: about 1 s in total);
* the seed's 2-rank DDP example (20 steps) under `traceml run` vs plain
  `torchrun` of the same script (budget: ≤ 1.5 s added).

    python tests/benchmarks/bench_launcher.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DDP = REPO / "examples" / "distributed" / "ddp_minimal.py"


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="traceml-bench-launch-"))
    shutil.copy(REPO / "examples" / "traceml.yaml", work / "traceml.yaml")
    (work / "trivial.py").write_text("print('hello')\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    traceml = [sys.executable, "-m", "traceml_tui", "run"]
    rows = []
    counter = iter(range(10_000))

    def run_name() -> str:
        return f"bench-{next(counter)}"

    cases = [
        ("trivial script", [sys.executable, "trivial.py"], lambda: [*traceml, "trivial.py", "--run-name", run_name()]),
        (
            "2-rank DDP, 20 steps",
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(DDP), "--steps", "20"],
            lambda: [*traceml, str(DDP), "--run-name", run_name(), "--nproc-per-node", "2", "--args", "--steps", "20"],
        ),
    ]
    for label, bare_cmd, traced_cmd in cases:
        bare, traced = [], []
        for _ in range(args.repeats):  # interleaved so machine noise hits both sides alike
            bare.append(timed(bare_cmd, work, env))
            traced.append(timed(traced_cmd(), work, env))
        b, t = statistics.median(bare), statistics.median(traced)
        rows.append((label, b, t))
    print(f"{'case':<24}{'baseline s':>12}{'traceml run s':>15}{'added s':>10}{'ratio':>8}")
    for label, b, t in rows:
        print(f"{label:<24}{b:>12.2f}{t:>15.2f}{t - b:>10.2f}{t / b:>8.2f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
