"""Lines of real rank streams, the damage a stream can take, and the ingest helpers the fuzz tests share
(no tests here).

The lines come from the committed real runs (``tests/fixtures/runs``: every kind of record the SDK
writes: steps, evals, checkpoints, field stats, rank ends). The damage is what a crash, a second writer,
a copy or a disk does to JSONL: a line torn in two, two lines merged, garbage, blank lines, CRLF,
whitespace, an integer beyond 64 bits, ``},{`` inside a string, a byte dropped.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

from hypothesis import strategies as st

from daemon import decode
from daemon.service import Ingester
from traceml_tui.core import records
from traceml_tui.core.rundir import RunDir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def real_lines(per_file: int = 30) -> list[bytes]:
    """Up to ``per_file`` record lines (headers left out) of every rank stream of the committed real runs."""
    out = []
    for run in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        for stream in RunDir(run).step_files():
            lines = stream.path.read_bytes().splitlines()[1:]
            # the stream's first lines and its last ones (rank_end, evals and checkpoints come late)
            out.extend(lines[: per_file // 2] + lines[-(per_file // 2):])
    return list(dict.fromkeys(out))


LINES = real_lines()
assert LINES and any(b'"kind":"step"' in x for x in LINES) and any(b'"kind":"rank_end"' in x for x in LINES)

_INT_FIELD = re.compile(rb'"([A-Za-z_]+)":(-?[0-9]+)(?=[,}])')  # every integer field, whatever its name
HUGE = [b"9223372036854775808", b"-9223372036854775809", b"18446744073709551616", b"99999999999999999999999"]
_STRING = re.compile(rb'"[^"\\]{2,}"')
OPS = ("keep", "keep", "keep", "tear", "tear_in_string", "tear_in_string", "merge", "merge", "garbage", "blank",
       "crlf", "space", "bigint", "brace_string", "drop_byte")


@st.composite
def damaged_lines(draw, max_lines: int = 12) -> list[bytes]:
    """Lines (no newline inside any) of a damaged stream body: real lines, some of them damaged."""
    out: list[bytes] = []
    for _ in range(draw(st.integers(1, max_lines))):
        line = draw(st.sampled_from(LINES))
        op = draw(st.sampled_from(OPS))
        if op == "tear":  # a torn write: the line in two (the R2 pattern)
            cut = draw(st.integers(1, len(line) - 1))
            out += [line[:cut], line[cut:]]
        elif op == "tear_in_string":  # torn inside a string: the two halves joined by a comma are one valid record
            m = draw(st.sampled_from(list(_STRING.finditer(line))))
            cut = draw(st.integers(m.start() + 1, m.end() - 2))
            out += [line[:cut], line[cut:]]
        elif op == "merge":  # two records on one line (a lost newline, two writers)
            sep = draw(st.sampled_from([b",", b",", b",", b"", b" ", b", ", b"\t,\r"]))
            out.append(line + sep + draw(st.sampled_from(LINES)))
        elif op == "garbage":
            out.append(draw(st.binary(max_size=24)).replace(b"\n", b""))
        elif op == "blank":
            out.append(draw(st.sampled_from([b"", b" ", b"\r", b"\t "])))
        elif op == "crlf":
            out.append(line + b"\r")
        elif op == "space":
            out.append(b" " + line + b" ")
        elif op == "bigint":
            fields = list(_INT_FIELD.finditer(line))
            if fields:
                m = draw(st.sampled_from(fields))
                line = line[: m.start(2)] + draw(st.sampled_from(HUGE)) + line[m.end(2):]
            out.append(line)
        elif op == "brace_string":  # a string holding "},{" (a valid record the fast path must not trust blindly)
            out.append(line[:-1] + b',"note":"},{"}')
        elif op == "drop_byte":
            at = draw(st.integers(0, len(line) - 1))
            out.append(line[:at] + line[at + 1:])
        else:
            out.append(line)
    return out


@st.composite
def shifted_lines(draw, max_lines: int = 8) -> list[bytes]:
    """Real lines where one is torn inside a string and two others merged with a comma: the count of
    records stays the count of lines, so only a check of where each record lies can tell (the R2 family)."""
    lines = draw(st.lists(st.sampled_from(LINES), min_size=3, max_size=max_lines))
    i, j = draw(st.permutations(range(len(lines))))[:2]
    m = draw(st.sampled_from(list(_STRING.finditer(lines[i]))))
    cut = draw(st.integers(m.start() + 1, m.end() - 2))
    torn = [lines[i][:cut], lines[i][cut:]]
    merged = [lines[j] + b"," + draw(st.sampled_from(LINES))]
    out = []
    for k, line in enumerate(lines):
        out += torn if k == i else merged if k == j else [line]
    return out


@st.composite
def big_int_lines(draw, max_lines: int = 6) -> list[bytes]:
    """Real lines, one of them with one integer field beyond 64 bits (refused the same in any block)."""
    lines = draw(st.lists(st.sampled_from(LINES), min_size=1, max_size=max_lines))
    i = draw(st.integers(0, len(lines) - 1))
    fields = list(_INT_FIELD.finditer(lines[i]))
    m = draw(st.sampled_from(fields))
    lines[i] = lines[i][: m.start(2)] + draw(st.sampled_from(HUGE)) + lines[i][m.end(2):]
    return lines


def header(run: str, rank: int = 0) -> bytes:
    """A stream's header line (as the SDK writes it)."""
    return records.encode(records.Header(v=1, run=run, rank=rank, attempt=0, uuid=f"{run}-{rank}", ts=1.0))


