"""Read a run directory's JSONL streams into compact per-rank columns.

Only complete lines count; a malformed line is skipped (the daemon reports
those), and so is a line nested too deeply to decode (:mod:`traceml_tui.core.jsonl`,
the one rule). When a rank has several attempts, the newest attempt's record of a
step supersedes an older one, so a resumed history has each step once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from traceml_tui.core import jsonl, records
from traceml_tui.core.rundir import RunDir


@dataclass
class RankSteps:
    """One rank's step history keyed by step number (newest attempt wins)."""

    rank: int
    steps: dict[int, records.Step] = field(default_factory=dict)
    attempts: set[int] = field(default_factory=set)
    evals: list[records.Eval] = field(default_factory=list)
    fields: list[records.FieldStats] = field(default_factory=list)
    unmeasured: list[records.Unmeasured] = field(default_factory=list)  # streams it reported dark, in order
    ended: Optional[records.RankEnd] = None


def load_ranks(run_dir: Path) -> dict[int, RankSteps]:
    """Load every rank's step records (attempts in order: a newer attempt's record of a step supersedes)."""
    out: dict[int, RankSteps] = {}
    by_rank: dict[int, list[Path]] = {}
    for stream in RunDir(run_dir).step_files():  # by rank, then attempt
        by_rank.setdefault(stream.rank, []).append(stream.path)
    for rank, paths in by_rank.items():
        series = RankSteps(rank)
        for path in paths:
            for record in jsonl.file_records(path):  # complete lines only, malformed ones skipped
                if isinstance(record, records.Step):
                    series.steps[record.step] = record
                    series.attempts.add(record.attempt)
                elif isinstance(record, records.Eval):
                    series.evals.append(record)
                elif isinstance(record, records.FieldStats):
                    series.fields.append(record)
                elif isinstance(record, records.RankEnd):
                    series.ended = record
                elif isinstance(record, records.Unmeasured):
                    series.unmeasured.append(record)
        if series.steps or series.ended is not None or series.fields or series.unmeasured:
            out[rank] = series
    return out


def load_system(run_dir: Path) -> dict[int, list[records.SystemSample]]:
    """Load node samples: node_rank → samples in time order."""
    out: dict[int, list[records.SystemSample]] = {}
    for _node, path in RunDir(run_dir).system_files():
        for record in jsonl.file_records(path, (records.SystemSample,)):
            if isinstance(record, records.SystemSample):
                out.setdefault(record.node_rank, []).append(record)
    return out
