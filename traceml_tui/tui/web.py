"""`traceml watch --web`: the app served to browsers by textual-serve, behind an access token (docs/cluster.md).

textual-serve's own page names the server by the address it bound
(``ws://127.0.0.1:8000/ws``) and loads its font from the internet. Ours
(``web_page/app_index.html``) uses only URLs relative to the page, so it works
behind ``ssh -L 9999:127.0.0.1:8000`` on any local port, and the font textual-serve
ships. Every request needs the access token printed at start, Jupyter style:
``http://127.0.0.1:8000/?token=…`` opens the page and leaves a cookie
(HttpOnly, SameSite=Strict) that the page's own requests — its scripts, its
WebSocket — carry; anything else gets 403. A WebSocket whose ``Origin`` is not
the page's own is refused too. ``--no-token`` serves without a token (then only
a loopback ``Host`` is answered unless ``--public``, so a web page elsewhere
cannot reach the port by DNS rebinding).

Only imported for ``--web`` (textual-serve and aiohttp are an optional extra).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional
from urllib.parse import urlsplit

import aiohttp_jinja2
from aiohttp import web
from textual_serve.server import Server, to_int

#: Our page (relative URLs, no external asset); textual-serve's static files (script, css, fonts) are served as is.
PAGE_DIR = Path(__file__).resolve().parent / "web_page"
#: The query parameter that carries the token.
TOKEN_PARAM = "token"

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def new_token() -> str:
    """A random access token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def page_url(host: str, port: int, token: Optional[str]) -> str:
    """The URL to open, as printed at start: ``http://127.0.0.1:8000/?token=…``."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/" + (f"?{TOKEN_PARAM}={token}" if token else "")


def is_loopback_name(host: str) -> bool:
    """Whether ``host`` (a Host header's name, no port) names this machine's loopback."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def refusal(*, token: Optional[str], public: bool = False, query_token: Optional[str], cookie: Optional[str],
            host_header: str, origin: Optional[str], websocket: bool) -> Optional[str]:
    """Why a request is refused (403), or None to serve it. Pure: the rules of the guard, testable alone."""
    if websocket and origin is not None and _netloc(origin) != host_header.lower():
        return "this app's WebSocket answers its own page only"
    if token is None:
        if not public and not is_loopback_name(_netloc("//" + host_header, hostname=True) or ""):
            return "served without a token: only a loopback address (127.0.0.1, localhost) is answered"
        return None
    for given in (query_token, cookie):
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            return None
    if query_token is not None:
        return "wrong access token: open the URL `traceml watch --web` printed (…/?token=…)"
    return "this page needs the access token: open the URL `traceml watch --web` printed (…/?token=…)"


def _netloc(url: str, hostname: bool = False) -> Optional[str]:
    """The ``host:port`` (lower case) or the bare host name of ``url``; None when it does not parse."""
    try:
        parts = urlsplit(url)
        return parts.hostname if hostname else parts.netloc.lower()
    except ValueError:  # e.g. an unclosed "[" in a header: refused, never a server error
        return None


class WatchServer(Server):
    """textual-serve's server with our page and the token guard in front of every route."""

    def __init__(self, command: str, *, host: str, port: int, token: Optional[str], title: str,
                 public: bool = False) -> None:
        super().__init__(command, host=host, port=port, title=title, templates_path=PAGE_DIR)
        self.token = token
        self.public = public
        # One cookie per token: two servers on one host (two ports) do not overwrite each other's.
        digest = hashlib.sha256(token.encode()).hexdigest()[:12] if token else "open"
        self.cookie_name = f"traceml-watch-{digest}"

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._guard)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        problem = refusal(token=self.token, public=self.public, query_token=request.query.get(TOKEN_PARAM),
                          cookie=request.cookies.get(self.cookie_name), host_header=request.headers.get("Host", ""),
                          origin=request.headers.get("Origin"),
                          websocket=request.headers.get("Upgrade", "").lower() == "websocket")
        if problem is not None:
            return web.Response(status=403, text=f"403 Forbidden: {problem}\n")
        return await handler(request)

    async def handle_index(self, request: web.Request) -> web.StreamResponse:  # type: ignore[override]
        """The page; a token given in the URL is kept in a cookie for the page's own requests."""
        context: dict[str, Any] = {"title": self.title, "font_size": to_int(request.query.get("fontsize", "16"), 16)}
        response = aiohttp_jinja2.render_template("app_index.html", request, context)
        response.headers["Cache-Control"] = "no-store"
        response.headers["Referrer-Policy"] = "no-referrer"  # the token in the URL never travels further
        if self.token is not None and request.query.get(TOKEN_PARAM):
            response.set_cookie(self.cookie_name, self.token, httponly=True, samesite="Strict", path="/")
        return response

    def initialize_logging(self) -> None:
        """textual-serve's logging, without the access log: a request line would print the token in its URL."""
        super().initialize_logging()
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    async def on_startup(self, app: web.Application) -> None:
        """Quiet: `traceml watch` prints its own line (with the URL to open) before serving."""
