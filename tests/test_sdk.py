"""The SDK as a training script uses it: real processes writing real step files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.core import records
from traceml_tui.summary.load import load_ranks


def _script(tmp_path: Path, body: str, **env_extra: str) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text("import traceml_tui as traceml\n" + body)
    env = dict(os.environ, TRACEML_RUN_DIR=str(tmp_path / "run"), TRACEML_RUN_NAME="run", OMP_NUM_THREADS="1")
    env.update(env_extra)
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _records(tmp_path: Path, rank: int = 0, attempt: int = 0) -> list:
    data = (tmp_path / "run" / "ranks" / f"rank_{rank}" / f"steps-{attempt}.jsonl").read_bytes()
    assert data.endswith(b"\n")
    return [records.decode(line) for line in data.splitlines()]


def test_header_first_then_steps_with_unmeasured_phases_null(tmp_path: Path) -> None:
    proc = _script(tmp_path, "import time\nfor i in range(3):\n    with traceml.trace_step():\n        time.sleep(0.002)\n        traceml.log(loss=1.0 / (i + 1), lr=0.1, batch_size=4)\n")
    assert proc.returncode == 0, proc.stderr
    recs = _records(tmp_path)
    assert isinstance(recs[0], records.Header) and recs[0].run == "run" and recs[0].rank == 0
    steps = [r for r in recs if isinstance(r, records.Step)]
    assert [s.step for s in steps] == [1, 2, 3]
    assert steps[0].cpu_ms.input_wait is None and steps[1].cpu_ms.input_wait is not None
    assert all(s.cpu_ms.step >= 2.0 for s in steps)
    assert all(s.cpu_ms.forward is None and s.cpu_ms.backward is None and s.gpu_ms is None for s in steps)
    assert [s.examples for s in steps] == [4, 8, 12]
    assert steps[2].loss == pytest.approx(1 / 3)
    # the SDK cannot see the exit code of a clean exit: it says "exited" and leaves the code null
    assert isinstance(recs[-1], records.RankEnd) and recs[-1].status == "exited" and recs[-1].step == 3
    assert recs[-1].exit_code is None


def test_torch_phases_and_scale_free_components(tmp_path: Path) -> None:
    body = """
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
y = torch.full((8, 1), 2.0)
for _ in range(2):
    with traceml.trace_step(model):
        loss = torch.nn.functional.mse_loss(model(torch.randn(8, 4)), y)
        loss.backward(); opt.step(); opt.zero_grad()
        traceml.log(loss=loss, components={"mse": (loss, y, 0.5)})
"""
    proc = _script(tmp_path, body)
    assert proc.returncode == 0, proc.stderr
    steps = [r for r in _records(tmp_path) if isinstance(r, records.Step)]
    for step in steps:
        assert step.cpu_ms.forward > 0 and step.cpu_ms.backward > 0 and step.cpu_ms.optimizer > 0
        comp = step.components["mse"]
        assert comp.target_ms == pytest.approx(4.0)  # mean square of a target of 2.0s
        assert comp.ratio == pytest.approx(comp.value / 4.0)
        assert comp.weight == 0.5 and comp.weighted == pytest.approx(0.5 * comp.value)
        assert step.loss == pytest.approx(comp.value)


def test_failed_step_not_recorded_and_crash_marks_rank_failed(tmp_path: Path) -> None:
    body = """
with traceml.trace_step():
    pass
try:
    with traceml.trace_step():
        raise ValueError("bad batch")
except ValueError:
    pass
with traceml.trace_step():
    pass
