"""Step time in the index: one definition, ``traceml_tui.core.steptime`` (docs/daemon.md, "Step time").

* ``steps`` stores the loader waits (``data_wait_ms``, ``data_in_step_ms``);
* the ``step_ms`` / ``gpu_step_ms`` series hold the step time (gap + traced
  step), computed with numpy and equal to ``steptime.split_step(...).whole``
  on every row (a seeded property test: nulls, negative and non-finite values,
  first steps, phases longer than their envelope);
* ``rank_live.step_parts`` is ``steptime.average_parts`` over the window's
  steps, and ``median_step_ms`` the median step time over the same steps;
* an index written before these columns existed is upgraded in place;
* on real runs through ``traceml run`` (the DDP demo, and a DataLoader run) the
  parts sum to the whole on every rank and match ``final_summary.json``.
"""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from daemon import index as idx
from daemon import live
from daemon.reader import IndexVersionError, Reader
from daemon.service import Ingester
from traceml_tui.core import records, steptime

from support.daemon_files import US_ROUNDING, append_raw, header_line, make_v2_index, rows_match, steps_path
from support.daemon_files import index_rows as _rows

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- generated timings


def _value(rng: random.Random, scale: float, odd: bool = True):
    """A timing as writers (and broken ones) produce it; ``odd`` adds NaN and ±inf (never in a JSON file)."""
    roll = rng.random()
    if roll < 0.15:
        return None
    if roll < 0.2:
        return rng.choice([-rng.random() * scale, 0.0, -0.0, *((math.nan, math.inf, -math.inf) if odd else ())])
    if roll < 0.25:
        return scale * rng.uniform(1, 50)  # far beyond its envelope (clock jitter, overlapping events)
    return rng.expovariate(1.0 / scale)


def _timings(rng: random.Random, odd: bool = True) -> dict:
    """traced, gap (None a fifth of the time: an attempt's first step), and the phases."""
    traced = rng.choice([None, 0.0, rng.expovariate(1 / 20.0), rng.uniform(1, 1e4), _value(rng, 30.0, odd)])
    return {"traced": traced, "input_wait": None if rng.random() < 0.2 else _value(rng, 50.0, odd),
            "data_wait": _value(rng, 60.0, odd), "data_in_step": _value(rng, 1.0, odd), "h2d": _value(rng, 2.0, odd),
            "forward": _value(rng, 5.0, odd), "backward": _value(rng, 10.0, odd),
            "optimizer": _value(rng, 1.0, odd)}


def _arr(values) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=np.float64)


def _same(a: float, b) -> bool:
    """``a`` (numpy, NaN = missing) is exactly ``b`` (the core, None = missing)."""
    return math.isnan(a) if b is None else a == b


def test_whole_step_ms_is_the_cores_whole_on_every_row() -> None:
    rng = random.Random(20240611)
    rows = [_timings(rng) for _ in range(20_000)]
    whole = live.whole_step_ms(_arr(r["traced"] for r in rows), _arr(r["input_wait"] for r in rows))
    gap = live.gap_ms(_arr(r["input_wait"] for r in rows))
    kinds = set()
    for r, w, g in zip(rows, whole.tolist(), gap.tolist()):
        parts = steptime.split_step(r["traced"], r["input_wait"], data_wait=r["data_wait"],
                                    data_in_step=r["data_in_step"], h2d=r["h2d"], forward=r["forward"],
                                    backward=r["backward"], optimizer=r["optimizer"])
        assert _same(w, None if parts is None else parts.whole), (r, w, parts)
        if parts is not None:
            assert math.isnan(g) if not parts.gap_known else math.isclose(g, parts.input_wait, rel_tol=1e-12,
                                                                          abs_tol=1e-9)
            kinds.add("first" if not parts.gap_known else "gap")
            if sum(x or 0.0 for x in (r["data_in_step"], r["h2d"], r["forward"], r["backward"], r["optimizer"])
                   if x is not None and math.isfinite(x) and x > 0) > parts.traced:
                kinds.add("over-long")
        else:
            kinds.add("no traced")
    assert kinds == {"first", "gap", "over-long", "no traced"}


