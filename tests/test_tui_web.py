"""`traceml watch --web`: the same app served by textual-serve, driven by a real headless Chromium.

The browser draws the terminal on a canvas, so the test reads what the app sends it: the WebSocket
frames (terminal output), with the escape sequences stripped.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from support.fixture_runs import FIXTURE_RUNS, name_of

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.xdist_group("external")  # a real browser: one such test at a time (README, test lanes)
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-B]|\x1b[=>]")


def test_web_flags_are_checked(tmp_path, traceml_cmd, cli_env):
    for argv, words in ((["--host", "0.0.0.0"], "go with --web"),
                        (["--web", "--host", "0.0.0.0"], "--public"),
                        (["--web", "--port", "0"], "--port")):
        proc = subprocess.run([*traceml_cmd, "watch", str(tmp_path), *argv], env=cli_env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs Debian's chromium)")
def test_browser_shows_the_runs_and_opens_one(tmp_path, cli_env, traceml_cmd):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (test extra)")
    root = tmp_path / "logs"
    shutil.copytree(FIXTURE_RUNS, root, ignore=shutil.ignore_patterns("*.md", "facts.json"))
    port = _free_port()
    server = subprocess.Popen([*traceml_cmd, "watch", str(root), "--web", "--port", str(port)], env=cli_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    frames: list[str] = []

    def screen_text() -> str:
        return ANSI.sub("", "".join(frames))

    def wait_for(pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, screen_text()):
                return
            page.wait_for_timeout(200)
        raise AssertionError(f"the browser never got {pattern!r}; got: {screen_text()[-1500:]!r}")

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    said = server.stderr.read() if server.poll() is not None else ""
                    raise AssertionError(f"the web server never answered: {said}") from None
                time.sleep(0.3)
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 820})

                def on_socket(ws) -> None:
                    ws.on("framereceived", lambda payload: frames.append(
                        payload if isinstance(payload, str) else payload.decode("utf-8", "replace")))

                page.on("websocket", on_socket)
                page.goto(url)
                for case in ("completed", "rank_raises", "hygiene", "hung"):
                    wait_for(re.escape(name_of(case)), 90)
                wait_for(r"failed", 30)
                page.wait_for_timeout(1500)  # let the first frames settle before the picture
                # TRACEML_UPDATE_SCREENSHOTS=1 refreshes the README's picture of the web view.
                shot = REPO / "screenshots" if os.environ.get("TRACEML_UPDATE_SCREENSHOTS") else tmp_path
                page.screenshot(path=str(shot / "web.png"))
                # Open the selected run (the newest first) with the keyboard, as in a terminal.
                page.mouse.click(700, 400)
                frames.clear()
                page.keyboard.press("Enter")
                wait_for(r"Rank", 30)
                wait_for(r"Step time per rank|State", 30)
            finally:
                browser.close()
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()
    assert not any(p.name == "index.sqlite" for p in root.rglob("*"))  # the index lives in the state dir
