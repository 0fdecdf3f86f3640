"""Early stopping under DDP: rank 0 decides, every rank stops after the same step."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from traceml_tui.core.rundir import RunDir
    from traceml_tui.hygiene import EarlyStopping, backlog
    from traceml_tui.hygiene.checkpoints import publish_checkpoint

    def main(rank, run_dir, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        run = Path(run_dir)
        es = EarlyStopping(run, metric="m", direction="min", min_delta=0.0, patience=1)
        stopped = None
        for step in range(1, 6):
            if rank == 0 and step == 3:  # results land on rank 0's filesystem view only
                for s, v in ((1, 1.0), (2, 2.0)):
                    ck = publish_checkpoint(run, run / "w", step=s, config_digest="d")
                    backlog.write_receipt(run, backlog.read_json(RunDir(run).request(ck)), {"m": v})
            if es.should_stop(step):
                stopped = step
                break
        print(f"rank {rank} stopped {stopped}", flush=True)
        dist.destroy_process_group()

    if __name__ == "__main__":
        (Path(sys.argv[1]) / "w").write_bytes(b"w")
        mp.spawn(main, args=(sys.argv[1], sys.argv[2]), nprocs=2)
    """
)


@pytest.mark.slow
def test_all_ranks_stop_at_the_same_step(tmp_path, cli_env):
    pytest.importorskip("torch.distributed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    script = tmp_path / "ddp_es.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), port], env=cli_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # both ranks print to one pipe: their lines may interleave, so match the messages, not lines
    assert sorted(re.findall(r"rank \d+ stopped \d+", proc.stdout)) == [
        "rank 0 stopped 3", "rank 1 stopped 3"]
