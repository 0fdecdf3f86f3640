"""Synthetic run directories for the `traceml watch` feature tests and the benchmark.

These runs exist for what a real run cannot give deterministically: exact step
times (a recurring straggler for the heatmap), hundreds of runs for the
benchmark, fixed timestamps. Their lifecycle speaks exactly as the real thing
does — the manifest is the launcher's :class:`~traceml_tui.core.artifacts.Manifest`
and a rank that returns normally ends ``exited`` as the SDK writes it — but
tests of *status words* use the real runs of ``tests/support/realruns.py``, never these.
The index is built by the real daemon :class:`~daemon.service.Ingester`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
from pathlib import Path
from typing import Optional

from traceml_tui.core import atomic, records
from traceml_tui.core.rundir import RunDir

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: every record time is an offset from here
V = records.RECORD_VERSION


def _manifest(name: str, nnodes: int, nproc: int, steps: int, status: str) -> dict:
    """The manifest as the launcher writes it (its own struct), for a guarded run."""
    from traceml_tui.core import artifacts

    return artifacts.to_builtins(artifacts.Manifest(
        run_name=name, status=status, started_at=T0, mode="summary",
        topology=artifacts.Topology(nnodes=nnodes, nproc_per_node=nproc, world_size=nnodes * nproc),
        launch=artifacts.Launch(kind="torch.distributed.run"),
        guard=artifacts.Guard(contract={"schema_version": 1,
                                        "workload": {"name": "tiny-mlp", "parameters": {"model": "mlp"}},
                                        "measurement": {"start_step": 1, "completed_steps": steps}},
                              contract_digest="sha256:" + "0" * 64)))


def step_record(name: str, rank: int, step: int, ts: float, step_ms: float, wait_ms: float, loss: float,
                ratio: float, examples: int) -> records.Step:
    return records.Step(
        v=V, run=name, rank=rank, attempt=0, step=step, ts=ts,
        cpu_ms=records.Phases(step=step_ms, input_wait=wait_ms, forward=step_ms * 0.3, backward=step_ms * 0.5,
                              optimizer=step_ms * 0.1),
        loss=loss, lr=1e-3, grad_norm=1.0, examples=examples,
        mem=records.Memory(rss=200 << 20),
        components={"mse": records.Component(value=loss, weight=1.0, weighted=loss, target_ms=loss / ratio,
                                             ratio=ratio)},
    )


def write_run(
    root: Path,
    name: str,
    *,
    ranks: int = 2,
    steps: int = 20,
    declared: Optional[int] = None,
    base_ms: float = 50.0,
    straggler: Optional[int] = None,
    silent_rank: Optional[int] = None,
    silent_after: int = 5,
    failed_rank: Optional[int] = None,
    finished: bool = True,
    evals: bool = True,
    t0: float = T0,
) -> Path:
    """Write one run directory; returns it. Steps are 0.1 s apart from ``t0``.

    ``straggler``: that rank is 1.6× slower every 4th step (a recurring
    straggler); ``silent_rank`` stops writing after ``silent_after`` steps;
    ``failed_rank`` ends with a failed ``rank_end``; ``finished`` ends every
    other rank with ``rank_end`` ``exited`` (what the SDK writes after a normal return).
    """
    run = root / name
    (run / "ranks").mkdir(parents=True, exist_ok=True)
    status = "failed" if failed_rank is not None else ("completed" if finished else "running")
    atomic.atomic_write_json(run / "manifest.json", _manifest(name, 1, ranks, declared or steps, status))
    for r in range(ranks):
        path = RunDir(run).steps_file(r, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [records.encode(records.Header(v=V, run=name, rank=r, attempt=0, uuid=f"{name}-{r}", ts=t0,
                                               node_rank=0, world_size=ranks))]
        last = steps if silent_rank != r else silent_after
        for s in range(1, last + 1):
            ms = base_ms * (1.0 + 0.02 * math.sin(s + r))
            if straggler == r and s % 4 == 0:
                ms *= 1.6
            loss = 2.0 * math.exp(-s / 15) + 0.1
            ratio = 1.1 * math.exp(-s / 12) + 0.15
            lines.append(records.encode(step_record(name, r, s, t0 + 0.1 * s, ms, 2.0 + r, loss, ratio, s * 32)))
            if evals and r == 0 and s % 10 == 0:
                lines.append(records.encode(records.Eval(
                    v=V, run=name, rank=0, attempt=0, step=s, ts=t0 + 0.1 * s, checkpoint=f"step-{s:08d}",
                    split="val", metrics={"loss": loss * 1.2},
                    status="completed" if s < steps else "pending")))
        if r == failed_rank:
            lines.append(records.encode(records.RankEnd(v=V, run=name, rank=r, attempt=0, step=last,
                                                        ts=t0 + 0.1 * last + 0.05, status="failed", exit_code=1)))
        elif finished and silent_rank != r:
            lines.append(records.encode(records.RankEnd(v=V, run=name, rank=r, attempt=0, step=last,
                                                        ts=t0 + 0.1 * last + 0.05, status="exited", exit_code=None)))
        path.write_bytes(b"".join(lines))
    sysfile = run / "nodes" / "node_0" / "system.jsonl"
    sysfile.parent.mkdir(parents=True, exist_ok=True)
    lines = [records.encode(records.Header(v=V, run=name, rank=-1, attempt=0, uuid=f"{name}-sys", ts=t0,
                                           node_rank=0, stream="system"))]
    for i in range(3):
        lines.append(records.encode(records.SystemSample(v=V, run=name, node_rank=0, ts=t0 + i, cpu_pct=40.0 + i,
                                                         ram_used=6 << 30, ram_total=16 << 30)))
    sysfile.write_bytes(b"".join(lines))
    if failed_rank is not None or finished:
        code = 1 if failed_rank is not None else 0
        atomic.atomic_write_json(run / "nodes" / "node_0" / "guard_outcome.json", {
            "schema_version": 1, "run_name": name, "node_rank": 0, "nnodes": 1, "nproc_per_node": ranks,
            "contract_digest": "sha256:" + "0" * 64,
            "training": {"status": "failed" if code else "completed", "exit_code": code},
            "completed_at": "2026-01-01T00:01:00+00:00"})
    return run


def append_steps(run: Path, name: str, rank: int, first: int, last: int, t0: float = T0) -> None:
    """Append steps first..last to a rank's stream, as a live training rank would."""
    path = RunDir(run).steps_file(rank, 0)
    fd = atomic.open_append(path)
    try:
        for s in range(first, last + 1):
            atomic.append_line(fd, records.encode(step_record(name, rank, s, t0 + 0.1 * s, 50.0, 2.0, 0.5, 0.4,
                                                              s * 32)))
    finally:
        import os

        os.close(fd)


