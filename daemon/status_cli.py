"""``traceml status [ROOT…] [--index PATH] [--json | --oneline]``: what the index holds."""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from dataclasses import asdict

from traceml_tui.core import artifacts, coverage, jsonsafe
from traceml_tui.core.cliargs import OneLineParser, seconds
from traceml_tui.core.rundir import middle_cut
from traceml_tui.core.state import RUN_ATTENTION, STALL_FLOOR_S, RunStatus, count_states, lost_nodes_text

from . import index as idx
from . import locations, writer_health
from .reader import IndexVersionError, Reader

#: Words a status bar shows while anything is going on (finished runs would clutter it).
_ONELINE_ACTIVE = (RunStatus.FAILED, RunStatus.LOST, RunStatus.STALLED, RunStatus.RUNNING)


#: Widest run-name column of the status table (longer names are cut in the middle).
NAME_WIDTH_MAX = 40
#: Widest cell of the UNMEASURED column (the dark streams' names; --json has each rank's reason).
UNMEASURED_WIDTH_MAX = 24
#: Widest status cell (``failed r0,r3,r17,…`` is cut in the middle past it; --json has every rank).
STATUS_WIDTH_MAX = 32


def _parser() -> OneLineParser:
    p = OneLineParser(prog="traceml status", description="Print what the traceml index holds.")
    p.add_argument("roots", nargs="*", metavar="ROOT", help="only runs under these folders")
    p.add_argument("--index", metavar="PATH", help="index file (default $XDG_STATE_HOME/traceml/index.sqlite)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument("--oneline", action="store_true", help="one short line (tmux status bars)")
    p.add_argument("--stall-after", type=seconds, default=STALL_FLOOR_S, metavar="S",
                   help="a silent rank is stalled after max(S, 10 typical step intervals) without records"
                        f" (default {STALL_FLOOR_S:g})")
    return p


def _fmt(v, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def _status_cell(run) -> str:
    """The run's word, with the ranks and lost nodes that explain it (``stalled r1``, ``failed r0 · lost node 1``)."""
    return run.status_text


def _oneline(runs) -> str:
    """``traceml: 1 failed · 2 running`` — the active states first; finished runs only when idle."""
    counts = count_states((r.status for r in runs), RUN_ATTENTION)
    active = [f"{counts[s]} {s}" for s in _ONELINE_ACTIVE if counts.get(s)]
    silent = [f"r{rank}" for r in runs if r.status in (RunStatus.RUNNING, RunStatus.STALLED, RunStatus.LOST)
              for rank in r.silent_ranks]
    if silent:
        active.append("silent " + ",".join(silent[:8]) + ("…" if len(silent) > 8 else ""))
    nodes = sorted({n for r in runs for n in r.lost_nodes})
    if nodes:  # a node whose launcher lease expired while another lives (core.state.lost_nodes)
        active.append(lost_nodes_text(nodes))
    hung = [r.hang for r in runs if r.hang is not None and r.status in _ONELINE_ACTIVE]
    if hung:  # the rank the others wait for, where it is (core/hang.py): `hang r1 train.py:42`
        first = hung[0]
        where = f" {first.frame['file']}:{first.frame['line']}" if first.frame else ""
        active.append("hang " + ",".join(f"r{c}" for c in first.culprits) + where)
    if active:
        return "traceml: " + " · ".join(active)
    done = [f"{n} {s}" for s, n in counts.items()]
    return "traceml: " + (" · ".join(done) if done else "no runs")


def _note(note) -> None:
    """The writer-health line, after what stdout shows (docs/daemon.md, "Writer health")."""
    if note:
        sys.stdout.flush()
        print(note, file=sys.stderr)


def main(argv: list[str]) -> int:
    """Entry point of ``traceml status``."""
    args = _parser().parse_args(argv)
    index_path = os.path.abspath(args.index) if args.index else str(locations.default_index_path())
    if os.path.isdir(index_path):
        print(f"traceml status: --index {index_path} is a folder, not an index file", file=sys.stderr)
        return 1
    try:
        reader = Reader(index_path, stall_floor_s=args.stall_after)
    except FileNotFoundError:
        if args.oneline:  # a status bar segment is never blank
            print("traceml: no index")
            return 0
        print(f"traceml status: no index at {index_path} (start `traceml daemon ROOT` first)", file=sys.stderr)
        return 1
    except IndexVersionError as exc:
        print(f"traceml status: {exc}", file=sys.stderr)
        return 1
    except sqlite3.DatabaseError as exc:
        print(f"traceml status: {idx.damaged_message(index_path, f'cannot be read ({exc})')}", file=sys.stderr)
        return 1
    try:
        # With nobody indexing, states are decided as of the last commit, not now: a silent writer is not a
        # silent rank (docs/daemon.md, "Writer health").
        clock = time.time()
        health = writer_health.probe(index_path, reader, clock, args.roots)
        now = health.as_of(clock)
        runs = reader.list_runs(args.roots or None, now=now)
        # A mistyped ROOT would read as "no runs"; a root deleted since keeps its runs in the index (missing).
        for root in args.roots:
            if not os.path.isdir(root) and not reader.list_runs([root], now=now):
                print(f"traceml status: {root} is not a folder, and the index has no runs under it", file=sys.stderr)
                return 1
        if args.oneline:
            print(_oneline(runs))
            return 0
        if args.json:
            out = {"index": index_path, "data_version": reader.data_version(), "writer": health.to_json(clock),
                   "runs": []}
            for r in runs:
                rows = reader.rank_rows(r.run_id, now)
                # the run's statistic and Δ against the median rank, by the one straggler rule (daemon/views.py,
                # core/straggler.py); median_step_ms stays the rolling median of every attempt
                shown = {v.rank: v for v in reader.rank_views(r, rows)}
                ranks = [
                    {"rank": k.rank, "attempt": k.attempt, "state": None if k.state is None else str(k.state),
                     "latest": k.latest, "records": k.records, "last_step": k.last_step, "last_record_ts": k.last_ts,
                     "median_step_ms": k.median_step_ms,
                     "step_ms": shown[k.rank].step_ms if k.latest and k.rank in shown else None,
                     "delta_pct": shown[k.rank].delta_pct if k.latest and k.rank in shown else None,
                     "steps_per_s": k.steps_per_s, "ended": k.ended, "exit_code": k.exit_code}
                    for k in rows
                ]
                d = asdict(r)
                d["status"] = str(r.status)
                # the word as every surface prints it, with its marks, and whether it needs attention
                # (core.state.describe / needs_attention: a validation mark counts, `completed ⚠ 2 blocked`)
                d["status_text"] = r.status_text
                d["attention"] = r.attention
                d["rank_states"] = {str(rank): str(state) for rank, state in r.rank_states}
                d["rank_count"] = d.pop("ranks")
                for key in ("step_statistic", "rank_step_ms"):  # said by `figures` and each rank's step_ms
                    d.pop(key, None)
                d["ranks"] = ranks
                d["error_count"] = r.errors
                # the figures every surface shows (step time, straggler, steps/s, eval lag, early-stopping best)
                d["figures"] = reader.figures(r, now).to_json()
                # who failed first, where and why: the summary's failure section (docs/run.md "Failure forensics")
                failure = reader.files.failure(r.run_id) if r.status in (RunStatus.FAILED, RunStatus.LOST, RunStatus.INTERRUPTED) else None
                d["failure"] = artifacts.to_builtins(failure) if failure is not None else None
                # streams a rank reported it does not measure, and why (docs/run.md "Unmeasured streams")
                d["unmeasured"] = list(reader.events.unmeasured(r.run_id))
                # the heavy QC backlog as the index holds it, its word by core.state.decide_worker_qc (docs/qc.md)
                d["worker_qc"] = reader.backlog.worker_qc(r.run_id, now)
                out["runs"].append(d)
            print(jsonsafe.dumps_valid(out, indent=2))  # valid JSON always: an overflowed figure is null
            return 0
        note = health.status_line()  # "no writer — states as of 14:02:31": on stderr, the table stays the table
        if not runs:
            print(f"no runs in {index_path}")
            _note(note)
            return 0
        # Names are cut in the middle, never at the end: runs named alike differ in their last characters.
        width = min(max(len(r.name) for r in runs), NAME_WIDTH_MAX)
        # The status cell names the ranks that explain it (`stalled r0,r1`): as wide as the widest, cut in the
        # middle past STATUS_WIDTH_MAX, so the columns after it stay aligned.
        cells = [_status_cell(r) for r in runs]
        status_width = min(max(10, *(len(c) for c in cells)), STATUS_WIDTH_MAX)
        # Which runs have dark streams, named in the summary's words (core/coverage.py); `-` when none.
        dark = [",".join(coverage.dark_streams(reader.events.unmeasured(r.run_id))) or "-" for r in runs]
        dark_width = min(max(len("UNMEASURED"), *(len(c) for c in dark)), UNMEASURED_WIDTH_MAX)
        print(f"{'RUN':<{width}} {'STATUS':<{status_width}} {'RANKS':>5} {'STEP':>8} {'STEPS/S':>8} {'ERRORS':>6} "
              f"{'UNMEASURED':<{dark_width}}  DIR")
        for r, cell, streams in zip(runs, cells, dark):
            print(f"{middle_cut(r.name, width):<{width}} {middle_cut(cell, status_width):<{status_width}} "
                  f"{r.ranks:>5} {_fmt(r.last_step):>8} {_fmt(r.steps_per_s, '.2f'):>8} {r.errors:>6} "
                  f"{middle_cut(streams, dark_width):<{dark_width}}  {r.dir}")
        for r in runs:  # a hang's one line under the table: who never arrived, where, who waits (core/hang.py)
            if r.hang is not None:
                print(f"  hang {middle_cut(r.name, NAME_WIDTH_MAX)}: {r.hang.text}")
        _note(note)
        return 0
    except sqlite3.DatabaseError as exc:
        print(f"traceml status: {idx.damaged_message(index_path, f'cannot be read ({exc})')}", file=sys.stderr)
        return 1
    finally:
        reader.close()