def _step(rng: random.Random, rank: int, step: int, attempt: int = 0, gpu: bool = False) -> records.Step:
    t = _timings(rng, odd=False)
    cpu = records.Phases(step=t["traced"], input_wait=None if step == 1 else t["input_wait"], h2d=t["h2d"],
                         forward=t["forward"], backward=t["backward"], optimizer=t["optimizer"],
                         data_wait=t["data_wait"], data_in_step=t["data_in_step"])
    g = None
    if gpu:
        g = records.Phases(step=rng.expovariate(1 / 25.0), input_wait=None if step == 1 else _value(rng, 40, False),
                           h2d=_value(rng, 2.0, False), forward=_value(rng, 6.0, False),
                           backward=_value(rng, 9.0, False), optimizer=_value(rng, 1.0, False),
                           data_wait=cpu.data_wait, data_in_step=cpu.data_in_step)
    return records.Step(v=1, run="r", rank=rank, attempt=attempt, step=step, ts=1000.0 + step, cpu_ms=cpu,
                        gpu_ms=g, loss=1.0 / step, examples=8 * step)


def test_series_values_hold_the_step_time_on_each_clock() -> None:
    rng = random.Random(7)
    steps = [_step(rng, 0, s, gpu=rng.random() < 0.7) for s in range(1, 3001)]
    rows, _ = live.step_rows(steps)
    _, values = live.series_values(rows)
    for s, row in zip(steps, values.tolist()):
        cpu, gpu = steptime.step_parts(s.cpu_ms), steptime.step_parts(s.gpu_ms)
        assert _same(row[0], None if cpu is None else cpu.whole)
        assert _same(row[2], None if gpu is None else gpu.whole)
        wait = s.cpu_ms.input_wait  # the gap as the step time counts it, with or without a traced time
        assert _same(row[1], None if wait is None else max(wait, 0.0))
        if cpu is not None and cpu.gap_known:
            assert math.isclose(row[1], cpu.input_wait, abs_tol=1e-9)


def _expected_parts(steps: list[records.Step]) -> dict:
    """What rank_live.step_parts must say for these window steps (oldest first), from the core alone."""
    gpu = all(s.gpu_ms is not None and s.gpu_ms.step is not None for s in steps)
    avg = steptime.average_parts(steptime.step_parts(s.gpu_ms if gpu else s.cpu_ms) for s in steps)
    return {"whole": avg.whole, **avg.parts, "traced": avg.traced, "steps": avg.steps,
            "steps_without_gap": avg.steps_without_gap, "clock": "gpu" if gpu else "cpu"}


def _assert_parts_equal(got: dict, want: dict, abs_tol: float = 1e-12) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, float):
            assert math.isclose(got[key], value, rel_tol=1e-12, abs_tol=abs_tol), (key, got[key], value)
        else:
            assert got[key] == value, key


def test_rank_window_parts_are_the_cores_average_over_the_window_steps() -> None:
    rng = random.Random(11)
    for gpu_share in (0.0, 1.0, 0.97):
        window = live.RankWindow()
        steps = [_step(rng, 0, s, gpu=rng.random() < gpu_share) for s in range(1, 301)]
        kept: dict[int, records.Step] = {}
        for lo in range(0, 300, 37):  # batches, the last ones partly repeating older steps
            batch = steps[lo:lo + 37] + (steps[lo - 5:lo] if lo else [])
            rows, _ = live.step_rows(batch)
            window.add_rows(rows, len(rows))
            for s in batch:
                kept.setdefault(s.step, s)
            tail = [kept[k] for k in sorted(kept)][-live.WINDOW:]
            _assert_parts_equal(window.step_parts(), _expected_parts(tail))
            fig = window.figures()
            split = [steptime.step_parts(s.gpu_ms if window.clock() == "gpu" else s.cpu_ms) for s in tail]
            split = [p for p in split if p is not None]
            assert fig["median_step_ms"] == statistics.median(p.whole for p in split)
            assert fig["median_input_wait_ms"] == statistics.median(p.whole - p.traced for p in split)
            assert fig["median_step_ms"] >= fig["median_input_wait_ms"] >= 0.0


