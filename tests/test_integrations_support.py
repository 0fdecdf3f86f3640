"""The pieces every trainer integration shares (traceml_tui/integrations/support.py), without a framework."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from traceml_tui.integrations.support import eval_metrics, examples_in

from support.lanes import IMPORTS_TORCH

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


@IMPORTS_TORCH  # torch in this process: on the one worker that pays for it (support/lanes.py)
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



_SESSION = """
import json, sys
import traceml_tui as traceml
assert traceml.current_run() is None  # nothing of traceml ran in the parent before the fork
session = traceml.init(sys.argv[1])
with traceml.trace_step():
    pass
print(json.dumps({"path": str(session.path), "argv": sys.argv[1:], "finder": type(sys.meta_path[0]).__name__}))
if sys.argv[2] == "raise":
    raise ValueError("boom in the fit")
sys.exit(int(sys.argv[2]))
"""


def test_forked_fits_run_each_script_as_its_own_process(tmp_path):
    """The one-process fits (tests/scripts/forked_fits.py): each child runs its script through the bootstrap in
    its own folder, with its own stdout, stderr, exit status and traceml session, as ``python -m bootstrap``
    would, and exits as a process does (atexit: the rank's end record); one fit failing never stops the next."""
    from concurrent.futures import Future

    from support import integrations

    (tmp_path / "fit.py").write_text(_SESSION)
    fits = {}
    for name, how in (("raises", "raise"), ("exits", "7"), ("ok", "0")):
        (tmp_path / name).mkdir()
        fits[("g", name)] = integrations.Fit(tmp_path / "fit.py", tmp_path / name, (name, how))
    forked: Future = Future()
    forked.set_result(integrations._run_fits(fits, tmp_path, preload=("traceml_tui",)))
    done = {name: integrations._fit_result(forked, "g", name) for _, name in fits}
    assert {name: proc.returncode for name, proc in done.items()} == {"raises": 1, "exits": 7, "ok": 0}
    assert "ValueError: boom in the fit" in done["raises"].stderr.splitlines()  # its traceback, as a process prints
    for (_, name), fit in fits.items():
        seen = json.loads(done[name].stdout)
        assert seen == {"path": f"logs/{name}/ranks/rank_0/steps-0.jsonl", "argv": list(fit.args),
                        "finder": "TrainerFinder"}  # through the bootstrap: the import hook in place
        rows = [json.loads(line) for line in (fit.cwd / seen["path"]).read_text().splitlines()]
        assert rows[0]["kind"] == "header" and [r["kind"] for r in rows].count("step") == 1
        # ended as a process ends: the SDK's exception hook and atexit handler ran in the child, and the bootstrap
        # wrote the end of a script that returned or called sys.exit(n) as it did (docs/run.md "SDK")
        want = {"raises": ("failed", 1), "exits": ("exited", 7), "ok": ("completed", None)}[name]
        assert (rows[-1]["kind"], rows[-1]["status"], rows[-1]["exit_code"]) == ("rank_end", *want)
        assert (fit.cwd / "logs" / name / "final_summary.json").is_file()  # rank 0 at exit, no launcher
