"""The canonical learning curve: any length of history, eval updates, atomic replacement."""

from __future__ import annotations

import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest

from traceml_tui.core import records
from traceml_tui.core.rundir import RunDir
from traceml_tui.hygiene import backlog
from traceml_tui.hygiene.checkpoints import publish_checkpoint
from traceml_tui.hygiene.curve import load_curve_data, render_learning_curve

from support.cli import run_main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _write_steps(run_dir: Path, steps, *, attempt: int = 0, partial_tail: bool = False) -> None:
    path = RunDir(run_dir).steps_file(0, attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [records.encode(records.Header(v=1, run="curve-test", rank=0, attempt=attempt, uuid=f"u{attempt}", ts=0.0))]
    for step in steps:
        value = 2.0 / (1.0 + step / 100.0)
        lines.append(records.encode(records.Step(
            v=1, run="curve-test", rank=0, attempt=attempt, step=step, ts=float(step), loss=value * 4.0,
            examples=step * 16,
            components={"mse": records.Component(value=value * 4.0, weight=1.0, weighted=value * 4.0, target_ms=4.0, ratio=value)},
            metrics={"r2": 1.0 - value},
        )))
    data = b"".join(lines)
    if partial_tail:
        data += b'{"v":1,"kind":"step","run":"curve-test","ra'  # a writer mid-line: must be ignored
    path.write_bytes(data)


def _assert_valid_png(data: bytes) -> None:
    """Full structural check: signature, every chunk's CRC, IHDR first, IEND last."""
    assert data[:8] == PNG_SIGNATURE
    pos, kinds = 8, []
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        crc = int.from_bytes(data[pos + 8 + length:pos + 12 + length], "big")
        assert len(body) == length and zlib.crc32(kind + body) == crc, "truncated or corrupt chunk"
        kinds.append(kind)
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND"


@pytest.mark.parametrize("n", [0, 1, 10_000])
def test_renders_for_0_1_and_10000_updates(tmp_path, n):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if n:
        _write_steps(run_dir, range(1, n + 1), partial_tail=True)
    path = render_learning_curve(run_dir)
    assert path == run_dir / "learning_curve.png"
    _assert_valid_png(path.read_bytes())
    data = load_curve_data(run_dir)
    assert data.updates == n
    if n:
        assert len(data.attempts[0].ratios["mse"]) == n  # the half-written tail line was not read
    assert sorted(p.name for p in run_dir.iterdir() if p.is_file()) == ["learning_curve.png"]  # no temp files left


def test_curve_changes_when_a_validation_completes_and_is_replaced_atomically(tmp_path):
    run_dir = tmp_path / "run"
    _write_steps(run_dir, range(1, 401))
    weights = run_dir / "w.bin"
    weights.write_bytes(b"w")
    ckpts = [publish_checkpoint(run_dir, weights, step=s, config_digest="d") for s in (100, 200, 300)]
    backlog.write_receipt(run_dir, backlog.read_json(RunDir(run_dir).request(ckpts[0])), {"r2": 0.3})
    path = render_learning_curve(run_dir)
    before = path.read_bytes()
    data = load_curve_data(run_dir)
    assert [e["checkpoint"] for e in data.evals] == [ckpts[0]]
    assert [(u["checkpoint"], u["state"]) for u in data.unfinished] == [(ckpts[1], "pending"), (ckpts[2], "pending")]

    seen: set[bytes] = set()  # every distinct file a reader saw; each is checked once
    reads = 0
    stop = threading.Event()

    def poll() -> None:
        nonlocal reads
        while not stop.is_set():
            seen.add(path.read_bytes())
            reads += 1

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        backlog.write_receipt(run_dir, backlog.read_json(RunDir(run_dir).request(ckpts[1])), {"r2": 0.6})
        for _ in range(3):
            render_learning_curve(run_dir)
    finally:
        stop.set()
        reader.join()
    after = path.read_bytes()
    assert after != before
    assert reads > 3
    for blob in seen:
        _assert_valid_png(blob)
    assert [e["checkpoint"] for e in load_curve_data(run_dir).evals] == ckpts[:2]


def test_resumed_attempts_stay_separate_series_and_eval_records_count(tmp_path):
    run_dir = tmp_path / "run"
    _write_steps(run_dir, range(1, 151), attempt=0)
    _write_steps(run_dir, range(101, 201), attempt=1)  # resumed from update 100: overlaps, not joined
    path = RunDir(run_dir).steps_file(0, 1)
    with open(path, "ab") as handle:
        handle.write(records.encode(records.Eval(v=1, run="curve-test", rank=0, attempt=1, step=150, ts=1.0,
                                                 checkpoint="inline-150", metrics={"r2": 0.4})))
        handle.write(records.encode(records.Eval(v=1, run="curve-test", rank=0, attempt=1, step=200, ts=2.0,
                                                 checkpoint="inline-200", status="pending")))
    data = load_curve_data(run_dir)
    assert [(a.attempt, a.steps[0], a.steps[-1]) for a in data.attempts] == [(0, 1, 150), (1, 101, 200)]
    assert [e["checkpoint"] for e in data.evals] == ["inline-150"]
    assert [u["checkpoint"] for u in data.unfinished] == ["inline-200"]
    _assert_valid_png(render_learning_curve(run_dir).read_bytes())


def test_curve_cli(tmp_path):
    run_dir = tmp_path / "run"
    _write_steps(run_dir, range(1, 11))
    out = tmp_path / "other.png"
    ok = subprocess.run([sys.executable, "-m", "traceml_tui", "curve", str(run_dir), "--out", str(out)],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip() == str(out)
    _assert_valid_png(out.read_bytes())
    bad = subprocess.run([sys.executable, "-m", "traceml_tui", "curve", str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == f"traceml curve: run directory {tmp_path / 'missing'} does not exist"


@pytest.mark.parametrize("case", ["out-is-the-summary", "out-is-a-folder", "not-a-run", "a-file"])
def test_curve_cli_never_writes_where_it_should_not(tmp_path, case):
    """A mistyped --out (the run's summary, a folder) or a folder that is no run is one line, exit 2, and every
    file stays as it was: the curve replaces its target atomically, so a wrong target would be lost."""
    run_dir = tmp_path / "run"
    _write_steps(run_dir, range(1, 11))
    summary = run_dir / "final_summary.json"
    summary.write_text('{"schema_version": 1.9}')
    (tmp_path / "empty").mkdir()
    target, out = {"out-is-the-summary": (run_dir, summary), "out-is-a-folder": (run_dir, tmp_path / "empty"),
                   "not-a-run": (tmp_path / "empty", None), "a-file": (summary, None)}[case]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    # in-process (support/cli.py); test_curve_cli runs the entry point itself
    proc = run_main(["curve", str(target), *(["--out", str(out)] if out else [])])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_importing_hygiene_stays_cheap():
    code = ("import sys, traceml_tui.hygiene, traceml_tui.hygiene.curve, traceml_tui.hygiene.drain; "
            "print(sorted(m for m in ('torch', 'matplotlib', 'textual') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]"
