"""Live ingest under load: the daemon's CPU and the append → visible lag while many ranks write.

Run: python tests/benchmarks/bench_live_load.py [--seconds 20] [--only small,cluster,cluster_poll,busy,cluster100,idle]
     python tests/benchmarks/bench_live_load.py --in-process   (one live pass, in this process: CPU per record, at
                                                               20 × 64 × 1, 20 × 64 × 5 and 100 × 64 × 1)
     python tests/benchmarks/bench_live_load.py --phases       (where that pass's CPU goes, at 20 × 64 and 100 × 64)
     python tests/benchmarks/bench_live_load.py --instructions (the in-process pass under valgrind's callgrind:
                                                               instructions per record, which the load does not move)

A live ``traceml daemon`` (its own process) watches R runs × K ranks while writer processes append
real-shaped step records to every stream at a fixed rate. Reported per load:

* the daemon's CPU over the measured window, from ``psutil`` (user + system, % of one core);
* the lag from an append to its record being visible through ``daemon.reader.Reader``, measured on a
  probe stream (one more run, appended at random moments by this process), p50 / p99;
* the baseline, measured in this same run: the cold-ingest cost per record (``Ingester.run_once`` over a
  dataset of the same record shape), and the CPU the load would cost at that price (records/s × cost);
* the largest size of the index's WAL file seen during the window (docs/daemon.md, "Live path": the WAL
  stays bounded);
* what the writers really appended per second, what the index gained per second over the window (less:
  the daemon fell behind), and the share of the window the daemon's threads spent runnable but waiting for
  a core (``/proc/<pid>/schedstat``): little CPU with a large wait is a machine too busy, not an idle daemon.

The issue's targets (docs/daemon.md, "Live path"): 20 × 64 × 1 step/s ≤ 5 % of a core (inotify and
polling); 20 × 64 × 10 steps/s ≤ 30 % with lag p99 < 1 s; 100 × 64 × 1 step/s (``cluster100``) ≤ 25 % with
p99 < 2 s; 100 quiet runs < 2 %. The machine may be shared: figures are noisy, and the baseline is
re-measured each run for that reason.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from bench_daemon import _daemon, _stop, running_manifest  # noqa: E402

from daemon.reader import Reader  # noqa: E402
from daemon.service import Ingester  # noqa: E402
from traceml_tui.core import records  # noqa: E402
from traceml_tui.core.atomic import append_line, open_append  # noqa: E402

WRITERS = 4  # writer processes; each owns a slice of the streams


def _step(run: str, rank: int, step: int, ts: float, rng: random.Random) -> bytes:
    ms = 100 + rng.random() * 10
    return records.encode(records.Step(
        v=1, run=run, rank=rank, attempt=0, step=step, ts=ts,
        cpu_ms=records.Phases(step=ms, input_wait=ms * 0.05, forward=ms * 0.3, backward=ms * 0.5,
                              optimizer=ms * 0.1),
        loss=2.0 / (1 + step * 0.01), lr=1e-3, grad_norm=1.0 + rng.random(), examples=64 * step,
        mem=records.Memory(rss=2_000_000_000),
        components={"mse": records.Component(value=0.5, target_ms=1.0, ratio=0.5)}))


def _stream(root: Path, run: str, rank: int) -> Path:
    return root / run / "ranks" / f"rank_{rank}" / "steps-0.jsonl"


def make_runs(root: Path, runs: int, ranks: int, steps: int = 10, prefix: str = "run") -> list[tuple[str, int]]:
    """``runs`` × ``ranks`` streams holding a header and ``steps`` steps each; returns (run, rank) pairs."""
    rng = random.Random(0)
    out = []
    for i in range(runs):
        run = f"{prefix}{i:03d}"
        for rank in range(ranks):
            path = _stream(root, run, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = [records.encode(records.Header(v=1, run=run, rank=rank, attempt=0, uuid=f"{run}-{rank}", ts=0.0))]
            lines += [_step(run, rank, s, 1000.0 + s, rng) for s in range(1, steps + 1)]
            path.write_bytes(b"".join(lines))
            out.append((run, rank))
        (root / run / "manifest.json").write_bytes(running_manifest(run, ranks))
    return out


def _writer(root: str, streams: list, rate: float, first_step: int, stop_at: float, ready, written=None) -> None:
    """Append one step to each of ``streams`` every 1/rate s until ``stop_at`` (time.time()); ``written`` (a
    shared counter) counts the records appended, so the load reports the rate it really wrote."""
    rng = random.Random(os.getpid())
    fds = [(run, rank, open_append(_stream(Path(root), run, rank))) for run, rank in streams]
    ready.set()
    step = first_step
    period = 1.0 / rate
    nxt = time.time() + rng.random() * period  # writers out of phase, like real ranks
    while nxt < stop_at:
        delay = nxt - time.time()
        if delay > 0:
            time.sleep(delay)
        # Spread the tick's appends over the period, as independent ranks would.
        gap = period / max(1, len(fds)) * 0.8
        for run, rank, fd in fds:
            append_line(fd, _step(run, rank, step, time.time(), rng))
            if gap > 0.0005:
                time.sleep(gap)
        if written is not None:
            with written.get_lock():
                written.value += len(fds)
        step += 1
        nxt += period
    for *_, fd in fds:
        os.close(fd)


def _wait_indexed(index: Path, total: int, timeout: float = 300.0) -> None:
    """Until the index holds ``total`` step records (the first scan of the backlog is done)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        time.sleep(0.5)
        try:
            with Reader(index) as r:
                if sum(run.records for run in r.list_runs()) >= total:
                    return
        except Exception:
            pass
    raise SystemExit(f"the daemon did not index {total} records within {timeout:.0f} s")


