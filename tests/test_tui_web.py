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
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.fixture_runs import FIXTURE_RUNS, name_of
from support.lanes import examples

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.xdist_group("external")  # a real browser: one such test at a time (README, test lanes)
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-B]|\x1b[=>]")


def test_web_flags_are_checked(tmp_path, traceml_cmd, cli_env):
    for argv, words in ((["--host", "0.0.0.0"], "go with --web"), (["--no-token"], "go with --web"),
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


class Forwarder:
    """A local TCP forwarder, as `ssh -L OTHER:127.0.0.1:PORT` is: the browser knows only its own port."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


class WebServer:
    """`traceml watch ROOT --web --port P [flags]` in its own session; its stderr goes to a file (read for the URL)."""

    def __init__(self, traceml_cmd, cli_env, root: Path, tmp_path: Path, *flags: str) -> None:
        self.port = _free_port()
        self.err_path = tmp_path / f"web-{self.port}.err"
        self.out_path = tmp_path / f"web-{self.port}.out"
        with open(self.err_path, "w") as err, open(self.out_path, "w") as out:
            self.proc = subprocess.Popen([*traceml_cmd, "watch", str(root), "--web", "--port", str(self.port), *flags],
                                         env=cli_env, stdout=out, stderr=err, start_new_session=True)

    def stderr(self) -> str:
        return self.err_path.read_text()

    def url(self, timeout: float = 60) -> str:
        """The URL the server printed, once it answers HTTP."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(r"serving the app on (http://\S+)", self.stderr())
            if found:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{self.port}/static/css/xterm.css", timeout=2)
                except urllib.error.HTTPError:
                    return found.group(1)  # it answers (403 without the token)
                except OSError:
                    pass
                else:
                    return found.group(1)
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"the web server never answered: {self.stderr()}")
            time.sleep(0.3)

    def stop(self) -> None:
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def _status(url: str, headers: Optional[dict] = None) -> int:
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10).status
    except urllib.error.HTTPError as exc:
        return exc.code