def test_a_window_fed_one_row_at_a_time_equals_one_fed_in_batches() -> None:
    """The live path folds one row per rank per pass (RankWindow.add_row): same window as batches."""
    rng = random.Random(12)
    steps = [_step(rng, 0, s, gpu=rng.random() < 0.5) for s in range(1, 121)]
    order = steps[:60] + steps[55:58] + [steps[10]] + steps[60:]  # a repeat and an older step on the way
    one, many = live.RankWindow(), live.RankWindow()
    for s in order:
        rows, _ = live.step_rows([s])
        one.add_columns(list(zip(*rows)), 1)
    for lo in range(0, len(order), 25):
        rows, _ = live.step_rows(order[lo:lo + 25])
        many.add_rows(rows, len(rows))
    assert (one.records, one.first_step, one.last_step, one.last_ts, one.loss) == (
        many.records, many.first_step, many.last_step, many.last_ts, many.loss)
    assert list(one.steps) == list(many.steps) and one.figures() == many.figures()


def _write_rank(run_dir: Path, rank: int, steps: list[records.Step], header: bool = True) -> None:
    path = steps_path(run_dir, rank)
    if header:
        append_raw(path, header_line(run_dir.name, rank))
    for s in steps:
        append_raw(path, records.encode(s))


def test_ingested_columns_rank_parts_and_series_survive_restarts(env) -> None:
    root, index, ingest = env
    rng = random.Random(3)
    run_dir = root / "r"
    by_rank = {rank: [_step(rng, rank, s, gpu=rank == 1) for s in range(1, 501)] for rank in (0, 1)}
    for rank, steps in by_rank.items():
        _write_rank(run_dir, rank, steps[:200])
    ingest()
    for rank, steps in by_rank.items():  # appended later: the window is reloaded from the index
        _write_rank(run_dir, rank, steps[200:210], header=False)
    ingest()
    for rank, steps in by_rank.items():
        _write_rank(run_dir, rank, steps[210:], header=False)
    ingest()
    stored = _rows(index, "SELECT rank, step, data_wait_ms, data_in_step_ms FROM steps ORDER BY rank, step")
    assert rows_match(stored, [(s.rank, s.step, s.cpu_ms.data_wait, s.cpu_ms.data_in_step)
                               for rank in (0, 1) for s in by_rank[rank]])  # stored in µs: rounding only
    with Reader(index) as r:
        run = r.find_run("r")
        rows = {k.rank: k for k in r.rank_rows(run.run_id)}
        for rank, steps in by_rank.items():
            tail = steps[-live.WINDOW:]
            # The window is read back from the index (timings in µs): a part sums or subtracts up to six stored
            # timings (the residual: traced minus five phases), each within rounding.
            _assert_parts_equal(rows[rank].step_parts, _expected_parts(tail), abs_tol=6 * US_ROUNDING)
            assert rows[rank].step_parts["clock"] == ("gpu" if rank == 1 else "cpu")
            series = r.series.points(run.run_id, rank, "step_ms")
            assert series.width == 1  # one step per bucket
            timed = [(s.step, steptime.step_parts(s.cpu_ms)) for s in steps]
            assert [(p.step_lo, p.vmin, p.vmax) for p in series.points] == [
                (step, parts.whole, parts.whole) for step, parts in timed if parts is not None]
            gpu_series = r.series.points(run.run_id, rank, "gpu_step_ms").points
            gpu = [(s.step, steptime.step_parts(s.gpu_ms)) for s in steps]
            assert [(p.step_lo, p.vmin) for p in gpu_series] == [(step, parts.whole) for step, parts in gpu
                                                                 if parts is not None]
            assert (len(gpu_series) > 400) == (rank == 1)


# --------------------------------------------------------------------------- an index written before these columns


def _drop_step_time_columns(index: Path) -> None:
    """Make ``index`` look written by version 2 before the step-time columns (the old figures' meaning)."""
    make_v2_index(index, lacking=("data_in_step_ms", "data_wait_ms"))
    conn = sqlite3.connect(index)
    try:
        conn.execute("ALTER TABLE rank_live DROP COLUMN step_parts")
        conn.execute("UPDATE rank_live SET median_step_ms = -1, median_input_wait_ms = -1")
        conn.execute("UPDATE series SET step_ms_min = -1, step_ms_max = -1, step_ms_sum = -1, gpu_step_ms_n = 99")
        conn.commit()
    finally:
        conn.close()


def _straggler(index: Path) -> tuple:
    """The run's slowest rank and straggler score as every surface shows them (the reader's figures, computed
    from each rank's median step time when read)."""
    with Reader(index) as r:
        fig = r.figures(r.find_run("r"))
        assert fig.straggler_score is not None
        return fig.slowest_rank, fig.straggler_score


