"""Every line a rank prints has its rank: a real 2-rank gloo run through `traceml run`, then the Log screen.

torchrun used to pass the ranks' output through one shared stream, where only an
uncaught exception named its rank; a ``print`` was labelled ``--`` and the rank
filter dropped it. The launcher now copies each rank's own output
(``traceml_tui/run/rank_logs.py``): the terminal gets it as written, the node
logs with a ``[rank<N>]:`` prefix, and the Log screen (``l``, ``r``, ``L``) with
its rank.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.run.rank_logs import WORK_PREFIX
from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.logs import LogScreen
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.log_view import LogView
from traceml_tui.tui.widgets.rank_table import RankTable

from support import tui_data as d

STEPS = 3
#: Each rank prints to stdout and to stderr every step, and ends stdout without a newline.
SCRIPT = f"""
import gc
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import traceml_tui as traceml

torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
model = DDP(nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
traceml.init()
for step in range(1, {STEPS} + 1):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
    print(f"step {{step}} printed by rank {{rank}}")
    print(f"step {{step}} warned by rank {{rank}}", file=sys.stderr)
sys.stdout.write(f"last words of rank {{rank}}")
# DDP's reducer holds the gloo group: freed (gc: DDP sits in reference cycles) and destroyed here, not at
# interpreter exit, where gloo aborts now and then (docs/trainers.md "Limits")
del model, optimizer
gc.collect()
dist.destroy_process_group()
"""
PRINTED = re.compile(r"^step (\d) (printed|warned) by rank (\d)$|^last words of rank (\d)$")


def _printed_rank(text: str):
    """The rank a line of the script names, or None for any other line."""
    match = PRINTED.match(text)
    if not match:
        return None
    return int(match.group(3) if match.group(3) is not None else match.group(4))


def _expected_lines(stream: str) -> set[str]:
    if stream == "stdout":
        return {f"step {s} printed by rank {r}" for s in range(1, STEPS + 1) for r in (0, 1)} | \
            {f"last words of rank {r}" for r in (0, 1)}
    return {f"step {s} warned by rank {r}" for s in range(1, STEPS + 1) for r in (0, 1)}


@pytest.fixture(scope="module")
def printed_run(tmp_path_factory):
    """One real 2-rank run of SCRIPT through `traceml run` (the launcher's own stdout/stderr captured)."""
    from support.realruns import subprocess_env

    work = tmp_path_factory.mktemp("rank-logs")
    (work / "train.py").write_text(SCRIPT)
    env = subprocess_env(work / "state")
    proc = subprocess.run([sys.executable, "-m", "traceml_tui", "run", "train.py", "--nproc-per-node", "2",
                           "--run-name", "printed"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, proc


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_terminal_gets_the_output_as_written_and_the_logs_name_every_rank(printed_run):
    work, proc = printed_run
    # The terminal: what the ranks wrote, on the stream they wrote it to, without a prefix.
    out_lines = set(re.split(r"\n|(?<=rank [01])(?=step|last)", proc.stdout)) - {""}
    assert out_lines == _expected_lines("stdout"), proc.stdout
    err_lines = {ln for ln in proc.stderr.splitlines() if _printed_rank(ln) is not None}
    assert err_lines == _expected_lines("stderr")
    assert "[rank" not in proc.stdout
    node = work / "logs" / "printed" / "nodes" / "node_0"
    for stream in ("stdout", "stderr"):
        lines = (node / f"training.{stream}.log").read_text().splitlines()
        tagged = [ln for ln in lines if _printed_rank(ln.partition(": ")[2]) is not None]
        # every line the script printed is there once, whole, after the prefix of the rank that printed it
        assert {ln.partition(": ")[2] for ln in tagged} == _expected_lines(stream)
        assert len(tagged) == len(_expected_lines(stream))
        for line in tagged:
            assert line.startswith(f"[rank{_printed_rank(line.partition(': ')[2])}]: "), line
        # nothing a rank printed is left untagged (torchrun's own lines carry no rank and name none)
        assert not [ln for ln in lines if _printed_rank(ln) is not None]
    assert not [p for p in node.iterdir() if p.name.startswith(WORK_PREFIX)]  # the working folder is gone


async def _until(pilot, predicate, limit: int = 1000) -> None:
    for _ in range(limit):
        if predicate():
            return
        await pilot.pause(0.02)
    assert predicate()


@pytest.mark.slow
@pytest.mark.timeout(300)
@d.aio
async def test_log_screen_gives_every_printed_line_its_rank(printed_run, tmp_path):
    work, _ = printed_run
    index = tmp_path / "index.sqlite"
    d.ingest(index, [work / "logs"])
    src = IndexSource(index)
    try:
        app = create_app(src, poll_interval=0.02)
        async with app.run_test(size=(120, 30)) as pilot:
            await d.settle(pilot)
            run_id = next(r.run_id for r in app.runs_snapshot.rows if r.name == "printed")
            app.open_logs(run_id)
            await _until(pilot, lambda: isinstance(app.screen, LogScreen) and app.screen.reads >= 1)
            screen = app.screen
            view = screen.query_one(LogView)
            printed = [ln for ln in view.lines if _printed_rank(ln.text) is not None]
            assert {ln.text for ln in printed} == _expected_lines("stdout") | _expected_lines("stderr")
            for line in printed:
                assert line.rank == _printed_rank(line.text), line
                assert line.stream == ("stderr" if "warned" in line.text else "stdout"), line
            every = len(view.lines)
            for rank in (0, 1):  # the rank filter: r0, then r1 keep each rank's own printed lines
                await pilot.press("r")
                await pilot.pause()
                assert screen.rank == rank
                shown = {ln.text for ln in view.lines}
                assert {ln.rank for ln in view.lines} == {rank}
                assert {t for t in shown if _printed_rank(t) is not None} == \
                    {t for t in _expected_lines("stdout") | _expected_lines("stderr") if t.endswith(str(rank))}
            await pilot.press("r")
            await pilot.pause()
            assert screen.rank is None and len(view.lines) == every
            status = str(screen.query_one("#log-status").render())
            assert status.startswith(f"{every} lines · all ranks"), status
            await pilot.press("escape")
            await _until(pilot, lambda: not isinstance(app.screen, LogScreen))

            # `L` on the Run screen of this healthy run: the selected rank's lines, not "0 of N lines"
            app.open_run(run_id)
            await d.settle(pilot)
            ranks = app.screen.query_one(RankTable)
            ranks.move_cursor(row=ranks.get_row_index("1"))
            await pilot.press("L")
            await _until(pilot, lambda: isinstance(app.screen, LogScreen) and app.screen.reads >= 1)
            await pilot.pause()
            screen = app.screen
            view = screen.query_one(LogView)
            assert screen.rank == 1 and view.lines and {ln.rank for ln in view.lines} == {1}
            assert {ln.text for ln in view.lines if _printed_rank(ln.text) is not None} == \
                {t for t in _expected_lines("stdout") | _expected_lines("stderr") if t.endswith("1")}
            status = str(screen.query_one("#log-status").render())
            assert status.startswith(f"{len(view.lines)} of ") and not status.startswith("0 of"), status
    finally:
        src.close()


@pytest.mark.timeout(120)
@d.aio
async def test_rank_filter_on_logs_that_name_no_rank_says_so(tmp_path):
    """Logs written before the launcher tagged every line (a plain ``print`` unprefixed): `L` says why it is empty."""
    from support import fixture_runs as fr

    def old_logs(root: Path) -> None:
        node = root / fr.name_of("completed") / "nodes" / "node_0"
        (node / "training.stdout.log").write_text("step 1 printed by rank 0\nstep 1 printed by rank 1\n")

    root, index = fr.build_real_index(tmp_path, prepare=old_logs)
    src = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    try:
        app = create_app(src, poll_interval=0.02)
        async with app.run_test(size=(120, 30)) as pilot:
            await d.settle(pilot)
            run_id = next(r.run_id for r in app.runs_snapshot.rows if r.name == fr.name_of("completed"))
            app.open_run(run_id)
            await d.settle(pilot)
            ranks = app.screen.query_one(RankTable)
            ranks.move_cursor(row=ranks.get_row_index("0"))
            await pilot.press("L")
            await _until(pilot, lambda: isinstance(app.screen, LogScreen) and app.screen.reads >= 1)
            await pilot.pause()
            status = str(app.screen.query_one("#log-status").render())
            assert status.startswith("0 of 2 lines · rank r0") and "no line in these logs names a rank" in status
    finally:
        src.close()


MULTI_NODE_SCRIPT = """
import os
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"printed by global rank {dist.get_rank()} on node {os.environ['TRACEML_NODE_RANK']}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_nodes_tag_their_lines_with_global_ranks(tmp_path):
    """Two launchers (one process each, static rendezvous): node 1's log says rank 1, the rank torch gave it."""
    import socket

    from support.realruns import subprocess_env

    (tmp_path / "train.py").write_text(MULTI_NODE_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = subprocess_env(tmp_path / "state")
    common = ["run", "train.py", "--run-name", "two-nodes", "--nnodes", "2", "--nproc-per-node", "1",
              "--master-addr", "127.0.0.1", "--master-port", str(port)]
    with open(tmp_path / "node0.err", "w") as err0:
        node0 = subprocess.Popen([sys.executable, "-m", "traceml_tui", *common, "--node-rank", "0"], cwd=tmp_path,
                                 env=env, stdout=subprocess.DEVNULL, stderr=err0)
        try:
            node1 = subprocess.run([sys.executable, "-m", "traceml_tui", *common, "--node-rank", "1"], cwd=tmp_path,
                                   env=env, capture_output=True, text=True, timeout=240)
            assert node0.wait(timeout=240) == 0, (tmp_path / "node0.err").read_text()[-2000:]
        finally:
            if node0.poll() is None:
                node0.kill()
    assert node1.returncode == 0, node1.stderr[-2000:]
    assert node1.stdout == "printed by global rank 1 on node 1\n"  # the terminal: as written
    for node in (0, 1):
        log = tmp_path / "logs" / "two-nodes" / "nodes" / f"node_{node}" / "training.stdout.log"
        assert log.read_text() == f"[rank{node}]: printed by global rank {node} on node {node}\n"