def cold_cost(tmp: Path, total: int = 100_000) -> float:
    """Seconds of CPU per record of a cold ``run_once`` over ``total`` records of the same shape."""
    root = tmp / "cold"
    per = total // 64
    rng = random.Random(1)
    for f in range(64):
        run, rank = f"c{f // 8}", f % 8
        path = _stream(root, run, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [records.encode(records.Header(v=1, run=run, rank=rank, attempt=0, uuid=f"{run}-{rank}", ts=0.0))]
        lines += [_step(run, rank, s, 1000.0 + s, rng) for s in range(1, per + 1)]
        path.write_bytes(b"".join(lines))
    ing = Ingester(tmp / "cold.sqlite", [str(root)], use_inotify=False)
    p = psutil.Process()
    c0 = sum(p.cpu_times()[:2])
    got = ing.run_once()
    used = sum(p.cpu_times()[:2]) - c0
    ing.close()
    return used / max(1, got)


#: Set in this benchmark's own process when ``--instructions`` runs it under callgrind.
CALLGRIND_ENV = "TRACEML_BENCH_CALLGRIND"


def in_process_cost(tmp: Path, lines: int, seconds_per_pass: float, passes: int = 20, runs: int = 20) -> float:
    """CPU seconds per record of one live pass without the writers' noise: one ``Ingester`` in this process
    over ``runs`` runs × 64 ranks with the live daemon's settings (``live_settings``) on a simulated clock
    ``seconds_per_pass`` apart; each pass appends ``lines`` lines to every stream, then reads them all
    (``poll``) and commits (``commit_pass``). Only the pass is timed (its merges included).

    Under callgrind (``--instructions``) the counters are switched on before the first timed pass and dumped
    (``os.getppid``: callgrind runs with ``--dump-before=getppid``) before and after each one, so that every
    second dump holds one pass alone, without the appends."""
    counted = bool(os.environ.get(CALLGRIND_ENV))
    root = tmp / f"inproc{runs}x{lines}"
    streams = make_runs(root, runs, 64)
    ing = Ingester(tmp / f"inproc{runs}x{lines}.sqlite", [str(root)], use_inotify=False)
    try:
        ing.run_once()
        ing.live_settings()
        clock = [time.monotonic()]
        ing.store.agg.tick = lambda: clock[0]
        if hasattr(ing.store, "live"):  # merges of the live table on the same simulated clock
            ing.store.live.tick = lambda: clock[0]
        fds = [(run, rank, open_append(_stream(root, run, rank))) for run, rank in streams]
        targets = ing.plan.everything()
        rng = random.Random(3)
        step = 11
        used = 0.0
        for i in range(passes + 5):  # the first 5 warm the windows and caches
            for _ in range(lines):
                for run, rank, fd in fds:
                    append_line(fd, _step(run, rank, step, 2000.0 + step, rng))
                step += 1
            clock[0] += seconds_per_pass
            if counted and i == 5:
                subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], capture_output=True, check=False)
            if counted and i >= 5:
                os.getppid()  # a dump: what ran since the last one (the appends)
            t0 = time.process_time()
            ing.poll(targets)
            ing.commit_pass()
            if i >= 5:
                used += time.process_time() - t0
                if counted:
                    os.getppid()  # a dump: this pass alone
        for *_, fd in fds:
            os.close(fd)
        return used / (passes * lines * len(fds))
    finally:
        ing.close()
        shutil.rmtree(root, ignore_errors=True)


