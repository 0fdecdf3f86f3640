"""Tiny CPU training for tests/support/realruns.py (modelled on examples/distributed/ddp_minimal.py).

Under `traceml run --nproc-per-node 2` it trains a 2-rank gloo DDP model; as one
process it trains the same model without a process group. The options make one
rank misbehave the way real jobs do (each counts completed steps from 1):

    --steps N           steps to train (default 8)
    --finish            call traceml.finish() at the end (else the SDK's exit hook ends the rank)
    --sleep S           sleep S seconds after each step (a slow job, to be interrupted or stopped)
    --raise-at K        the --bad-rank raises RuntimeError inside step K
    --sigkill-after K   the --bad-rank SIGKILLs itself after step K
    --sigstop-after K   the --bad-rank SIGSTOPs itself after step K (a hung rank)
    --exit-after K      the --bad-rank calls sys.exit(3) after step K (no exception: only its exit code says so)
    --abort-at-exit     the --bad-rank trains to the end, then aborts (SIGABRT) while the interpreter shuts down:
                        a crash in teardown, after training (as gloo's abort at interpreter exit)
    --hang-at K         every rank all-reduces its loss at the end of each step; inside step K the --bad-rank
                        first sleeps --hang-s seconds (default 120): its peers wait in that all_reduce
    --timeout S         the process group's collective timeout in seconds (default 30)
    --work-ms W         every rank sleeps W ms inside each step (a step of a known length)
    --slow-pct P        ... and the --bad-rank P % longer: a straggler (with --no-ddp, its step time shows it)
    --no-ddp            no DDP: each rank trains its own replica, with no collective per step (ranks that do not
                        wait for each other, so a slow rank's step time is its own, not its peers' too)
    --bad-rank R        which rank misbehaves (default 1; `all`: every rank)
    --pid-dir DIR       write rank_<r>.pid there at start (so a harness can find and reap the ranks)
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import traceml_tui as traceml


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--finish", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--raise-at", type=int)
    parser.add_argument("--sigkill-after", type=int)
    parser.add_argument("--sigstop-after", type=int)
    parser.add_argument("--exit-after", type=int)
    parser.add_argument("--abort-at-exit", action="store_true")
    parser.add_argument("--hang-at", type=int)
    parser.add_argument("--hang-s", type=float, default=120.0)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--bad-rank", default="1")
    parser.add_argument("--pid-dir")
    parser.add_argument("--work-ms", type=float, default=0.0)
    parser.add_argument("--slow-pct", type=float, default=0.0)
    parser.add_argument("--no-ddp", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        # A short timeout: a rank whose peer vanished must not wait the default 30 minutes.
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank = dist.get_rank() if distributed else 0
    if args.pid_dir:
        Path(args.pid_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.pid_dir) / f"rank_{rank}.pid").write_text(str(os.getpid()))
    bad = args.bad_rank == "all" or rank == int(args.bad_rank)
    torch.manual_seed(1234 + rank)

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    if distributed and not args.no_ddp:
        model = DDP(model)
    work_s = args.work_ms / 1000.0 * (1.0 + args.slow_pct / 100.0 if bad else 1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    true_w = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))

    traceml.init()
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch_size, 16)
        y = x @ true_w + 0.1 * torch.randn(args.batch_size, 1)
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            if bad and step == args.raise_at:
                raise RuntimeError("CUDA out of memory (simulated)")
            loss.backward()
            optimizer.step()
            if work_s:
                time.sleep(work_s)
            traceml.log(loss=loss, lr=0.05, batch_size=args.batch_size, components={"mse": (loss, y)})
            if args.hang_at and distributed:
                if bad and step == args.hang_at:
                    time.sleep(args.hang_s)  # the rank that never arrives (tests name this line)
                dist.all_reduce(loss.detach().clone())  # the collective its peers wait in
        if bad and step == args.sigkill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if bad and step == args.sigstop_after:
            os.kill(os.getpid(), signal.SIGSTOP)
        if bad and step == args.exit_after:
            sys.exit(3)
        if args.sleep:
            time.sleep(args.sleep)
    if args.finish:
        traceml.finish()
    if distributed:
        # Free DDP first: its reducer holds the gloo group, and a group still alive at interpreter
        # teardown aborts the process now and then ("terminate called without an active
        # exception": 3 in 30 plain torchrun runs with torch 2.13 CPU; 0 in 30 with this order).
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()
    if bad and args.abort_at_exit:
        atexit.register(os.abort)  # runs at interpreter exit, after the script (and its traceml.init) returned


if __name__ == "__main__":
    main()