@pytest.mark.skipif(sqlite3.sqlite_version_info < (3, 35), reason="DROP COLUMN needs SQLite 3.35")
def test_a_version_2_index_without_the_step_time_columns_is_upgraded(env, tmp_path: Path) -> None:
    root, index, ingest = env
    rng = random.Random(5)
    steps = {}
    for rank in (0, 1, 2):
        steps[rank] = [_step(rng, rank, s, gpu=rank == 2) for s in range(1, 2001)]
        for s in steps[rank]:  # loader waits are lost with the old index's rows: compare without them
            for phases in (s.cpu_ms, s.gpu_ms):
                if phases is not None:
                    phases.data_wait = phases.data_in_step = None
        _write_rank(root / "r", rank, steps[rank])
    ingest()
    table = ("SELECT run_id, rank, attempt, median_step_ms, median_input_wait_ms, step_parts, last_seen"
             " FROM rank_live ORDER BY rank")
    want_live = _rows(index, table)
    want_series = _rows(index, "SELECT * FROM series ORDER BY run_id, rank, bucket")
    want_runs = _straggler(index)
    _drop_step_time_columns(index)
    assert _rows(index, "SELECT value FROM meta WHERE key = 'schema_version'") == [("2",)]
    with pytest.raises(IndexVersionError, match=r"schema version 2.*traceml daemon ROOT --once"):
        Reader(index)

    ingest()  # the writer adds the columns and recomputes the figures from the stored rows
    assert _rows(index, "SELECT value FROM meta WHERE key = 'schema_version'") == [(str(idx.SCHEMA_VERSION),)]
    assert _rows(index, "SELECT value FROM meta WHERE key = 'rederive'") == []
    assert idx.missing_columns(sqlite3.connect(index)) == []
    got_live = _rows(index, table)
    for got, want in zip(got_live, want_live, strict=True):
        assert got[:3] == want[:3] and got[6] == want[6]  # last_seen kept: an upgrade is no sign of life
        # Recomputed from the stored rows, timings in µs: a step time is two stored timings (gap + traced), a part
        # up to six (the residual), each within rounding.
        assert got[3] == pytest.approx(want[3], abs=2 * US_ROUNDING)
        assert got[4] == pytest.approx(want[4], abs=US_ROUNDING)
        _assert_parts_equal(json.loads(got[5]), json.loads(want[5]), abs_tol=6 * US_ROUNDING)
    got_series = _rows(index, "SELECT * FROM series ORDER BY run_id, rank, bucket")
    assert len(got_series) == len(want_series)
    width = _rows(index, "SELECT max(width) FROM series_width")[0][0]
    for got, want in zip(got_series, want_series):  # sums may be added in another order: approx
        assert [g is None for g in got] == [w is None for w in want]
        # Refolded from the stored rows: a step time within 2 roundings, a bucket's sum within 2 per step in it.
        assert [g for g in got if g is not None] == pytest.approx([w for w in want if w is not None], rel=1e-12,
                                                                  abs=2 * US_ROUNDING * width)
    slowest, score = _straggler(index)
    # The score is a ratio of two medians (≥ 30 ms here), each within 2 roundings: 1e-4 relative bounds it.
    assert slowest == want_runs[0] and score == pytest.approx(want_runs[1], rel=1e-4)
    with Reader(index) as r:
        assert all(k.step_parts is not None for k in r.rank_rows(r.find_run("r").run_id))
    # New records after the upgrade store their loader waits.
    more = _step(rng, 0, 2001)
    more.cpu_ms.data_wait, more.cpu_ms.data_in_step = 4.5, 0.25
    _write_rank(root / "r", 0, [more], header=False)
    ingest()
    assert _rows(index, "SELECT data_wait_ms, data_in_step_ms FROM steps WHERE rank = 0 AND step = 2001") == [
        (4.5, 0.25)]


# --------------------------------------------------------------------------- real runs


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEML_", "TORCHELASTIC_", "PET_"))}
    return dict(env, OMP_NUM_THREADS="1", XDG_STATE_HOME=str(tmp_path / "state"))