def _ws_status(port: int, headers: dict) -> int:
    """The status line's code of a WebSocket handshake on /ws (101: accepted)."""
    lines = ["GET /ws?width=80&height=24 HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13",
             *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return int(conn.recv(200).split(b" ", 2)[1])


def test_web_access_needs_the_printed_token(tmp_path, cli_env, traceml_cmd):
    """No token or a wrong one: 403 for the page, its files and its WebSocket; the printed URL opens it."""
    root = tmp_path / "logs"
    root.mkdir()
    server = WebServer(traceml_cmd, cli_env, root, tmp_path)
    try:
        url = server.url()
        token = parse_qs(urlsplit(url).query)["token"][0]
        assert urlsplit(url).netloc == f"127.0.0.1:{server.port}" and len(token) >= 40
        base = f"http://127.0.0.1:{server.port}/"
        for path in ("", "?token=", f"?token={token[:-1]}", "static/js/textual.js", "download/x"):
            assert _status(base + path) == 403, path
        assert _status(base, {"Cookie": f"traceml-watch-x={token}"}) == 403  # another server's cookie name
        assert _ws_status(server.port, {}) == 403
        page = urllib.request.urlopen(url, timeout=10)
        assert page.status == 200
        cookie = page.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and token in cookie
        pair = cookie.split(";", 1)[0]
        assert _status(base + "static/js/textual.js", {"Cookie": pair}) == 200
        # the page's own WebSocket carries the cookie; one opened by another site's page is refused
        assert _ws_status(server.port, {"Cookie": pair, "Origin": f"http://127.0.0.1:{server.port}"}) == 101
        assert _ws_status(server.port, {"Cookie": pair, "Origin": "http://evil.example"}) == 403
        html = page.read().decode()
        assert "127.0.0.1" not in html and str(server.port) not in html  # relative URLs only
        assert not re.search(r"(?:src|href)=\"(?:https?:)?//", html) and "googleapis" not in html
    finally:
        server.stop()
    said = server.stderr() + server.out_path.read_text()
    assert said.count(token) == 1, said  # printed once, to open; never again in a log of requests
    open_server = WebServer(traceml_cmd, cli_env, root, tmp_path, "--no-token")
    try:
        url = open_server.url()
        assert "token" not in url and "without an access token" in open_server.stderr()
        assert _status(url) == 200
        # without a token only a loopback Host is answered: a DNS-rebinding page cannot read it
        assert _status(url, {"Host": f"rebind.example:{open_server.port}"}) == 403
    finally:
        open_server.stop()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs Debian's chromium)")
def test_browser_shows_the_runs_and_opens_one(tmp_path, cli_env, traceml_cmd):
    """Through a forwarder on another port (as `ssh -L`), with the printed token; every request stays on it."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (test extra)")
    root = tmp_path / "logs"
    shutil.copytree(FIXTURE_RUNS, root, ignore=shutil.ignore_patterns("*.md", "facts.json"))
    server = WebServer(traceml_cmd, cli_env, root, tmp_path)
    frames: list[str] = []
    requests: list[str] = []
    failed: list[str] = []

    def screen_text() -> str:
        return ANSI.sub("", "".join(frames))

    def wait_for(pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, screen_text()):
                return
            page.wait_for_timeout(200)
        raise AssertionError(f"the browser never got {pattern!r}; got: {screen_text()[-1500:]!r}")

    forwarder = None
    try:
        printed = urlsplit(server.url())
        forwarder = Forwarder(server.port)
        url = f"http://127.0.0.1:{forwarder.port}/?{printed.query}"  # the printed URL, on the tunnel's port
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 820})

                def on_socket(ws) -> None:
                    requests.append(ws.url)
                    ws.on("framereceived", lambda payload: frames.append(
                        payload if isinstance(payload, str) else payload.decode("utf-8", "replace")))

                page.on("websocket", on_socket)
                page.on("request", lambda request: requests.append(request.url))
                page.on("requestfailed", lambda request: failed.append(f"{request.url} {request.failure}"))
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
                assert page.evaluate("document.fonts.check(\"16px 'Roboto Mono'\")")  # the local font loaded
            finally:
                browser.close()
    finally:
        if forwarder is not None:
            forwarder.close()
        server.stop()
    # The browser's network log: the page, its script, css, font and WebSocket, all through the forwarded port.
    assert any(u.startswith("ws://") for u in requests) and any(u.endswith(".ttf") for u in requests), requests
    assert {urlsplit(u).netloc for u in requests} == {f"127.0.0.1:{forwarder.port}"}, requests
    assert not failed, failed
    assert not any(p.name == "index.sqlite" for p in root.rglob("*"))  # the index lives in the state dir


_text = st.none() | st.text(max_size=60)


@settings(max_examples=examples(300), deadline=None)
@given(query=_text, cookie=_text, host=st.text(max_size=40), origin=_text, websocket=st.booleans())
def test_the_guard_serves_exactly_the_holders_of_the_token(query, cookie, host, origin, websocket):
    """Untrusted request values never raise; with a token a request is served iff it holds it (and a WebSocket's
    Origin is its Host); without one iff its Host is loopback (or --public)."""
    web = pytest.importorskip("traceml_tui.tui.web")
    token = "Zk3v9Q-token_example"

    def parsed(url: str, attr: str):
        try:
            return getattr(urlsplit(url), attr)
        except ValueError:
            return None

    netloc = parsed(origin, "netloc") if origin is not None else None
    same_origin = not websocket or origin is None or (netloc is not None and netloc.lower() == host.lower())
    served = web.refusal(token=token, query_token=query, cookie=cookie, host_header=host, origin=origin,
                         websocket=websocket) is None
    assert served == (same_origin and token in (query, cookie))
    hosted = web.refusal(token=None, query_token=query, cookie=cookie, host_header=host, origin=origin,
                         websocket=websocket) is None
    assert hosted == (same_origin and web.is_loopback_name(parsed("//" + host, "hostname") or ""))
    assert (web.refusal(token=None, public=True, query_token=query, cookie=cookie, host_header=host, origin=origin,
                        websocket=websocket) is None) == same_origin


def test_loopback_names():
    web = pytest.importorskip("traceml_tui.tui.web")
    for name in ("127.0.0.1", "127.0.0.2", "localhost", "LOCALHOST", "[::1]", "::1", "app.localhost"):
        assert web.is_loopback_name(name), name
    for name in ("", "10.0.0.1", "example.com", "localhost.example.com", "0.0.0.0", "[::]"):
        assert not web.is_loopback_name(name), name
