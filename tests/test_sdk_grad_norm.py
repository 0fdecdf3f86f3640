"""`traceml.log(grad_norm="auto")`: the global gradient norm of the traced model, once per step (seed 004)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from traceml_tui.core import records

from support import realruns

TRAIN = textwrap.dedent(
    """
    import json, sys
    import torch
    import traceml_tui as traceml

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    traceml.init("gn", logs_dir=sys.argv[1])
    expected = []
    for step in range(3):
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            # the reference: every gradient flattened into one vector
            expected.append(float(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm()))
            traceml.log(loss=loss, grad_norm="auto")
            opt.step()
    traceml.finish()
    print(json.dumps(expected))
    """
)
NO_MODEL = textwrap.dedent(
    """
    import sys
    import traceml_tui as traceml

    traceml.init("nm", logs_dir=sys.argv[1])
    with traceml.trace_step():
        try:
            traceml.log(loss=1.0, grad_norm="auto")
        except ValueError as exc:
            print(exc)
    """
)


def _script(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "s.py").write_text(source)
    return subprocess.run([sys.executable, "s.py", "logs"], cwd=tmp_path, env=realruns.subprocess_env(tmp_path / "state"),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_auto_grad_norm_equals_the_norm_of_all_gradients(tmp_path: Path) -> None:
    done = _script(tmp_path, TRAIN)
    assert done.returncode == 0, done.stderr
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    lines = (tmp_path / "logs/gn/ranks/rank_0/steps-0.jsonl").read_bytes().splitlines()
    recorded = [r.grad_norm for r in map(records.decode, lines) if isinstance(r, records.Step)]
    assert recorded == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_auto_grad_norm_without_a_traced_model_says_what_is_missing(tmp_path: Path) -> None:
    done = _script(tmp_path, NO_MODEL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "grad_norm='auto' needs the model: wrap the step in traceml.trace_step(model)"
