"""The launcher's side of failure forensics: gather the facts, let the core decide (docs/run.md).

Node 0 calls :func:`failure_section` when it finalizes a run; the result is
the ``failure`` section of ``final_summary.json`` (None for a clean run). It
reads only what it needs: each rank's newest step file's header (its node)
and tail (last step, end record), and the tail of each node's
``training.stderr.log``, and torch's flight-recorder dump of a rank when the user
enabled the recorder (:mod:`traceml_tui.core.flight_recorder`);
:mod:`traceml_tui.core.forensics` does the rest.
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from pathlib import Path
from typing import Optional

from traceml_tui.core import flight_recorder, forensics, jsonl, records
from traceml_tui.core.rundir import RunDir

#: Bytes read from the end of a rank's step file: the newest records, the end record among them.
_RANK_TAIL = 256 * 1024


def _tail(path: Path, size: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = fh.tell()
            fh.seek(max(0, end - size))
            return fh.read(size)
    except OSError:
        return b""


def _head_line(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.readline(1 << 20)
    except OSError:
        return b""


def rank_trail(path: Path, rank: int) -> forensics.RankTrail:
    """One rank's trail from its newest step file (complete lines only; malformed ones skipped)."""
    node = None
    try:
        header = records.decode(_head_line(path))
        if isinstance(header, records.Header):
            node = header.node_rank
    except (records.RecordError, RecursionError):
        pass
    last_step = last_ts = end = hang = None
    # complete lines of the tail (a cut first line left out); malformed ones skipped: the daemon reports those
    for record in jsonl.iter_records(jsonl.read_tail_lines(path, _RANK_TAIL)):
        ts = getattr(record, "ts", None)
        if isinstance(record, records.Header):
            continue
        if isinstance(ts, (int, float)):
            last_ts = ts if last_ts is None else max(last_ts, ts)
        if isinstance(record, records.Step):
            last_step = record.step if last_step is None else max(last_step, record.step)
        elif isinstance(record, records.RankEnd):
            end = record
        elif isinstance(record, records.Hang):
            hang = record  # the newest: the watchdog writes one per overrun (sdk/watchdog.py)
    if end is not None:
        last_step = end.step if last_step is None else max(last_step, end.step)
    return forensics.RankTrail(rank=rank, node=node, last_step=last_step, last_ts=last_ts,
                               end_status=end.status if end else None, end_exit_code=end.exit_code if end else None,
                               end_ts=end.ts if end else None, hang=hang)


def _started(path: Path) -> Optional[float]:
    """When a rank's attempt started: its stream header's time."""
    try:
        header = records.decode(_head_line(path))
    except (records.RecordError, RecursionError):
        return None
    return header.ts if isinstance(header, records.Header) else None


def with_flight_recorder(trail: forensics.RankTrail, path: Path, attempt: int,
                         environ: Optional[dict] = None) -> forensics.RankTrail:
    """``trail`` with a ``hang`` from torch's flight-recorder dump of its rank, when it has no hang record of
    its own, the user enabled the recorder and torch wrote a dump after this attempt started (an older dump in
    a shared temp folder is another run's)."""
    if trail.hang is not None:
        return trail
    dump_file = flight_recorder.dump_path(dict(os.environ) if environ is None else environ, trail.rank)
    started = _started(path)
    try:
        written = os.stat(dump_file).st_mtime if dump_file else None
    except OSError:
        written = None
    if written is None or started is None or written < started:
        return trail
    dump = flight_recorder.read_dump_file(dump_file)
    hang = flight_recorder.hang_from_dump(dump, run="", rank=trail.rank, attempt=attempt,
                                          step=trail.last_step or 0, ts=written) if dump else None
    return replace(trail, hang=hang) if hang is not None else trail


def failure_section(run_dir: Path, exit_code: Optional[int], only_hang: bool = False) -> Optional[dict]:
    """The ``failure`` section for a finished run (None when nothing failed). Never raises on bad files.

    ``only_hang`` (a run stopped from outside: only a hang is its failure): None at once when no rank recorded
    a hang, before the node logs are read and the host names looked up (DNS, inside a scheduler's grace period).
    """
    layout = RunDir(run_dir)
    newest: dict[int, tuple[Path, int]] = {}
    for stream in layout.step_files():  # by rank, then attempt: the newest attempt wins
        newest[stream.rank] = (stream.path, stream.attempt)
    trails = [with_flight_recorder(rank_trail(path, rank), path, attempt)
              for rank, (path, attempt) in sorted(newest.items())]
    if only_hang and not any(t.hang is not None for t in trails):
        return None
    logs = []
    for node in layout.node_ranks():
        path = layout.stderr_log(node)
        text = _tail(path, forensics.TAIL_BYTES).decode("utf-8", errors="replace")
        if text:
            logs.append(forensics.NodeLog(node=node, path=path.relative_to(layout.path).as_posix(), text=text))
    try:
        hosts = {socket.gethostname(), socket.getfqdn()}
    except OSError:
        hosts = set()
    failure = forensics.diagnose(trails, logs, exit_code=exit_code, hosts=hosts)
    return failure.to_dict() if failure is not None else None
