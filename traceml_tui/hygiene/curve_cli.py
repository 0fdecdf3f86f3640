"""`traceml curve RUN_DIR [--out PNG]`: (re)render the canonical learning_curve.png."""

from __future__ import annotations

import sys
from pathlib import Path

from traceml_tui.core.cliargs import OneLineParser
from traceml_tui.core.rundir import run_dir_problem
from traceml_tui.core.signals import exit_on_sigterm


def main(argv: list[str]) -> int:
    """Render the curve of RUN_DIR; prints the path written. Exit 2 on bad input, 1 if rendering fails."""
    parser = OneLineParser(prog="traceml curve", description="render <run_dir>/learning_curve.png atomically")
    parser.add_argument("run_dir")
    parser.add_argument("--out", default=None, help="write here (a .png) instead of <run_dir>/learning_curve.png")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    problem = run_dir_problem(run_dir)  # an empty or unrelated folder would get a curve of nothing
    if problem is not None:
        print(f"traceml curve: {problem}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else None
    if out is not None and (out.suffix.lower() != ".png" or out.is_dir()):
        # The curve replaces its target atomically: a mistyped --out must never replace a summary or a folder.
        print(f"traceml curve: --out {out} must name a .png file", file=sys.stderr)
        return 2
    from traceml_tui.hygiene.curve import render_learning_curve

    exit_on_sigterm()  # a render stopped by the launcher removes its temp file (run/curve_refresh.py)
    try:
        path = render_learning_curve(run_dir, out)
    except OSError as exc:
        print(f"traceml curve: cannot write the curve to {out or run_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
