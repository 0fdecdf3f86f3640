"""`traceml watch` keys in a real terminal (tmux, 80×24) on the committed real runs.

The Runs footer shows Open at 80 columns; `j` then Enter opens the second run; `q` on the Run screen
returns to Runs (it quit the whole app); `q` on Runs quits.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from support import fixture_runs as fr

pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

#: A Runs row starts with a state glyph; its cells are apart by two spaces or more (Status, then Run).
ROW = re.compile(r"^\s*[✗?⚠■▶✓·] ")


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30).stdout


def _wait(sock: str, what, timeout: float = 60.0) -> str:
    """The pane's text once ``what(text)`` holds (polled; a loaded machine only makes it slower)."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = _tmux(sock, "capture-pane", "-p", "-t", "w")
        if what(text):
            return text
        time.sleep(0.3)
    pane = _tmux(sock, "list-panes", "-t", "w", "-F", "dead=#{pane_dead} status=#{pane_dead_status}")
    raise AssertionError(f"the pane never showed what was awaited ({pane.strip()}); last screen:\n{text}")


def _run_names(text: str) -> list[str]:
    return [re.split(r"\s{2,}", line.strip())[1] for line in text.splitlines() if ROW.match(line)]


def test_j_enter_opens_the_second_run_and_q_comes_back(tmp_path, cli_env):
    shutil.copytree(fr.FIXTURE_RUNS, tmp_path / "logs", ignore=shutil.ignore_patterns("*.md", "facts.json"))
    sock = f"traceml-keys-{os.getpid()}"
    env = " ".join(f"{k}={shlex.quote(cli_env[k])}" for k in ("XDG_STATE_HOME", "OMP_NUM_THREADS", "PATH"))
    pythonpath = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])}" if os.environ.get("PYTHONPATH") else ""
    watch = (f"cd {shlex.quote(str(tmp_path))} && env {env} {pythonpath} TERM=xterm-256color "
             f"{shlex.quote(sys.executable)} -m traceml_tui watch logs")
    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g remain-on-exit on\nset -g status off\n")
    try:
        subprocess.run(["tmux", "-L", sock, "-f", str(conf), "new-session", "-d", "-s", "w", "-x", "80", "-y", "24",
                        watch], check=True, timeout=30)
        # The footer is the screen's last line; it is drawn after the table has the focus.
        runs = _wait(sock, lambda t: len(_run_names(t)) >= 3 and "need attention" in t
                     and re.search(r"⏎ Open\s+l Log\s+d Describe", t.rstrip("\n").splitlines()[-1]), 90)
        second = _run_names(runs)[1]
        _tmux(sock, "send-keys", "-t", "w", "j")
        time.sleep(0.5)  # the cursor moves on its own key; Enter is a second keypress, as a user types it
        _tmux(sock, "send-keys", "-t", "w", "Enter")
        # The Run screen's header names its run (once its first snapshot is in): the second row's.
        # The Run screen's footer says how to go back.
        _wait(sock, lambda t: "Rank" in t and "need attention" not in t and f"— {second}" in t.splitlines()[0]
              and re.search(r"esc Back\s+l Log\s+d Describe", t.rstrip("\n").splitlines()[-1]))
        _tmux(sock, "send-keys", "-t", "w", "q")
        back = _wait(sock, lambda t: "need attention" in t)
        assert _tmux(sock, "list-panes", "-t", "w", "-F", "#{pane_dead}").strip() == "0", back
        _tmux(sock, "send-keys", "-t", "w", "q")  # on Runs, q quits
        _wait(sock, lambda t: _tmux(sock, "list-panes", "-t", "w", "-F", "#{pane_dead}").strip() == "1")
    finally:
        _tmux(sock, "kill-server")