def write_backlog(run: Path, *, now: float, stuck: bool = True) -> None:
    """Five requests: two completed, one claimed with a fresh heartbeat, one stuck claim, one failed twice."""
    v = run / "validation"
    for kind in ("requests", "claims", "receipts", "failures"):
        (v / kind).mkdir(parents=True, exist_ok=True)
    for i, step in enumerate((4, 8, 12, 16, 20)):
        ckpt = f"step-{step:08d}"
        atomic.atomic_write_json(v / "requests" / f"{ckpt}.json", {
            "checkpoint": ckpt, "step": step, "path": f"checkpoints/{ckpt}.pt", "config_digest": "sha256:ab",
            "created": now - 600 + 60 * i})
        if i < 2:
            atomic.atomic_write_json(v / "receipts" / f"{ckpt}.json", {
                "checkpoint": ckpt, "step": step, "config_digest": "sha256:ab", "metrics": {"loss": 0.5},
                "completed": now - 300 + 60 * i})
        elif i == 2:
            atomic.atomic_write_json(v / "claims" / f"{ckpt}.json", {
                "checkpoint": ckpt, "owner": {"host": "worker-a", "pid": 4242, "start_time": now - 900},
                "claimed": now - 40, "heartbeat": now - 5, "lease_s": 60.0})
        elif i == 3 and stuck:
            atomic.atomic_write_json(v / "claims" / f"{ckpt}.json", {
                "checkpoint": ckpt, "owner": {"host": "worker-b", "pid": 777, "start_time": now - 900},
                "claimed": now - 500, "heartbeat": now - 420, "lease_s": 60.0})
        else:
            for attempt in (1, 2):
                atomic.atomic_write_json(v / "failures" / f"{ckpt}-{attempt}.json", {
                    "checkpoint": ckpt, "attempt": attempt, "error": "CUDA out of memory", "failed": now - 100})


