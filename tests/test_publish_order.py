"""`traceml.publish_checkpoint` publishes once per update, in order (seed 004; docs/hygiene.md).

A script run in its own process (the SDK's session is per process), writing real
checkpoints with torch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from traceml_tui.core.rundir import RunDir

from support.lanes import needs

pytestmark = needs("torch")  # the scripts import it; this process does not

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    import traceml_tui as traceml

    traceml.init("pub", logs_dir=sys.argv[1])
    for step in range(3):
        with traceml.trace_step():
            pass
    print(traceml.publish_checkpoint({"w": torch.ones(1)}, step=2), flush=True)
    print(traceml.publish_checkpoint({"w": torch.ones(1)}, step=3), flush=True)
    traceml.publish_checkpoint({"w": torch.zeros(1)}, step=int(sys.argv[2]))
    print("not reached", flush=True)
    """
)


@pytest.mark.parametrize("again", [3, 1])
def test_a_step_not_ahead_of_the_last_published_is_refused_in_one_line(tmp_path: Path, cli_env, again: int) -> None:
    script = tmp_path / "publish.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "logs"), str(again)], capture_output=True,
                          text=True, timeout=120, env=cli_env)
    assert proc.returncode == 1
    assert proc.stdout.split() == ["step-00000002", "step-00000003"]
    # One line says what is wrong; the only other line is the direct run's summary written at exit (sdk/direct.py).
    first, *rest = proc.stderr.splitlines()
    assert first == (f"publish_checkpoint: update {again} is not ahead of the run's last published checkpoint "
                     "(update 3); a checkpoint is published once per update, in order")
    assert all(line.startswith("traceml: summary: ") for line in rest), proc.stderr
    run = RunDir(tmp_path / "logs" / "pub")
    assert [p.name for p in run.backlog_files("requests")] == ["step-00000002.json", "step-00000003.json"]
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step-00000002.pt", "step-00000003.pt"]