#: What ``--phases`` times inside a live pass: (label, module, class or None, function name). A phase's CPU
#: includes the phases listed under it (indented).
PHASES = (
    ("stat of the streams (Streams.changed)", "daemon.stream", "Streams", "changed"),
    ("reading the streams (Ingester._read_stream)", "daemon.service", "Ingester", "_read_stream"),
    ("  the live case in one step (Streams.quick_append)", "daemon.stream", "Streams", "quick_append"),
    ("  descriptor (Streams.open)", "daemon.stream", "Streams", "open"),
    ("  identity (Streams.identity: the header re-read)", "daemon.stream", "Streams", "identity"),
    ("  tail check, new bytes, cursor (Streams.advance)", "daemon.stream", "Streams", "advance"),
    ("decode and route the appends (Ingester._flush_deferred)", "daemon.service", "Ingester", "_flush_deferred"),
    ("  on columns (columns.route_pass)", "daemon.columns", None, "route_pass"),
    ("    decode together (decode.steps_of_blocks)", "daemon.decode", None, "steps_of_blocks"),
    ("    rows (live.row_tuples)", "daemon.live", None, "row_tuples"),
    ("    live table (LiveTable.add)", "daemon.live_table", "LiveTable", "add"),
    ("    rank windows (RankWindow.add_row)", "daemon.live", "RankWindow", "add_row"),
    ("  block by block (decode.prepare_blocks)", "daemon.decode", None, "prepare_blocks"),
    ("  block by block (Store.route)", "daemon.store", "Store", "route"),
    ("the pass's end before COMMIT (Store.finish)", "daemon.store", "Store", "finish"),
    ("  the new live steps' INSERT (LiveTable.flush)", "daemon.live_table", "LiveTable", "flush"),
    ("  rank_live (write_rank_live_many)", "daemon.aggregates", "Aggregates", "write_rank_live_many"),
    ("    rolling figures on arrays (figures.figures_many)", "daemon.figures", None, "figures_many"),
    ("    rolling figures one window at a time (RankWindow.figures)", "daemon.live", "RankWindow", "figures"),
    ("    rates (RankWindow.rates)", "daemon.live", "RankWindow", "rates"),
    ("  run rollups (write_run_rollup)", "daemon.aggregates", "Aggregates", "write_run_rollup"),
    ("the merge (Ingester.merge_live)", "daemon.service", "Ingester", "merge_live"),
    ("  rows moved (LiveTable.move, its fold included)", "daemon.live_table", "LiveTable", "move"),
    ("  its series fold (write_series_many)", "daemon.aggregates", "Aggregates", "write_series_many"),
)


def phases_cost(tmp: Path, runs: int, ranks: int, passes: int = 15) -> list[tuple[str, float]]:
    """Where a live pass's CPU goes: ``in_process_cost``'s pass (one line per stream, 1 s apart) over ``runs`` ×
    ``ranks`` streams with each phase of :data:`PHASES` timed (``time.process_time`` around the call; a
    phase absent from the code is skipped). Returns (label, µs of CPU per record), the whole pass first."""
    import functools
    import importlib

    spent: dict[str, float] = {}
    timing = [False]
    undo = []
    for label, module, cls, name in PHASES:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        owner = getattr(mod, cls) if cls else mod
        real = getattr(owner, name, None)
        if real is None:
            continue

        def timed(*a, _real=real, _label=label, **kw):
            if not timing[0]:
                return _real(*a, **kw)
            t0 = time.process_time()
            try:
                return _real(*a, **kw)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.process_time() - t0

        setattr(owner, name, functools.wraps(real)(timed))
        undo.append((owner, name, real))
    try:
        root = tmp / f"phases{runs}"
        streams = make_runs(root, runs, ranks)
        ing = Ingester(tmp / f"phases{runs}.sqlite", [str(root)], use_inotify=False)
        try:
            ing.run_once()
            ing.live_settings()
            clock = [time.monotonic()]
            ing.store.agg.tick = lambda: clock[0]
            ing.store.live.tick = lambda: clock[0]
            fds = [(run, rank, open_append(_stream(root, run, rank))) for run, rank in streams]
            targets = ing.plan.everything()
            rng = random.Random(3)
            whole = 0.0
            for i in range(passes + 5):
                for run, rank, fd in fds:
                    append_line(fd, _step(run, rank, 11 + i, 2011.0 + i, rng))
                clock[0] += 1.0
                timing[0] = i >= 5
                t0 = time.process_time()
                ing.poll(targets)
                ing.commit_pass()
                if timing[0]:
                    whole += time.process_time() - t0
                timing[0] = False
            for *_, fd in fds:
                os.close(fd)
        finally:
            ing.close()
            shutil.rmtree(root, ignore_errors=True)
    finally:
        for owner, name, real in undo:
            setattr(owner, name, real)
    n = passes * len(streams)
    return [("the whole pass", whole / n * 1e6)] + [(label, spent[label] / n * 1e6) for label, *_ in PHASES
                                                     if label in spent]


