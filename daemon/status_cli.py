"""``traceml status [ROOT…] [--index PATH] [--json | --oneline]``: what the index holds."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from dataclasses import asdict

from . import locations
from .reader import Reader


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="traceml status", description="Print what the traceml index holds.")
    p.add_argument("roots", nargs="*", metavar="ROOT", help="only runs under these folders")
    p.add_argument("--index", metavar="PATH", help="index file (default $XDG_STATE_HOME/traceml/index.sqlite)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument("--oneline", action="store_true", help="one short line (tmux status bars)")
    p.add_argument("--stall-after", type=float, default=10.0, metavar="S",
                   help="a running run is stalled after max(S, 5 typical step intervals) without records (default 10)")
    return p


def _fmt(v, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def main(argv: list[str]) -> int:
    """Entry point of ``traceml status``."""
    args = _parser().parse_args(argv)
    index_path = os.path.abspath(args.index) if args.index else str(locations.default_index_path())
    try:
        reader = Reader(index_path, stall_floor_s=args.stall_after)
    except FileNotFoundError:
        print(f"traceml status: no index at {index_path} (start `traceml daemon ROOT` first)", file=sys.stderr)
        return 1
    try:
        now = time.time()
        runs = reader.list_runs(args.roots or None, now=now)
        if args.oneline:
            counts = {s: sum(1 for r in runs if r.status == s) for s in ("running", "failed", "stalled")}
            parts = [f"{n} {s}" for s, n in counts.items() if n]
            if not parts:  # old finished runs would clutter a status bar; mention them only when idle
                done = sum(1 for r in runs if r.status == "completed")
                parts = [f"{done} completed"] if done else []
            print("traceml: " + (" · ".join(parts) if parts else "no runs"))
            return 0
        if args.json:
            out = {"index": index_path, "data_version": reader.data_version(), "runs": []}
            for r in runs:
                ranks = [
                    {"rank": k.rank, "attempt": k.attempt, "records": k.records, "last_step": k.last_step,
                     "last_record_ts": k.last_ts, "median_step_ms": k.median_step_ms, "steps_per_s": k.steps_per_s,
                     "stalled": k.stalled, "ended": k.ended}
                    for k in reader.rank_rows(r.run_id, now)
                ]
                d = asdict(r)
                d["rank_count"] = d.pop("ranks")
                d["ranks"] = ranks
                d["error_count"] = r.errors
                out["runs"].append(d)
            print(json.dumps(out, indent=2))
            return 0
        if not runs:
            print(f"no runs in {index_path}")
            return 0
        print(f"{'RUN':<24} {'STATUS':<10} {'RANKS':>5} {'STEP':>8} {'STEPS/S':>8} {'ERRORS':>6}  DIR")
        for r in runs:
            print(f"{r.name[:24]:<24} {r.status:<10} {r.ranks:>5} {_fmt(r.last_step):>8} "
                  f"{_fmt(r.steps_per_s, '.2f'):>8} {r.errors:>6}  {r.dir}")
        return 0
    except sqlite3.DatabaseError as exc:
        print(f"traceml status: cannot read the index {index_path}: {exc}", file=sys.stderr)
        return 1
    finally:
        reader.close()
