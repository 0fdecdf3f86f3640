"""Reading a run's manifest.json from commands that act on one run (core.artifacts.read_manifest).

Found fuzzing: `traceml validate status` and `traceml curve` read the manifest with a plain read, so a FIFO
named manifest.json made them wait for ever, and a link to /dev/zero read until memory ran out. The file is
now opened without blocking and read only when it is a regular file of manifest size.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.core import artifacts

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "runs" / "hygiene"


def test_a_manifest_is_read_and_anything_but_a_regular_file_of_manifest_size_refused(tmp_path):
    assert artifacts.read_manifest(FIXTURE / "manifest.json").run_name == "hygiene"
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        artifacts.read_manifest(fifo)  # at once: never waits for a writer
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    with pytest.raises(OSError, match="not a regular file"):
        artifacts.read_manifest(zero)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (artifacts.MAX_MANIFEST_BYTES + 1))
    with pytest.raises(OSError, match="larger than"):
        artifacts.read_manifest(big)
    with pytest.raises(FileNotFoundError):
        artifacts.read_manifest(tmp_path / "missing.json")
    (tmp_path / "other.json").write_text('{"x": 1}')
    assert artifacts.read_manifest(tmp_path / "other.json") is None  # read, not a manifest


@pytest.mark.parametrize("command", [["validate", "status"], ["curve"]])
def test_run_commands_do_not_wait_on_a_fifo_manifest(tmp_path, cli_env, command):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    (run / "manifest.json").unlink()
    os.mkfifo(run / "manifest.json")
    extra = ["--out", str(tmp_path / "c.png")] if command == ["curve"] else []
    proc = subprocess.run([sys.executable, "-m", "traceml_tui", *command, str(run), *extra], env=cli_env,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 0, proc.stderr  # the manifest unreadable: the declared defaults, as without one