raise RuntimeError("crash")
"""
    proc = _script(tmp_path, body)
    assert proc.returncode != 0
    recs = _records(tmp_path)
    assert [r.step for r in recs if isinstance(r, records.Step)] == [1, 2]
    assert isinstance(recs[-1], records.RankEnd) and recs[-1].status == "failed"


def test_resume_is_a_new_attempt_continuing_without_gap_or_duplicate(tmp_path: Path) -> None:
    loop = "for _ in range({n}):\n    with traceml.trace_step():\n        traceml.log(loss=1.0)\n"
    assert _script(tmp_path, loop.format(n=5)).returncode == 0
    assert _script(tmp_path, loop.format(n=3)).returncode == 0
    assert [r.step for r in _records(tmp_path, attempt=1) if isinstance(r, records.Step)] == [6, 7, 8]
    # resuming from an older checkpoint re-runs steps 7-8: the newer attempt supersedes them
    assert _script(tmp_path, "traceml.init(start_step=7)\n" + loop.format(n=4)).returncode == 0
    merged = load_ranks(tmp_path / "run")[0]
    assert sorted(merged.steps) == list(range(1, 11))
    assert merged.steps[8].attempt == 2 and merged.steps[5].attempt == 0
    # a gap is refused before anything is written
    proc = _script(tmp_path, "traceml.init(start_step=20)\n")
    assert proc.returncode != 0 and "gap" in proc.stderr
    assert not (tmp_path / "run/ranks/rank_0/steps-4.jsonl").exists() or \
        (tmp_path / "run/ranks/rank_0/steps-4.jsonl").read_bytes() == b""


def test_trace_max_steps_caps_recording_and_rank_from_env(tmp_path: Path) -> None:
    loop = "for _ in range(6):\n    with traceml.trace_step():\n        pass\n"
    proc = _script(tmp_path, loop, TRACEML_TRACE_MAX_STEPS="4", RANK="3", WORLD_SIZE="4")
    assert proc.returncode == 0, proc.stderr
    recs = _records(tmp_path, rank=3)
    assert recs[0].world_size == 4
    assert [r.step for r in recs if isinstance(r, records.Step)] == [1, 2, 3, 4]


def test_outside_the_launcher_records_go_to_logs_run_name(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    path.write_text("import traceml_tui as traceml\ntraceml.init('demo')\nwith traceml.trace_step():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "logs" / "demo" / "ranks" / "rank_0" / "steps-0.jsonl").exists()


@pytest.mark.faults
@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "foo\n", "a/b", "..", ".hidden", "x" * 129])
def test_init_outside_the_launcher_validates_the_name_like_the_launcher(tmp_path: Path, name: str) -> None:
    """Item 4: traceml.init() refuses the run names the launcher refuses (no path escapes, no newline)."""
    from traceml_tui.core.rundir import validate_run_name
    from traceml_tui.run.cli import parse_options
    from traceml_tui.run.options import LaunchError

    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    path = work / "plain.py"
    path.write_text(
        "import sys\nimport traceml_tui as traceml\n"
        "try:\n    traceml.init(sys.argv[1])\nexcept ValueError as exc:\n    print('refused:', exc)\n"
        "else:\n    with traceml.trace_step():\n        pass\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    proc = subprocess.run([sys.executable, str(path), name], cwd=work, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("refused: run name ")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "plain.py"]  # nothing written anywhere
    with pytest.raises(ValueError):
        validate_run_name(name)
    (tmp_path / "t.py").write_text("")
    with pytest.raises(LaunchError, match="--run-name"):
        parse_options([str(tmp_path / "t.py"), "--run-name", name])


def test_one_name_rule_for_launcher_and_sdk() -> None:
    from traceml_tui.core.rundir import validate_run_name

    for good in ("r", "guard-reference", "exp_1.2", "A" * 128, "0run"):
        assert validate_run_name(good) == good
    for bad in ("", "-x", "_x", ".", "foo\n", "foo\r", "a b", "ü", "x\x00", None, 5):
        with pytest.raises(ValueError):
            validate_run_name(bad)


def test_other_names_are_matched_whole() -> None:
    from traceml_tui.export.mapping import lane_and_manager, registration_problems
    from traceml_tui.hygiene.batch_grid import BatchGridError, save_batch_grid

    with pytest.raises(ValueError):
        lane_and_manager("vanguard-hal\n")
    assert lane_and_manager("vanguard-hal") == ("vanguard", "hal")
    assert registration_problems("vanguard-hal\n", "g", "d") and not registration_problems("vanguard-hal", "g", "d")
    with pytest.raises(BatchGridError):
        save_batch_grid(Path("unused"), None, step=1, name="inputs\n")


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, traceml_tui, traceml_tui.sdk; print(json.dumps(['torch' in sys.modules, 'textual' in sys.modules]))"
    proc = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, timeout=60)
    assert json.loads(proc.stdout) == [False, False]


def test_sys_exit_code_is_not_invented_and_a_fork_never_writes(tmp_path: Path) -> None:
    body = """
