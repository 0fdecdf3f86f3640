"""The bootstrap `traceml run` starts each rank through runs the script exactly as ``python SCRIPT`` would.

Each case runs a small script both ways (plain ``python`` and ``python -m traceml_tui.integrations.bootstrap``)
and compares what the script saw: argv, path, ``__file__``, ``__name__``, exit status, tracebacks. No
framework is needed (and none may be imported by the bootstrap itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.run.launch import BOOTSTRAP
from traceml_tui.run.options import LaunchOptions

PROBE = r'''
import json, os, sys
report = {
    "argv": sys.argv, "path0": sys.path[0], "file": __file__, "name": __name__,
    "main_is_me": sys.modules["__main__"].__dict__ is globals(),
    "frameworks": sorted(m for m in ("transformers", "lightning", "pytorch_lightning", "torch") if m in sys.modules),
    "traceml": sorted(m for m in sys.modules if m.split(".")[0] == "traceml_tui"),
    "hooks": [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "TrainerFinder"],
}
print(json.dumps(report))
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "exit":
    sys.exit(7)
if mode == "raise":
    raise ValueError("boom from the script")
'''


def _run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, **env)
    full.pop("TRACEML_RUN_DIR", None)
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=60)


@pytest.fixture
def probe(tmp_path) -> tuple[Path, Path]:
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return cwd, Path("..") / "scripts" / "probe.py"


@pytest.mark.parametrize("mode", ["ok", "exit", "raise"])
def test_the_script_runs_as_if_started_directly(probe, mode):
    cwd, script = probe
    direct = _run([sys.executable, str(script), mode, "--flag"], cwd)
    booted = _run([sys.executable, "-m", BOOTSTRAP, str(script), mode, "--flag"], cwd)
    assert booted.returncode == direct.returncode == {"ok": 0, "exit": 7, "raise": 1}[mode]
    seen_direct, seen_booted = json.loads(direct.stdout), json.loads(booted.stdout)
    assert seen_booted.pop("hooks") == ["TrainerFinder"] and seen_direct.pop("hooks") == []
    assert seen_booted.pop("traceml") and seen_direct.pop("traceml") == []  # (the bootstrap is traceml's)
    assert seen_booted == seen_direct  # argv, sys.path[0], __file__, __name__, no framework imported
    assert seen_booted["argv"] == [str(script), mode, "--flag"] and seen_booted["frameworks"] == []
    if mode == "raise":
        assert booted.stderr.strip().splitlines()[-1] == direct.stderr.strip().splitlines()[-1] == \
            "ValueError: boom from the script"


def test_the_environment_kill_switch_installs_no_hook(probe):
    cwd, script = probe
    booted = _run([sys.executable, "-m", BOOTSTRAP, str(script)], cwd, TRACEML_AUTO_ATTACH="0")
    assert booted.returncode == 0 and json.loads(booted.stdout)["hooks"] == []


@pytest.mark.parametrize("switch", ["flag", "environment"])
def test_the_kill_switches_reach_the_ranks_of_traceml_run(probe, tmp_path, switch):
    """``traceml run --no-auto-attach`` starts the rank as plain ``python SCRIPT`` (no traceml code in it at all);
    ``TRACEML_AUTO_ATTACH=0`` in the launcher's environment starts it through the bootstrap, which installs no
    import hook. Either way nothing can attach to a trainer the script builds (the hook is the only way in,
    docs/trainers.md), the script runs as it would alone, and the rank records nothing."""
    cwd, script = probe
    logs = tmp_path / "logs"
    flag, env = (["--no-auto-attach"], {}) if switch == "flag" else ([], {"TRACEML_AUTO_ATTACH": "0"})
    done = _run([sys.executable, "-m", "traceml_tui", "run", str(script), "--run-name", "off", "--logs-dir", str(logs),
                 *flag], cwd, XDG_STATE_HOME=str(tmp_path / "state"), **env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = (logs / "off" / "nodes" / "node_0" / "training.stdout.log").read_text()
    seen = json.loads(out[out.index("{"):out.rindex("}") + 1])
    assert seen["hooks"] == [] and seen["main_is_me"] and seen["frameworks"] == []
    assert seen["argv"] == [str(script)]
    if switch == "flag":
        assert seen["traceml"] == []  # not even the bootstrap
    else:
        # the bootstrap ran (it asked whether to attach) and imported no hook
        assert "traceml_tui.integrations.support" in seen["traceml"]
        assert "traceml_tui.integrations.hooks" not in seen["traceml"]
    assert "detected: traceml callback added" not in done.stderr
    assert not any((logs / "off").glob("ranks/*/*.jsonl"))


def test_launcher_starts_ranks_through_the_bootstrap_unless_told_not_to(tmp_path):
    from traceml_tui.guard.config import TracemlConfig
    from traceml_tui.run.launch import Launcher

    def command(nproc: int, auto_attach: bool) -> list[str]:
        options = LaunchOptions(script=Path("train.py"), script_args=("--lr", "1"), run_name="r", logs_dir=tmp_path,
                                nproc_per_node=nproc, nnodes=1, node_rank=0, master_addr="127.0.0.1",
                                master_port=None, trace_max_steps=None, finalize_timeout=60.0,
                                auto_attach=auto_attach)
        return Launcher(options, config=TracemlConfig()).command()

    assert command(1, True)[1:] == ["-u", "-m", BOOTSTRAP, "train.py", "--lr", "1"]
    assert command(2, True)[-5:] == ["-m", BOOTSTRAP, "train.py", "--lr", "1"]
    assert command(1, False)[1:] == ["-u", "train.py", "--lr", "1"]
    assert BOOTSTRAP not in command(2, False)


def test_no_auto_attach_flag_is_parsed(tmp_path):
    from traceml_tui.run.cli import parse_options

    script = tmp_path / "train.py"
    script.write_text("")
    assert parse_options([str(script)]).auto_attach is True
    assert parse_options([str(script), "--no-auto-attach"]).auto_attach is False


def test_importing_the_integrations_imports_no_framework():
    code = ("import sys, traceml_tui.integrations.hf, traceml_tui.integrations.lightning, "
            "traceml_tui.integrations.pytorch_lightning, traceml_tui.integrations.bootstrap; "
            "print(sorted(m for m in ('transformers','lightning','pytorch_lightning','torch') if m in sys.modules))")
    out = _run([sys.executable, "-c", code], Path.cwd())
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


ENDS = r'''
import atexit, os, sys, threading, time
import traceml_tui as traceml

traceml.init(run_name="ends", logs_dir="logs")
with traceml.trace_step():
    pass
mode = sys.argv[1]
if mode == "exit3":
    sys.exit(3)
if mode == "exit-text":
    sys.exit("a message instead of a code")
if mode == "exit0":
    sys.exit(0)
if mode == "raise":
    raise ValueError("boom")
if mode == "abort":
    atexit.register(os.abort)  # a crash while the interpreter shuts down, after the script returned
if mode == "thread":
    def more():  # a non-daemon thread still training after the script's body returned
        time.sleep(0.3)
        with traceml.trace_step():
            pass
    threading.Thread(target=more).start()
'''


def _rank_end(cwd: Path) -> tuple[str, object, int]:
    lines = [json.loads(ln) for ln in (cwd / "logs/ends/ranks/rank_0/steps-0.jsonl").read_text().splitlines()]
    (end,) = [r for r in lines if r["kind"] == "rank_end"]
    assert lines[-1] is end
    return end["status"], end["exit_code"], sum(r["kind"] == "step" for r in lines)


@pytest.mark.parametrize("mode,status,code,returncode", [
    ("ok", "completed", None, 0),
    ("exit0", "completed", None, 0),
    ("exit3", "exited", 3, 3),
    ("exit-text", "exited", 1, 1),
    ("raise", "failed", 1, 1),
    ("abort", "completed", None, -6),
])
def test_the_bootstrap_ends_the_rank_as_the_script_body_ends(tmp_path, mode, status, code, returncode):
    """Under the bootstrap the rank's ``rank_end`` says how the script's body ended, written before the interpreter
    shuts down: ``completed`` when it returned (so a crash at exit reads as a crash in teardown, after training:
    core/state.py ``crashed_in_teardown``), ``exited`` with the code of a ``sys.exit(n)``, which the exit hook
    alone cannot see."""
    (tmp_path / "ends.py").write_text(ENDS)
    proc = _run([sys.executable, "-m", BOOTSTRAP, "ends.py", mode], tmp_path)
    assert proc.returncode == returncode, proc.stderr
    assert _rank_end(tmp_path) == (status, code, 1)


def test_without_the_bootstrap_the_exit_hook_ends_the_rank(tmp_path):
    """Started directly, a ``sys.exit(3)`` leaves ``exited`` without a code (the launcher's report has it) and a
    crash at exit leaves no end record: what the bootstrap adds."""
    (tmp_path / "ends.py").write_text(ENDS)
    assert _run([sys.executable, "ends.py", "exit3"], tmp_path).returncode == 3
    assert _rank_end(tmp_path) == ("exited", None, 1)


def test_a_thread_still_training_after_the_script_returned_keeps_the_end_for_exit(tmp_path):
    (tmp_path / "ends.py").write_text(ENDS)
    proc = _run([sys.executable, "-m", BOOTSTRAP, "ends.py", "thread"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _rank_end(tmp_path) == ("exited", None, 2)  # the thread's step is recorded; the exit hook ended it
