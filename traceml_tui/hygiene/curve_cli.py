"""`traceml curve RUN_DIR [--out PNG]`: (re)render the canonical learning_curve.png."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise _UsageError(message)


def main(argv: list[str]) -> int:
    """Render the curve of RUN_DIR; prints the path written. Exit 2 on bad input, 1 if rendering fails."""
    parser = _Parser(prog="traceml curve", description="render <run_dir>/learning_curve.png atomically")
    parser.add_argument("run_dir")
    parser.add_argument("--out", default=None, help="write here instead of <run_dir>/learning_curve.png")
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(f"traceml curve: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(f"traceml curve: run directory not found: {run_dir}", file=sys.stderr)
        return 2
    from traceml_tui.hygiene.curve import render_learning_curve

    try:
        path = render_learning_curve(run_dir, Path(args.out) if args.out else None)
    except OSError as exc:
        print(f"traceml curve: cannot write the curve: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