import os, sys, time
for _ in range(2):
    with traceml.trace_step():
        pass
pid = os.fork()
if pid == 0:
    sys.exit(0)  # the child runs atexit hooks too; it must not append to the rank's file
os.waitpid(pid, 0)
sys.exit(3)
"""
    proc = _script(tmp_path, body, TRACEML_TRACE_MAX_STEPS="1")
    assert proc.returncode == 3
    recs = _records(tmp_path)
    ends = [r for r in recs if isinstance(r, records.RankEnd)]
    assert len(ends) == 1, "exactly one writer: the forked child wrote nothing"
    assert ends[0].exit_code is None and ends[0].status == "exited"
    assert ends[0].step == 1  # clamped to the recorded steps under --trace-max-steps


def test_side_files_are_readable_by_other_users(tmp_path: Path) -> None:
    from traceml_tui.core import atomic

    atomic.atomic_write_json(tmp_path / "side.json", {"a": 1})
    assert (tmp_path / "side.json").stat().st_mode & 0o044 == 0o044


def test_step_lines_are_records_encode_bytes_whatever_their_size(tmp_path: Path) -> None:
    """The step writer encodes into one reused buffer (sdk/session.py): each line on disk is exactly what
    ``records.encode`` makes of that record — a short line after a long one carries nothing of it, NaN
    stays null, an unlogged step has no values, and the memory figures are there on every step."""
    body = """
import torch
many = {f"c{i:03d}": (torch.tensor(0.25), 1.0) for i in range(60)}  # one line far over the buffer's start size
for i in range(4):
    with traceml.trace_step():
        if i == 0:
            traceml.log(loss=torch.tensor(0.5), lr=0.1, grad_norm=torch.tensor(float("nan")), batch_size=3,
                        metrics={"acc": torch.tensor(0.75)})
        elif i == 1:
            traceml.log(loss=0.25, components=many)
        elif i == 2:
            traceml.log(loss=float("inf"), examples=40)
"""
    proc = _script(tmp_path, body)
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "run" / "ranks" / "rank_0" / "steps-0.jsonl").read_bytes().splitlines(keepends=True)
    step_lines = [line for line in lines if b'"kind":"step"' in line]
    assert len(step_lines) == 4
    for line in step_lines:
        assert records.encode(records.decode(line)) == line
    steps = [records.decode(line) for line in step_lines]
    assert len(step_lines[1]) > 4096 and len(step_lines[2]) < 1024
    assert (steps[0].loss, steps[0].lr, steps[0].grad_norm, steps[0].metrics) == (0.5, 0.1, None, {"acc": 0.75})
    assert len(steps[1].components) == 60 and steps[1].components["c000"].ratio == 0.25
    assert steps[2].loss is None and [s.examples for s in steps] == [3, 3, 40, 40]
    assert steps[3].loss is None and steps[3].lr is None and steps[3].components is None
    assert all(s.mem is not None and s.mem.rss and s.mem.rss > 0 for s in steps)


def test_a_nested_trace_step_is_ignored_once_said_and_a_negative_count_refused(tmp_path: Path) -> None:
    """A trace_step inside an open step recorded a second step per iteration (5 iterations, 10 steps); the outer
    step is the one recorded, its time the whole, and one line says the inner one is ignored. A negative
    batch size made ``examples`` count down (-12 after 4 steps): refused."""
    body = """import time
for i in range(5):
    with traceml.trace_step():
        with traceml.trace_step():
            time.sleep(0.01)
        time.sleep(0.005)
        traceml.log(loss=1.0, batch_size=3)
for bad in ({"batch_size": -3}, {"examples": -1}):
    try:
        traceml.log(**bad)
    except ValueError as exc:
        print(exc)
"""
    proc = _script(tmp_path, body)
    assert proc.returncode == 0, proc.stderr
    steps = [r for r in _records(tmp_path) if isinstance(r, records.Step)]
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    assert all(s.cpu_ms.step >= 15.0 for s in steps)  # the outer envelope: both sleeps
    assert [s.examples for s in steps] == [3, 6, 9, 12, 15]
    assert proc.stderr.count("trace_step inside a step already traced") == 1
    assert proc.stdout.splitlines() == ["batch_size must be >= 0, not -3",
                                        "examples must be a count of examples seen (>= 0), not -1"]