def oracle(lines: list[bytes]) -> tuple[set, int]:
    """Line by line, as the contract says: the (rank, attempt, step) of each valid step line, and the count
    of bad lines (blank lines are neither)."""
    steps, bad = set(), 0
    for line in lines:
        if not line.rstrip(b"\r").strip():
            continue
        try:
            rec = decode.decode_line(line.rstrip(b"\r"))  # the one line alone: records' schema, 64-bit rule
        except records.RecordError:
            bad += 1
            continue
        if isinstance(rec, records.Step):
            steps.add((rec.rank, rec.attempt, rec.step))
    return steps, bad


def write_stream(run_dir: Path, body: list[bytes]) -> None:
    """``run_dir``'s rank 0 stream: a header, then ``body``'s lines."""
    path = run_dir / "ranks" / "rank_0" / "steps-0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\n".join([header(run_dir.name), *body]) + b"\n")


def ingest(root: Path, index: Path, caplog) -> int:
    """One ``run_once`` of the real ingester over ``root``; no pass may fail and no stream be set aside.
    Returns how many files it refused (what ``traceml daemon --once`` says)."""
    caplog.clear()
    ing = Ingester(index, [str(root)], poll_interval=0.05, use_inotify=False)
    try:
        ing.run_once()
        refused = len(ing.refused)
    finally:
        ing.close()
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage() or "skipping" in r.getMessage()]
    assert not failed, failed  # a pass that failed, or a stream set aside: a file that stopped the others
    return refused


def stored(index: Path, run_dir: Path) -> tuple[set, int]:
    """The (rank, attempt, step) rows and the error-row count of the run in ``run_dir`` (its manifest may
    name it otherwise)."""
    conn = sqlite3.connect(index)
    try:
        (run_id,) = conn.execute("SELECT run_id FROM runs WHERE dir = ?", (str(run_dir.resolve()),)).fetchone()
        steps = set(conn.execute("SELECT rank, attempt, step FROM steps WHERE run_id = ?", (run_id,)).fetchall())
        (errors,) = conn.execute("SELECT count(*) FROM errors WHERE run_id = ?", (run_id,)).fetchone()
        return steps, errors
    finally:
        conn.close()


CLEAN = [line for line in LINES if b'"kind":"step"' in line][:5]
CLEAN_STEPS = {(d["rank"], d["attempt"], d["step"]) for d in map(json.loads, CLEAN)}