def ingest(index: Path, roots: list[Path]) -> int:
    """Build or update the index with the real ingester (one pass); returns records added."""
    from daemon.service import Ingester

    ing = Ingester(index, [str(r) for r in roots], poll_interval=0.1, use_inotify=False, mode="test")
    try:
        return ing.run_once()
    finally:
        ing.close()


def summary_pair(root: Path, ref_ms: float = 100.0, cand_ms: float = 130.0) -> tuple[Path, Path]:
    """Two minimal schema-1.9 final summaries (same declaration and topology) whose step times differ."""
    paths = []
    for name, ms in (("ref-run", ref_ms), ("cand-run", cand_ms)):
        summary = {
            "schema_version": "1.9", "generated_at": "2026-01-01T00:10:00Z", "duration_s": 60.0,
            "meta": {"run_name": name},
            "run_context": {
                "run": {"status": "completed"},
                "declaration": {"schema_version": 1, "workload": {"name": "tiny-mlp", "parameters": {"model": "mlp"}},
                                "measurement": {"start_step": 1, "completed_steps": 20}},
                "execution": {"expected_nodes": 1, "processes_per_node": 2, "expected_world_size": 2,
                              "launcher_completion": {"status": "completed", "nodes_observed": 1,
                                                      "reason_codes": []}},
            },
            "step_time": {"global": {
                "window": {"steps_analyzed": 20, "start_step": 1, "end_step": 20, "diagnosis_clock": "cpu"},
                "average": {"step_time_ms": ms, "input_wait_ms": 2.0, "step_time_cpu_ms": ms,
                            "forward_ms": ms * 0.3, "backward_ms": ms * 0.5, "optimizer_ms": ms * 0.1},
                "median": {"step_time_ms": ms, "step_time_cpu_ms": ms},
                "worst": {"step_time_ms": ms * 1.1, "step_time_cpu_ms": ms * 1.1}},
                "diagnosis": {"status": "BALANCED", "summary": "ranks are balanced"}},
            "system": {"global": {"average": {"cpu_percent": 40.0}}},
            "process": {"global": {"average": {"ram_bytes": 300 << 20}}},
            "step_memory": {"global": {"average": {}}},
            "text": "",
        }
        path = root / name / "final_summary.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary))
        paths.append(path)
    return paths[0], paths[1]


def aio(fn):
    """Run an async test body with asyncio (no pytest-asyncio needed); fixtures pass through."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


async def settle(pilot, rounds: int = 2, limit: int = 400) -> None:
    """Wait until the App has applied ``rounds`` more snapshots (bounded; never a fixed sleep)."""
    app = pilot.app
    target = app.refreshes + rounds
    for _ in range(limit):
        if app.refreshes >= target:
            break
        await pilot.pause(0.02)
    await pilot.pause()


def build_fixture(tmp: Path) -> tuple[Path, Path]:
    """The standard set of runs used by the pilot and snapshot tests; returns (root, index)."""
    root = tmp / "logs"
    root.mkdir(parents=True, exist_ok=True)
    write_run(root, "resnet-ok", straggler=1, steps=60, ranks=4)
    write_run(root, "bert-crash", failed_rank=1, steps=12)
    write_run(root, "vit-hang", ranks=3, silent_rank=2, finished=False, steps=400)
    write_backlog(root / "resnet-ok", now=FIXED_NOW)
    index = tmp / "state" / "index.sqlite"
    ingest(index, [root])
    return root, index


#: The clock the snapshots see: 1 s after the newest record of vit-hang.
FIXED_NOW = T0 + 41.0


def strip_glyph(cell) -> str:
    """A state cell's text without the glyph before its word: ``"⚠ stalled r2"`` → ``"stalled r2"``."""
    from traceml_tui.tui.glyphs import ALL_GLYPHS

    text = str(getattr(cell, "plain", cell)).strip()
    head, _, rest = text.partition(" ")
    return rest.strip() if head in ALL_GLYPHS else text


def status_word(cell) -> str:
    """The first word after a state cell's glyph: ``"⚠ stalled r2"`` → ``"stalled"``."""
    return strip_glyph(cell).split()[0]
