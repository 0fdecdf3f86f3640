"""The pieces every trainer integration shares (traceml_tui/integrations/support.py), without a framework."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from traceml_tui.integrations.support import eval_metrics, examples_in

_FAILING_HOOK = """
from traceml_tui.integrations.support import guarded


class Callback:
    def __init__(self):
        self._traceml_off = False
        self.abandoned = 0
        self.calls = 0

    def _traceml_abandon(self):
        self.abandoned += 1

    @guarded("Test Trainer")
    def on_step(self, fail):
        self.calls += 1
        if fail:
            raise RuntimeError("a broken hook")
        return "ran"


callback = Callback()
assert callback.on_step(False) == "ran"
assert callback.on_step(True) is None  # never raised into the trainer
assert callback._traceml_off and callback.abandoned == 1
assert callback.on_step(False) is None and callback.calls == 2  # off for the rest of the run
print("trained on")
"""


def test_a_failing_hook_switches_the_callback_off_and_is_recorded(tmp_path):
    env = dict(os.environ, TRACEML_RUN_DIR=str(tmp_path / "run"), TRACEML_RUN_NAME="run")
    env.pop("RANK", None)
    proc = subprocess.run([sys.executable, "-c", _FAILING_HOOK], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "trained on", proc.stderr
    line = "traceml: nothing measured: Test Trainer callback failed in on_step (RuntimeError: a broken hook)"
    assert proc.stderr.count(line) == 1, proc.stderr
    rows = [json.loads(x) for x in (tmp_path / "run" / "ranks" / "rank_0" / "steps-0.jsonl").read_text().splitlines()]
    assert [(r["stream"], r["reason"].startswith("Test Trainer callback failed")) for r in rows
            if r["kind"] == "unmeasured"] == [("all", True)]


def test_eval_metrics_drop_the_split_prefix_and_what_is_not_a_result():
    got = eval_metrics({"eval_loss": 1.5, "eval_runtime": 0.2, "eval_samples_per_second": 9.0, "epoch": 1.0,
                        "eval_accuracy": 0.75, "eval_": 3.0, "note": "text", "flag": True}, "eval_")
    assert got == {"loss": 1.5, "accuracy": 0.75, "eval_": 3.0}
    assert eval_metrics({"val_loss": 2.0, "val/acc": 0.5, "train_loss": 1.0}, "val_", "val/") == \
        {"loss": 2.0, "acc": 0.5, "train_loss": 1.0}


@pytest.mark.parametrize("batch, expected", [
    ({"input_ids": [[1, 2]], "labels": None}, None),
    ([], None),
    ("text", None),
])
def test_examples_in_without_tensors_is_none(batch, expected):
    assert examples_in(batch) == expected


def test_examples_in_reads_the_leading_size_of_the_first_tensor():
    torch = pytest.importorskip("torch")
    x = torch.zeros(6, 3)
    assert examples_in(x) == 6
    assert examples_in((x, torch.zeros(6))) == 6
    assert examples_in({"mask": None, "input_ids": torch.zeros(4, 16), "x": x}) == 4
    assert examples_in(torch.tensor(1.0)) is None  # a scalar has no examples


def test_the_trainer_runs_launch_once_a_session(tmp_path, monkeypatch):
    """The pool of real trainer runs (tests/support/integrations.py) lives in one pytest process: a second process
    of the session launching the same module's runs (a test outside the xdist group) fails instead of training
    every run twice."""
    from support import integrations

    monkeypatch.setattr(integrations, "_claims", tmp_path)  # the session's shared folder
    integrations._claim(None, "test_integrations_x")
    integrations._claim(None, "test_integrations_y")  # another module's runs: launched once each
    with pytest.raises(RuntimeError, match=f"xdist_group '{integrations.GROUP}'"):
        integrations._claim(None, "test_integrations_x")
