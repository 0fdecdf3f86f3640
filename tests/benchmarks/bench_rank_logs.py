"""Cost of tagging every rank line (traceml_tui/run/rank_logs.py) against a plain copy of the same bytes.

The launcher copies each rank's output files (torchrun's ``--redirects 3``) to
the terminal and to the node logs with a ``[rank<N>]:`` prefix. This measures,
in one process and one run:

* throughput: 8 ranks × ``--mb`` MiB of training-log lines copied by
  :class:`RankLogs` (terminal + prefixed log) vs a baseline that reads the same
  files and writes them twice unchanged (what an untagged tee costs);
* append → node log latency: one line appended to a rank file until it is in
  the node log (median and p99 over ``--lines`` appends), against the poll
  interval;
* idle CPU: the copier thread's CPU per second with 16 files and no output.

Not collected by pytest:

    python tests/benchmarks/bench_rank_logs.py [--mb 8] [--lines 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from traceml_tui.run.rank_logs import POLL_S, NodeLog, RankLogs  # noqa: E402

RANKS = 8
LINE = b"step 000123 loss 0.4321 lr 3.0e-04 grad_norm 1.234 examples/s 5321.7 | some training message\n"


class _Sink:
    """A terminal that discards (the benchmark measures the copier, not a tty)."""

    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def _rank_files(work: Path) -> dict[tuple[int, str], Path]:
    attempt = work / "none_bench" / "attempt_0"
    out = {}
    for local in range(RANKS):
        (attempt / str(local)).mkdir(parents=True)
        for stream in ("stdout", "stderr"):
            out[local, stream] = attempt / str(local) / f"{stream}.log"
            out[local, stream].touch()
    return out


def throughput(mb: int, folder: Path) -> tuple[float, float]:
    """(seconds for RankLogs, seconds for the untagged baseline) to copy RANKS × mb MiB."""
    body = LINE * (mb * 2**20 // len(LINE))
    node = folder / "tagged"
    node.mkdir()
    logs = {s: NodeLog(node / f"training.{s}.log") for s in ("stdout", "stderr")}
    ranks = RankLogs(node, 0, RANKS, logs, terminals={"stdout": _Sink(), "stderr": _Sink()})
    files = _rank_files(ranks.work_dir)
    for local in range(RANKS):
        files[local, "stdout"].write_bytes(body)
    start = time.perf_counter()
    ranks.finish()  # one final pass copies everything
    tagged = time.perf_counter() - start
    for log in logs.values():
        log.close()
    copied = (node / "training.stdout.log").stat().st_size
    assert copied == RANKS * (len(body) + len(b"[rank0]: ") * body.count(b"\n")), copied

    plain = folder / "plain"
    plain.mkdir()
    sources = []
    for local in range(RANKS):
        path = plain / f"{local}.log"
        path.write_bytes(body)
        sources.append(path)
    start = time.perf_counter()
    sink = _Sink()
    with open(plain / "training.stdout.log", "ab") as log:
        for path in sources:
            fd = os.open(path, os.O_RDONLY)
            while chunk := os.read(fd, 1 << 20):
                sink.write(chunk)
                log.write(chunk)
                log.flush()
            os.close(fd)
    baseline = time.perf_counter() - start
    return tagged, baseline


def latency(lines: int, folder: Path) -> list[float]:
    """Seconds from an append to a rank file until the line is in the node log, ``lines`` times."""
    node = folder / "latency"
    node.mkdir()
    logs = {s: NodeLog(node / f"training.{s}.log") for s in ("stdout", "stderr")}
    ranks = RankLogs(node, 0, RANKS, logs, terminals={"stdout": _Sink(), "stderr": _Sink()})
    files = _rank_files(ranks.work_dir)
    ranks.start()
    out = []
    target = node / "training.stdout.log"
    with open(files[3, "stdout"], "ab", buffering=0) as rank3:
        for i in range(lines):
            size = target.stat().st_size
            start = time.perf_counter()
            rank3.write(b"line %d\n" % i)
            while target.stat().st_size == size:
                time.sleep(0.0005)
            out.append(time.perf_counter() - start)
            time.sleep(0.003)
    ranks.finish()
    for log in logs.values():
        log.close()
    return out


def idle_cpu(seconds: float, folder: Path) -> float:
    """CPU seconds per second of this process while the copier watches 16 silent files."""
    node = folder / "idle"
    node.mkdir()
    logs = {s: NodeLog(node / f"training.{s}.log") for s in ("stdout", "stderr")}
    ranks = RankLogs(node, 0, RANKS, logs, terminals={"stdout": _Sink(), "stderr": _Sink()})
    _rank_files(ranks.work_dir)
    ranks.start()
    time.sleep(0.5)  # let it find the files
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    ranks.finish()
    for log in logs.values():
        log.close()
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=8, help="MiB of output per rank (default 8)")
    parser.add_argument("--lines", type=int, default=200, help="appends timed for the latency (default 200)")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds of idle CPU measured (default 5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tagged, baseline = throughput(args.mb, folder)
        total = RANKS * args.mb
        print(f"copy {RANKS} ranks x {args.mb} MiB: tagged {total / tagged:.0f} MiB/s ({tagged:.3f} s), "
              f"untagged baseline {total / baseline:.0f} MiB/s ({baseline:.3f} s), ratio {tagged / baseline:.2f}x")
        lat = sorted(latency(args.lines, folder))
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        print(f"append -> node log: median {statistics.median(lat) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms "
              f"(poll interval {POLL_S * 1e3:.0f} ms; ratio median/poll {statistics.median(lat) / POLL_S:.2f})")
        cpu = idle_cpu(args.idle_s, folder)
        print(f"idle, {2 * RANKS} silent files: {cpu * 100:.2f} % of a core")


if __name__ == "__main__":
    main()