def instructions(runs: int, lines: int, gap: float, passes: int = 15) -> float:
    """Instructions per record of :func:`in_process_cost`'s pass (``passes`` counted after 5 warm ones, their
    merges included), run in a child process under valgrind's callgrind (``PYTHONHASHSEED=0``): the method of
    docs/daemon.md, "Live path" (ninth and tenth rounds)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (callgrind) on PATH")
    work = Path(tempfile.mkdtemp(prefix="bench_live_cg_"))
    try:
        env = dict(os.environ, **{CALLGRIND_ENV: "1", "PYTHONHASHSEED": "0"})
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-before=getppid",
               f"--callgrind-out-file={work}/cg.%p", sys.executable, os.path.abspath(__file__),
               "--one", f"{runs},{lines},{gap},{passes}"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-2000:])
        dumps = sorted(work.glob("cg.*.*"), key=lambda f: int(f.name.rsplit(".", 1)[1]))
        totals = [_total(d) for d in dumps]
        # dump 1: the appends of the first counted pass; then (the pass, the next appends) in turn
        per_pass = totals[1::2][:passes]
        if len(per_pass) != passes:
            raise SystemExit(f"callgrind left {len(dumps)} dumps, not the {2 * passes} expected")
        return sum(per_pass) / (passes * runs * 64 * lines)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _total(path: Path) -> int:
    with open(path) as handle:
        for line in handle:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise ValueError(f"no totals in {path}")


def _run_delay(pid: int) -> float:
    """Seconds ``pid``'s threads have waited, runnable, for a core (``/proc/<pid>/schedstat``; 0 elsewhere): a
    daemon behind its load with little CPU used is either idle (its own bug) or waiting here (the machine's)."""
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _records(index: Path) -> int:
    with Reader(index) as r:
        return sum(run.records for run in r.list_runs())


def load_row(tmp: Path, label: str, runs: int, ranks: int, rate: float, seconds: float, extra: list[str],
             cost: float) -> str:
    root = tmp / label
    streams = make_runs(root, runs, ranks)
    probe = _stream(root, "probe", 0)
    probe.parent.mkdir(parents=True, exist_ok=True)
    pfd = open_append(probe)
    append_line(pfd, records.encode(records.Header(v=1, run="probe", rank=0, attempt=0, uuid="p", ts=0.0)))
    index = tmp / f"{label}.sqlite"
    proc = _daemon(index, root, *extra)
    _wait_indexed(index, len(streams) * 10)
    writers = []
    settle = 3.0
    stop_at = time.time() + settle + seconds + 1.0
    ctx = mp.get_context("fork")
    written = ctx.Value("q", 0)
    if rate > 0:
        n = min(WRITERS, len(streams))
        for w in range(n):
            ready = ctx.Event()
            p = ctx.Process(target=_writer, args=(str(root), streams[w::n], rate, 11, stop_at, ready, written),
                            daemon=True)
            p.start()
            ready.wait(30)
            writers.append(p)
    time.sleep(settle)
    with Reader(index) as reader:
        probe_id = next(r.run_id for r in reader.list_runs() if os.path.basename(r.dir) == "probe")
        dp = psutil.Process(proc.pid)
        c0 = sum(dp.cpu_times()[:2])
        d0 = _run_delay(proc.pid)
        w0, i0 = written.value, _records(index)
        t_start = time.perf_counter()
        lat = []
        wal_max = 0  # the largest the index's WAL file was seen during the window (docs/daemon.md, "Live path")
        rng = random.Random(2)
        step = 0
        while time.perf_counter() - t_start < seconds:
            time.sleep(rng.uniform(0.05, 0.4))  # decorrelated from the poll phase
            step += 1
            t0 = time.perf_counter()
            append_line(pfd, _step("probe", 0, step, time.time(), rng))
            while True:
                s = reader.run(probe_id)
                if s is not None and s.last_step == step:
                    break
                if time.perf_counter() - t0 > 30:
                    break
                time.sleep(0.002)
            lat.append(time.perf_counter() - t0)
            try:
                wal_max = max(wal_max, os.path.getsize(f"{index}-wal"))
            except OSError:
                pass
        elapsed = time.perf_counter() - t_start
        used = sum(dp.cpu_times()[:2]) - c0
        waited = _run_delay(proc.pid) - d0
        wrote, stored = written.value - w0, _records(index) - i0 - step  # the probe's records apart
    for p in writers:
        p.join(timeout=30)
    _stop(proc)
    os.close(pfd)
    shutil.rmtree(root, ignore_errors=True)
    lat.sort()
    p50 = lat[len(lat) // 2] * 1000 if lat else float("nan")
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan")
    rec_s = runs * ranks * rate
    return (f"| {label} | {runs} × {ranks} × {rate:g}/s{' (' + ' '.join(extra) + ')' if extra else ''} | "
            f"{rec_s:,.0f} | {100 * used / elapsed:.1f} % | {100 * rec_s * cost:.1f} % | "
            f"p50 {p50:.0f} ms, p99 {p99:.0f} ms ({len(lat)}) | {wal_max / 2**20:.1f} MiB | "
            f"{wrote / elapsed:,.0f} | {stored / elapsed:,.0f} | {100 * waited / elapsed:.0f} % |")


ROWS = {
    "small": (5, 16, 10.0, []),
    "cluster": (20, 64, 1.0, []),
    "cluster_poll": (20, 64, 1.0, ["--no-inotify"]),
    "busy": (20, 64, 10.0, []),
    "cluster100": (100, 64, 1.0, []),
    "idle": (100, 4, 0.0, []),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per load (default 20)")
    ap.add_argument("--only", default=",".join(ROWS))
    ap.add_argument("--in-process", action="store_true",
                    help="instead: the CPU per record of one live pass in this process (no writers, no daemon)")
    ap.add_argument("--phases", action="store_true",
                    help="instead: where a live pass's CPU goes, per phase, at 20 × 64 and 100 × 64 streams")
    ap.add_argument("--instructions", action="store_true",
                    help="instead: instructions per record of the in-process pass under valgrind's callgrind, at "
                         "20 × 64 × 1 line per pass and 20 × 64 × 5 (slow: minutes per load)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # runs,lines,gap,passes: the child --instructions runs
    args = ap.parse_args()
    if args.instructions:
        print("| live pass (callgrind) | instructions per record |")
        print("|---|---|")
        for runs, lines, gap, label in ((20, 1, 1.0, "20 × 64 streams, 1 line per stream, passes 1 s apart"),
                                        (20, 5, 0.5, "20 × 64 streams, 5 lines per stream, passes 0.5 s apart")):
            print(f"| {label} | {instructions(runs, lines, gap) / 1e3:.1f} k |", flush=True)
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench_live_"))
    if args.one:
        runs, lines, gap, passes = args.one.split(",")
        try:
            in_process_cost(tmp, int(lines), float(gap), passes=int(passes), runs=int(runs))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    try:
        if args.phases:
            tables = [phases_cost(tmp, 20, 64), phases_cost(tmp, 100, 64)]
            print("| phase (µs of CPU per record, 1 line per stream, passes 1 s apart) | 20 × 64 | 100 × 64 |")
            print("|---|---|---|")
            big = dict(tables[1])
            for label, per in tables[0]:
                print(f"| {label} | {per:.1f} | {big.get(label, float('nan')):.1f} |")
            return
        cost = cold_cost(tmp)
        print(f"baseline (this run): cold ingest costs {cost * 1e6:.1f} µs of CPU per record (run_once, 100k records)")
        print()
        if args.in_process:
            print("| live pass | CPU per record | × cold |")
            print("|---|---|---|")
            for runs, lines, gap, label in (
                    (20, 1, 1.0, "20 × 64 streams, 1 line per stream, passes 1 s apart (the 1/s load)"),
                    (20, 5, 0.5, "20 × 64 streams, 5 lines per stream, passes 0.5 s apart (the 10/s load)"),
                    (100, 1, 1.0, "100 × 64 streams, 1 line per stream, passes 1 s apart")):
                per = in_process_cost(tmp, lines, gap, runs=runs)
                print(f"| {label} | {per * 1e6:.1f} µs | {per / cost:.1f} |", flush=True)
            return
        print("| load | runs × ranks × rate | records/s | daemon CPU | at cold cost | append → visible (probe) "
              "| WAL max | written/s | stored/s | daemon waiting for a core |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name in args.only.split(","):
            runs, ranks, rate, extra = ROWS[name]
            print(load_row(tmp, name, runs, ranks, rate, args.seconds, extra, cost), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
