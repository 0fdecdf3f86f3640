"""Writers shared by the daemon tests (no tests here).

Run as a module it is a writer process: ``python -m support.daemon_files PATH RANK N SEED`` (see
:func:`writer_command`) appends N step records to ``PATH`` (header first when the file is new) in small
random bursts.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

from traceml_tui.core import records
from traceml_tui.core.atomic import append_line, open_append
from traceml_tui.core.rundir import RunDir


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


#: The index stores step timings as integer microseconds (docs/daemon.md, "How a step row is stored"): a timing
#: read back differs from the record's by at most half a microsecond, this many milliseconds.
US_ROUNDING = 0.0005


def index_rows(index: Path, sql: str, params=()) -> list:
    """The rows ``sql`` answers on the index file ``index`` (a plain connection, closed after)."""
    import sqlite3

    conn = sqlite3.connect(index)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def rows_match(got, want, tol: float = US_ROUNDING) -> bool:
    """``got`` equals ``want`` (sequences of rows) except that floats may differ by up to ``tol`` (rounding)."""
    def same(a, b) -> bool:
        if isinstance(a, float) or isinstance(b, float):
            return a is not None and b is not None and abs(a - b) <= tol
        return a == b

    return len(got) == len(want) and all(len(g) == len(w) and all(map(same, g, w)) for g, w in zip(got, want))


#: The ``steps`` table of index schema version 2, frozen here as that version's daemon/index.py created it:
#: every value stored as the ingester bound it (REAL milliseconds and seconds, bytes), in this column order.
V2_STEPS = """CREATE TABLE steps (
  run_id INTEGER NOT NULL, rank INTEGER NOT NULL, attempt INTEGER NOT NULL, step INTEGER NOT NULL,
  ts REAL,
  step_ms REAL, input_wait_ms REAL, h2d_ms REAL, forward_ms REAL, backward_ms REAL, optimizer_ms REAL,
  gpu_step_ms REAL, gpu_input_wait_ms REAL, gpu_h2d_ms REAL, gpu_forward_ms REAL, gpu_backward_ms REAL,
  gpu_optimizer_ms REAL,
  loss REAL, lr REAL, grad_norm REAL, examples INTEGER, rss INTEGER,
  extra TEXT,
  data_wait_ms REAL, data_in_step_ms REAL,
  PRIMARY KEY (run_id, rank, attempt, step)
) WITHOUT ROWID"""
V2_STEP_COLUMNS = (
    "run_id", "rank", "attempt", "step", "ts",
    "step_ms", "input_wait_ms", "h2d_ms", "forward_ms", "backward_ms", "optimizer_ms",
    "gpu_step_ms", "gpu_input_wait_ms", "gpu_h2d_ms", "gpu_forward_ms", "gpu_backward_ms", "gpu_optimizer_ms",
    "loss", "lr", "grad_norm", "examples", "rss", "extra",
    "data_wait_ms", "data_in_step_ms",
)


def v2_step_rows(index: Path, root: Path) -> list[tuple]:
    """The step rows a version-2 ingester stored for the streams under ``root``: ``live.step_rows`` of each
    file's records, bound as they are (``V2_STEP_COLUMNS`` order; the first row of a repeated step kept)."""
    import sqlite3

    from daemon import live
    from traceml_tui.core import rundir

    conn = sqlite3.connect(index)
    try:
        run_ids = {Path(d).resolve(): i for i, d in conn.execute("SELECT run_id, dir FROM runs")}
    finally:
        conn.close()
    rows: dict[tuple, tuple] = {}
    for run_dir in rundir.discover_runs(root):
        run_id = run_ids[Path(run_dir).resolve()]
        for path in sorted(Path(run_dir).glob("ranks/rank_*/steps-*.jsonl")):
            steps = [r for r in map(records.decode, path.read_bytes().splitlines()) if isinstance(r, records.Step)]
            for row in live.step_rows(steps)[0]:
                rows.setdefault((run_id, *row[:3]), (run_id, *row))
    return [rows[k] for k in sorted(rows)]


def make_v2_index(index: Path, rows: list[tuple] | None = None, lacking: tuple[str, ...] = ()) -> None:
    """Turn ``index`` (written by this version) into a version-2 index: a ``steps`` table of ``V2_STEPS``
    holding ``rows`` (default: the rows the index holds now, as read back) and ``meta.schema_version`` 2.
    ``lacking`` names ``steps`` columns to drop (a version-2 index written before they were added)."""
    import sqlite3

    from daemon import index as idx

    conn = sqlite3.connect(index, isolation_level=None)
    try:
        cols = ", ".join(V2_STEP_COLUMNS)
        if rows is None:
            rows = conn.execute(f"SELECT {cols} FROM steps ORDER BY run_id, rank, attempt, step").fetchall()
        conn.execute("BEGIN")
        conn.execute("DROP VIEW steps")
        conn.execute(f"DROP TABLE {idx.STEPS_TABLE}")
        conn.execute(V2_STEPS)
        conn.executemany(f"INSERT INTO steps ({cols}) VALUES ({', '.join('?' * len(V2_STEP_COLUMNS))})", rows)
        for column in lacking:
            conn.execute(f"ALTER TABLE steps DROP COLUMN {column}")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        conn.execute("COMMIT")
    finally:
        conn.close()


def writer_command(path: Path, rank: int, n: int, seed: int) -> list[str]:
    """The command of a writer process appending ``n`` steps of ``rank`` to ``path`` (run it with
    ``env=support.python_env()``)."""
    return [sys.executable, "-m", "support.daemon_files", str(path), str(rank), str(n), str(seed)]


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
