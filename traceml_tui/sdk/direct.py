"""A run started without ``traceml run`` ends with a summary too (docs/run.md, "Runs started without traceml run").

Under ``traceml run`` the launcher writes ``final_summary.json`` after training.
A script run with plain ``python`` or ``torchrun`` has no launcher, so rank 0
writes it at interpreter exit, after its own ``rank_end``:

* only when no launcher handed the run over (``TRACEML_RUN_DIR`` unset) and only
  on rank 0;
* once: an existing ``final_summary.json`` is never overwritten (a second
  session of the same process, a rerun into the same folder);
* after waiting up to :data:`PEER_WAIT_S` for every other rank's newest attempt
  to end with a ``rank_end`` record (plain torchrun ends its ranks at about the
  same time; a peer that died without one does not hold rank 0 longer than
  that), then over every rank whose files it finds;
* by the summary builder ``traceml run`` uses (``summary/build.py``), imported
  only then, so importing the SDK costs nothing for it. There is no manifest,
  so ``run_context`` is an empty object (seed 000) and there is no ``failure``
  section (who failed first is the launcher's to tell).

It never raises: a summary problem is one line on stderr, and the process
exits as it would have. A rank 0 ended by a signal (SIGTERM, SIGKILL) writes
none; a Ctrl-C while it waits for its peers skips it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from traceml_tui.core import jsonl, records
from traceml_tui.core.rundir import RunDir
from traceml_tui.sdk import env

#: Longest rank 0 waits at exit for the other ranks' end records (seconds).
PEER_WAIT_S = 5.0
_POLL_S = 0.05
_TAIL_BYTES = 64 << 10


def launched() -> bool:
    """True under ``traceml run`` (the launcher writes the summary itself)."""
    return bool(os.environ.get(env.RUN_DIR))


def rank_ended(run_dir: Path, rank: int) -> bool:
    """Whether ``rank``'s newest attempt file ends with a complete ``rank_end`` record."""
    files = RunDir(run_dir).step_files(rank)
    if not files:
        return False
    lines = jsonl.read_tail_lines(files[-1].path, _TAIL_BYTES)  # by attempt: the newest; complete lines only
    return any(True for _ in jsonl.iter_records(lines[-1:], (records.RankEnd,)))


def wait_for_peers(run_dir: Path, world_size: int, timeout_s: float = PEER_WAIT_S) -> list[int]:
    """Wait until ranks ``1..world_size-1`` ended (or ``timeout_s`` passed); returns those that did not."""
    waiting = list(range(1, max(1, world_size)))
    deadline = time.monotonic() + timeout_s
    while True:
        waiting = [rank for rank in waiting if not rank_ended(run_dir, rank)]
        if not waiting or time.monotonic() >= deadline:
            return waiting
        time.sleep(_POLL_S)


def write_summary_at_exit(session: Any, *, wait_s: float = PEER_WAIT_S) -> Optional[Path]:
    """Rank 0 of a run without a launcher: write ``final_summary.json`` once; returns its path, or None."""
    if launched() or session.rank != 0:
        return None
    layout = RunDir(session.run_dir)
    if layout.summary_json.exists() or not os.path.isfile(session.path):
        return None  # written already, or the run folder is gone (never recreate it just for a summary)
    try:
        missing = wait_for_peers(Path(session.run_dir), session.world_size, wait_s)
        from traceml_tui.summary.build import build_summary
        from traceml_tui.summary.store import write_summary

        summary = build_summary(Path(session.run_dir), None)
        summary["failure"] = None
        write_summary(session.run_dir, summary, exclusive=True)
    except FileExistsError:
        return None  # another writer was first: its summary stands
    except KeyboardInterrupt:
        return None  # Ctrl-C while waiting for the peers: the user wants out, not a summary
    except Exception as exc:  # noqa: BLE001 - a summary problem never changes how the script exits
        print(f"traceml: could not write final_summary.json: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return None
    if missing:
        ranks = ", ".join(map(str, missing))
        print(f"traceml: rank(s) {ranks} had not ended after {wait_s:g} s; the summary covers what they recorded",
              file=sys.stderr, flush=True)
    print(f"traceml: summary: {layout.summary_json}", file=sys.stderr, flush=True)
    return layout.summary_json
