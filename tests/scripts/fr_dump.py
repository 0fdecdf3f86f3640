"""Real flight-recorder dumps for tests/test_hang_forensics.py (2-rank gloo under torch.distributed.run).

Run with ``TORCH_FR_BUFFER_SIZE`` > 0. Both ranks all-reduce 3 times; then rank 1
dumps its recorder (it never issued a 4th collective), and rank 0 issues the 4th
all_reduce asynchronously and dumps while it waits in it. Files: ``<prefix><rank>``
(``argv[1]`` is the prefix); rank 1 then joins the all_reduce so both end cleanly.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def _dump(prefix: str, rank: int, *, settled: bool = False) -> None:
    """Write the rank's dump; ``settled``: once its newest collective is retired (gloo retires a finished
    collective from a background thread, a moment after the call returned)."""
    deadline = time.monotonic() + 30
    while True:
        raw = torch._C._distributed_c10d._dump_fr_trace()
        if not settled or pickle.loads(raw)["entries"][-1].get("retired") or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    Path(f"{prefix}{rank}").write_bytes(raw)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {path.name}")
        time.sleep(0.01)


def main() -> None:
    prefix = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    marks = Path(os.path.dirname(prefix))
    if rank == 1:
        _dump(prefix, 1, settled=True)
        (marks / "dumped_1").touch()
        _wait_for(marks / "dumped_0")
        dist.all_reduce(t)
    else:
        work = dist.all_reduce(t, async_op=True)
        _wait_for(marks / "dumped_1")
        _dump(prefix, 0)
        (marks / "dumped_0").touch()
        work.wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
