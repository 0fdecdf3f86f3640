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
