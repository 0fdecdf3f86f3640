"""Writers shared by the daemon tests (no tests here).

Run as a script it is a writer process: ``python test_daemon_support.py PATH RANK N SEED`` appends
N step records to ``PATH`` (header first when the file is new) in small random bursts.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traceml_tui.core import records  # noqa: E402
from traceml_tui.core.atomic import append_line, open_append  # noqa: E402
from traceml_tui.core.rundir import RunDir  # noqa: E402


def header_line(run: str, rank: int, attempt: int = 0, uuid: str | None = None) -> bytes:
    return records.encode(records.Header(v=1, run=run, rank=rank, attempt=attempt,
                                         uuid=uuid or f"{run}-{rank}-{attempt}-{random.random()}", ts=time.time()))


def step_line(run: str, rank: int, step: int, attempt: int = 0, step_ms: float = 100.0, ts: float | None = None,
              loss: float | None = None, examples: int | None = None, ratio: float | None = None) -> bytes:
    comps = {"mse": records.Component(value=ratio, target_ms=1.0, ratio=ratio)} if ratio is not None else None
    return records.encode(records.Step(
        v=1, run=run, rank=rank, attempt=attempt, step=step, ts=ts if ts is not None else 1000.0 + step,
        cpu_ms=records.Phases(step=step_ms, input_wait=step_ms / 10), loss=loss if loss is not None else 1.0 / step,
        examples=examples if examples is not None else 32 * step, components=comps))


def steps_path(run_dir: Path, rank: int, attempt: int = 0) -> Path:
    return RunDir(run_dir).steps_file(rank, attempt)


def write_steps(run_dir: Path, rank: int, steps, attempt: int = 0, header: bool = True, **kw) -> Path:
    """Append a header (when asked) and step lines for ``steps`` to one rank file."""
    path = steps_path(run_dir, rank, attempt)
    fd = open_append(path)
    try:
        if header:
            append_line(fd, header_line(run_dir.name, rank, attempt))
        for s in steps:
            append_line(fd, step_line(run_dir.name, rank, s, attempt, **kw))
    finally:
        os.close(fd)
    return path


def append_raw(path: Path, data: bytes) -> None:
    fd = open_append(path)
    try:
        append_line(fd, data)
    finally:
        os.close(fd)


def _writer_main(argv: list[str]) -> None:
    path, rank, n, seed = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    rng = random.Random(seed)
    run = path.parents[2].name
    fd = open_append(path)
    append_line(fd, header_line(run, rank))
    step = 0
    while step < n:
        for _ in range(rng.randint(1, 40)):
            step += 1
            append_line(fd, step_line(run, rank, step, step_ms=rng.uniform(50, 150)))
            if step >= n:
                break
        time.sleep(rng.uniform(0.0, 0.02))
    os.close(fd)


if __name__ == "__main__":
    _writer_main(sys.argv[1:])
