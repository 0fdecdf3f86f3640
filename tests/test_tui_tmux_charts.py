"""`traceml watch` in a real terminal (tmux) at 100×30: the Run screen's braille charts and heatmap (issue 23).

The run is the committed real 2-rank DDP run (``tests/fixtures/runs/completed``,
written by the real SDK through ``traceml run``), indexed by the watch's own
embedded ingester; the screen is read back with ``tmux capture-pane -e`` (the
characters and their colours as the terminal got them).
"""

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

from support import fixture_runs as fr

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(150),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

BRAILLE = re.compile("[\u2801-\u28ff]")
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30).stdout


def _wait_pane(sock: str, pattern: str, timeout: float, escapes: bool = False, braille: int = 0) -> str:
    """The pane once it shows ``pattern`` (and at least ``braille`` braille cells: the charts draw their lines
    after their frame, so a pane may show the title and axis a moment before the lines)."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = _tmux(sock, "capture-pane", "-p", *(["-e"] if escapes else []), "-t", "w")
        if re.search(pattern, text, re.MULTILINE) and len(BRAILLE.findall(text)) >= braille:
            return text
        time.sleep(0.3)
    size = _tmux(sock, "list-panes", "-t", "w", "-F", "#{pane_width}x#{pane_height} dead=#{pane_dead}").strip()
    raise AssertionError(f"the pane ({size}) never showed {pattern!r}; last screen:\n{text}")


def braille_colours(screen: str) -> set[str]:
    """The foreground colours the terminal drew braille cells in (SGR 30–37, 90–97, 38;5;n or 38;2;r;g;b)."""
    colours: set[str] = set()
    fg = "default"
    for line in screen.splitlines():
        at = 0
        for m in SGR.finditer(line + "\x1b[m"):
            if BRAILLE.search(line[at:m.start()]):
                colours.add(fg)
            at = m.end()
            params = m.group(1).split(";") if m.group(1) else ["0"]
            i = 0
            while i < len(params):
                p = params[i]
                if p in ("0", "39"):
                    fg = "default"
                elif p == "38" and i + 1 < len(params):
                    n = 3 if params[i + 1] == "5" else 5
                    fg = ";".join(params[i:i + n])
                    i += n - 1
                elif p.isdigit() and (30 <= int(p) <= 37 or 90 <= int(p) <= 97):
                    fg = p
                i += 1
    return colours


def test_run_screen_at_100x30_draws_braille_charts_and_an_aligned_heatmap(tmp_path, cli_env):
    logs = tmp_path / "logs"
    shutil.copytree(fr.FIXTURE_RUNS / fr.name_of("completed"), logs / fr.name_of("completed"))
    sock = f"traceml-charts-{os.getpid()}"
    env = " ".join(f"{k}={shlex.quote(cli_env[k])}" for k in ("XDG_STATE_HOME", "OMP_NUM_THREADS", "PATH"))
    if "PYTHONPATH" in cli_env:
        env += f" PYTHONPATH={shlex.quote(cli_env['PYTHONPATH'])}"
    # COLUMNS/LINES (set by some shells and pytest runners) would override the pane size Textual reads
    watch = (f"cd {shlex.quote(str(tmp_path))} && env -u COLUMNS -u LINES {env} TERM=xterm-256color "
             f"{shlex.quote(sys.executable)} -m traceml_tui watch logs")
    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g remain-on-exit on\n")
    try:
        subprocess.run(["tmux", "-L", sock, "-f", str(conf), "new-session", "-d", "-s", "w", "-x", "100", "-y", "30",
                        watch], check=True, timeout=30)
        _wait_pane(sock, r"✓ completed\s+completed\s", 90)
        _tmux(sock, "send-keys", "-t", "w", "Enter")
        # braille line charts (more than 40 cells), one colour per rank
        charts = _wait_pane(sock, r"Step time per rank \(ms\)[\s\S]*step", 60, braille=41)
        assert "rank 0" in charts and "rank 1" in charts
        coloured = _wait_pane(sock, r"Step time per rank", 10, escapes=True)
        assert len(braille_colours(coloured) - {"default"}) >= 2
        # The verdict line and the chart, grown with the pane, put the heatmap below the fold at 30 rows, and a
        # page scroll jumps past it: the pane grows taller (the width, which places the buckets, stays 100)
        _tmux(sock, "resize-window", "-t", "w", "-y", "48")
        screen = _wait_pane(sock, r"Straggler heatmap[\s\S]*step 8", 60)
        # the heatmap: both rank rows reach the column where the last step label ends
        lines = screen.splitlines()
        rows = [line.rstrip() for line in lines if re.match(r"\s*r[01] │", line)]
        axis = next(line.rstrip() for line in lines if re.search(r"step 1\s.*step 8$", line.rstrip()))
        assert len(rows) == 2
        last = len(axis) - 1  # the column under the "8" of "step 8"
        row_ends = [len(row) - 1 for row in rows]
        assert max(row_ends) == last, (rows, axis)  # the last bucket is drawn right above the last label
        shaded = [row for row in rows if row[-1] != " "]
        assert shaded, rows  # …and it is a real cell (rank 0 is the slower one at step 8 in this run)
    finally:
        _tmux(sock, "kill-server")
