"""`traceml watch` in a real terminal (tmux) on the seed's CPU DDP example while it trains."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(170),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
    pytest.mark.xdist_group("external"),  # a real terminal: one such test at a time (README, test lanes)
]


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30).stdout


def _wait_pane(sock: str, target: str, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = _tmux(sock, "capture-pane", "-p", "-t", target)
        if re.search(pattern, text, re.MULTILINE):
            return text
        time.sleep(0.3)
    # A blank screen alone says nothing: say whether the pane's program died (Textual draws on
    # stderr, so it cannot be redirected; remain-on-exit keeps its last words on the pane).
    pane = _tmux(sock, "list-panes", "-t", target, "-F",
                 "dead=#{pane_dead} status=#{pane_dead_status} size=#{pane_width}x#{pane_height}")
    every = _tmux(sock, "list-panes", "-a", "-F", "#{session_name} #{pane_width}x#{pane_height}")
    raise AssertionError(f"pane {target} never showed {pattern!r} ({pane.strip() or 'no pane'}; {every!r}); "
                         f"last screen:\n{text}")


def _header(screen: str) -> str:
    """The Runs table's column header line."""
    return next((line for line in screen.splitlines() if line.split()[:2] == ["Status", "Run"]), "")


def test_watch_in_tmux_shows_training_run_and_ranks(tmp_path, cli_env):
    shutil.copy(REPO / "examples" / "traceml.yaml", tmp_path / "traceml.yaml")
    (tmp_path / "logs").mkdir()
    sock = f"traceml-test-{os.getpid()}"
    env = " ".join(f"{k}={shlex.quote(cli_env[k])}" for k in ("XDG_STATE_HOME", "OMP_NUM_THREADS", "PATH"))
    watch = (f"cd {shlex.quote(str(tmp_path))} && env {env} TERM=xterm-256color "
             f"{shlex.quote(sys.executable)} -m traceml_tui watch logs")
    # No user tmux.conf, and a pane whose program exits stays visible for the failure message.
    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g remain-on-exit on\n")
    train = None
    try:
        for name, (w, h) in (("small", (80, 24)), ("large", (200, 50))):
            subprocess.run(["tmux", "-L", sock, "-f", str(conf), "new-session", "-d", "-s", name, "-x", str(w), "-y", str(h), watch],
                           check=True, timeout=30)
        for name in ("small", "large"):
            _wait_pane(sock, name, r"No runs yet", 60)
        train = subprocess.Popen(
            [sys.executable, "-m", "traceml_tui", "run", str(REPO / "examples" / "distributed" / "ddp_minimal.py"),
             "--run-name", "tmux-ddp", "--nproc-per-node", "2", "--args", "--steps", "1200"],
            cwd=tmp_path, env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # The run appears without a keypress. (Topo is an optional column: the values' widths may push it right,
        # reachable by scrolling, docs/watch.md "Tables".)
        for name in ("small", "large"):
            _wait_pane(sock, name, r"[▶✓] (running|completed)\s+tmux-ddp\s", 90)
        seen_running = train.poll() is None
        # 80×24: the attention columns fit without scrolling; scrolled right, the view stays put across
        # refreshes of the live run (poll 0.25 s: 1.5 s is six refreshes), with Status and Run pinned.
        header = _header(_tmux(sock, "capture-pane", "-p", "-t", "small"))
        assert all(word in header.split() for word in ("Status", "Run", "Step", "Steps/s", "Err")), header
        for _ in range(6):
            _tmux(sock, "send-keys", "-t", "small", "Right")
        time.sleep(0.8)
        scrolled = _header(_tmux(sock, "capture-pane", "-p", "-t", "small"))
        assert scrolled != header and scrolled.split()[:2] == ["Status", "Run"], (header, scrolled)
        time.sleep(1.5)
        assert _header(_tmux(sock, "capture-pane", "-p", "-t", "small")) == scrolled
        for name in ("small", "large"):
            _tmux(sock, "send-keys", "-t", name, "Enter")
        for name in ("small", "large"):
            # rank, node, state ("running 0s" / "completed"), step — for both ranks on one screen (a rank's first
            # records can reach the index a poll after its peer's: the SDK holds short updates up to 20 ms)
            row = r"^\s*{}\s+\d+\s+[▶✓]\s+(running \S+|completed)\s+\d+"
            text = _wait_pane(sock, name, rf"(?s){row.format(0)}.*{row.format(1)}", 30)
            assert "Rank" in text and re.search(r"[▶✓] (RUNNING|COMPLETED)", text), text
        large = _tmux(sock, "capture-pane", "-p", "-t", "large")
        assert "Step time per rank" in large
        assert seen_running, "training had already finished before the run showed up"
    finally:
        if train is not None:
            train.wait(timeout=120)
        _tmux(sock, "kill-server")
