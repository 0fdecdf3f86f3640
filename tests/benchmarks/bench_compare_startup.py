"""Wall time of `traceml compare` on a real summary pair vs bare interpreter start.

Target (issue 3): within 150 ms of `python -c pass`. Runs the CLI in fresh
interpreters exactly as CI does (module form, so PATH does not matter) and
prints medians, the difference and the ratio. Not collected by pytest:

    python tests/benchmarks/bench_compare_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TAI = REPO / "tests" / "fixtures" / "summaries" / "traceml_ai"


def wall(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 3, 4):
        raise SystemExit(f"command failed ({proc.returncode}): {proc.stderr.decode()[-300:]}")
    return elapsed


def medians(commands: dict[str, list[str]], runs: int, cwd: Path) -> dict[str, float]:
    """Median wall time per command, interleaved so machine load drifts hit all alike."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, cmd in commands.items():
            times[name].append(wall(cmd, cwd))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    ref, cand = TAI / "tai-reference" / "final_summary.json", TAI / "tai-candidate" / "final_summary.json"
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        compare_cmd = [sys.executable, "-m", "traceml_tui", "compare", str(ref), str(cand),
                       "--max-step-time-regression-pct", "5", "--output", "out/pair"]
        figures = medians(
            {
                "bare": [sys.executable, "-c", "pass"],
                "compare": compare_cmd,
                "markdown": compare_cmd + ["--format", "markdown", "--junit", "j.xml"],
                "view": [sys.executable, "-m", "traceml_tui", "view", str(ref)],
            },
            args.runs,
            cwd,
        )
    bare, compare, markdown, view = (figures[k] for k in ("bare", "compare", "markdown", "view"))
    print(f"runs per figure: {args.runs} (median wall time)")
    print(f"python -c pass                  {bare * 1000:7.1f} ms")
    for name, value in (("traceml compare (text)", compare), ("compare --format markdown --junit", markdown),
                        ("traceml view", view)):
        print(f"{name:<32}{value * 1000:7.1f} ms   +{(value - bare) * 1000:6.1f} ms over bare   x{value / bare:.2f}")
    verdict = "within" if compare - bare <= 0.150 else "OVER"
    print(f"target: compare within 150 ms of bare start -> {verdict} (+{(compare - bare) * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
