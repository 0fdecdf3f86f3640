"""A live ingester killed with SIGKILL at a chosen point of the live path (tests/test_live_table.py).

``python -m support.live_kill INDEX ROOT PASSES WHERE [SLICE]`` (run it with ``env=support.python_env()``): a real
:class:`daemon.service.Ingester` with the live daemon's settings over the streams under ROOT (made by
:func:`make_streams`), merges held back; PASSES passes each append the lines of :func:`pass_lines` to every
stream, then read them (``poll``) and commit (``commit_pass``): every row is committed to the live table,
none is merged or folded. Then the process kills itself with SIGKILL:

* ``WHERE = commit`` — there and then: between the rows' commit and their series write;
* ``WHERE = <SQL prefix>`` — inside the merge (``Ingester.merge_live``), as the first statement starting with
  that prefix begins (``INSERT INTO steps_stored``, ``INSERT INTO series``, ``DELETE FROM steps_live``,
  ``COMMIT`` …): the merge's transaction is open and part of it written;
* ``WHERE = <SQL prefix>@N`` — as the N-th statement starting with that prefix begins (a merge cut into
  slices, SLICE ranks per transaction: the N-th slice's, the slices before it committed);
* ``WHERE = never`` — the merge completes and the process exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from support.daemon_files import append_raw, header_line, step_line

RUNS, RANKS = 3, 4


def stream_paths(root: Path) -> dict[tuple[str, int], Path]:
    """The streams :func:`make_streams` makes, by (run name, rank)."""
    return {(f"run{r}", k): root / f"run{r}" / "ranks" / f"rank_{k}" / "steps-0.jsonl"
            for r in range(RUNS) for k in range(RANKS)}


def make_streams(root: Path) -> None:
    """Each stream with its header line only."""
    for (run, rank), path in stream_paths(root).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(header_line(run, rank, uuid=f"{run}-{rank}"))


def pass_lines(run: str, rank: int, p: int) -> bytes:
    """What pass ``p`` (from 0) appends to a stream: mostly one new step; every fifth pass three (a
    multi-line read), every seventh one of them repeats an earlier step (a duplicate: never stored twice)."""
    first = 1 + p * 3
    steps = [first] if p % 5 else [first, first + 1, first + 2]
    if p % 7 == 6:
        steps.append(first - 3)
    return b"".join(step_line(run, rank, s, step_ms=90.0 + (s * 7 + rank) % 23 + 0.123456789,
                              ratio=0.01 * ((s + rank) % 11)) for s in steps)


def main(argv: list[str]) -> None:
    index, root, passes, where = Path(argv[0]), Path(argv[1]), int(argv[2]), argv[3]
    prefix, _, nth = where.partition("@")
    nth = int(nth or 1)
    from daemon.service import Ingester

    ing = Ingester(index, [str(root)], use_inotify=False)
    ing.open()
    ing.live_settings()
    ing.store.live.merge_every = float("inf")
    ing.store.live.merge_rows = 1 << 40
    if len(argv) > 4:
        ing.store.live.merge_keys = int(argv[4])
    ing.scan()
    ing.commit()
    targets = ing.plan.everything()
    paths = stream_paths(root)
    for p in range(passes):
        for (run, rank), path in paths.items():
            append_raw(path, pass_lines(run, rank, p))
        ing.poll(targets)
        ing.commit_pass()
    if where == "commit":
        os.kill(os.getpid(), signal.SIGKILL)

    seen = [0]

    def trace(sql: str) -> None:
        if where != "never" and sql.lstrip().startswith(prefix):
            seen[0] += 1
            if seen[0] == nth:
                os.kill(os.getpid(), signal.SIGKILL)

    ing.conn.set_trace_callback(trace)
    ing.merge_live()
    ing.conn.set_trace_callback(None)
    ing.close()


if __name__ == "__main__":
    main(sys.argv[1:])