def _launch(tmp_path: Path, name: str, script: Path, *extra: str) -> Path:
    proc = subprocess.run([sys.executable, "-m", "traceml_tui", "run", str(script), "--run-name", name,
                           "--logs-dir", str(tmp_path / "logs"), *extra], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path / "logs" / name


def _records(run_dir: Path) -> dict[int, list[records.Step]]:
    out: dict[int, list[records.Step]] = {}
    for path in sorted(run_dir.glob("ranks/rank_*/steps-*.jsonl")):
        for rec in map(records.decode, path.read_bytes().splitlines()):
            if isinstance(rec, records.Step):
                out.setdefault(rec.rank, []).append(rec)
    return out


def _assert_index_matches_the_summary(tmp_path: Path, run_dir: Path) -> dict:
    index = tmp_path / "index.sqlite"
    ing = Ingester(index, [str(run_dir.parent)], use_inotify=False)
    try:
        ing.run_once()
    finally:
        ing.close()
    by_rank = _records(run_dir)
    summary = json.loads((run_dir / "final_summary.json").read_text())
    section = summary["step_time"]
    window = section["global"]["window"]
    assert window["diagnosis_clock"] == "cpu"
    with Reader(index) as r:
        run = r.find_run(run_dir.name)
        rows = r.rank_rows(run.run_id)
        assert sorted(k.rank for k in rows) == sorted(by_rank)
        for k in rows:
            steps = by_rank[k.rank]
            parts = k.step_parts
            # every part ≥ 0 and the parts sum to the whole (docs/run.md, "Step time and its parts")
            present = [parts[name] for name in steptime.PART_NAMES if parts[name] is not None]
            assert all(v >= 0.0 for v in present), parts
            assert math.isclose(sum(present), parts["whole"], rel_tol=0.01), parts
            assert math.isclose(sum(present), parts["whole"], rel_tol=1e-9), parts
            # like for like: both windows are every step of this short run
            assert parts["steps"] == len(steps) == window["steps_analyzed"] <= live.WINDOW
            metrics = section["groups"]["rows"][str(k.rank)]["metrics"]
            assert parts["whole"] == pytest.approx(metrics["step_time_ms"], rel=1e-9)
            for name in steptime.PART_NAMES:
                want = metrics[steptime.metric_name(name)]
                assert (parts[name] is None) if want is None else parts[name] == pytest.approx(want, rel=1e-9,
                                                                                               abs=1e-9), name
            assert k.median_step_ms == pytest.approx(
                float(np.median([steptime.step_parts(s.cpu_ms).whole for s in steps])))
            assert k.median_step_ms >= k.median_input_wait_ms >= 0.0
            # the series: the step time of every record
            series = r.series.points(run.run_id, k.rank, "step_ms").points
            assert [(p.step_lo, p.vmin, p.vmax) for p in series] == [
                (s.step, steptime.step_parts(s.cpu_ms).whole, steptime.step_parts(s.cpu_ms).whole) for s in steps]
        stored = _rows(index, "SELECT rank, step, data_wait_ms, data_in_step_ms FROM steps ORDER BY rank, step")
        assert rows_match(stored, [(s.rank, s.step, s.cpu_ms.data_wait, s.cpu_ms.data_in_step)
                                   for rank in sorted(by_rank) for s in by_rank[rank]])  # stored in µs: rounding only
    return summary


@pytest.mark.slow
def test_ddp_demo_rank_parts_sum_to_the_step_time_and_match_the_summary(tmp_path: Path) -> None:
    run_dir = _launch(tmp_path, "ddp", REPO / "examples" / "distributed" / "ddp_minimal.py",
                      "--nproc-per-node", "2", "--args", "--steps", "20")
    _assert_index_matches_the_summary(tmp_path, run_dir)


LOADER = """
import time
import torch
from torch.utils.data import DataLoader, Dataset
import traceml_tui as traceml
class Slow(Dataset):
    def __len__(self): return 48
    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.randn(8)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for batch in DataLoader(Slow(), batch_size=4, num_workers=0):
    with traceml.trace_step(model):
        loss = model(batch).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        traceml.log(loss=loss)
"""


@pytest.mark.slow
def test_dataloader_run_stores_the_loader_waits_and_its_data_wait_part(tmp_path: Path) -> None:
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    run_dir = _launch(tmp_path, "loader", script)
    summary = _assert_index_matches_the_summary(tmp_path, run_dir)
    assert summary["step_time"]["groups"]["rows"]["0"]["metrics"]["data_wait_ms"] > 20.0
