"""Read back what Trackio stored, through Trackio's own API (seed 004: verify through the server).

The reader calls the functions Trackio's server answers on its HTTP API
(``get_run_summary``, ``get_snapshot``): in this process for the local store
(``TRACKIO_DIR``), or over HTTP with Trackio's own client for a self-hosted
server. It never opens the store's files itself, so what it sees is what a
dashboard sees. The exporter uses it three ways (docs/export.md): a Trackio run
that another run directory already fills is refused, the description and group
are checked after every delivery, and the first published measurements are
compared with what was sent.
"""

from __future__ import annotations

import contextlib
import io
import math
from typing import Any, Optional


class ReadBackUnavailable(RuntimeError):
    """Trackio could not be asked (a server outage): nothing is known about what it stored."""


class TrackioReader:
    """What one Trackio destination stored: the local store (``server_url`` None) or a server."""

    def __init__(self, server_url: Optional[str] = None) -> None:
        self.server_url = server_url
        self._client: Any = None

    def _call(self, api_name: str, **kwargs: Any) -> Any:
        chatter = io.StringIO()  # Trackio's console messages stay off the exporter's report
        try:
            with contextlib.redirect_stdout(chatter):
                if self.server_url is None:
                    from trackio import server  # the functions behind Trackio's HTTP API, run here

                    return getattr(server, api_name)(**kwargs)
                if self._client is None:
                    from trackio.remote_client import RemoteClient

                    self._client = RemoteClient(self.server_url)
                return self._client.predict(api_name=f"/{api_name}", **kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure to ask is "unknown", never "differs"
            raise ReadBackUnavailable(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}") \
                from None

    def run_config(self, project: str, run: str) -> dict:
        """The config Trackio stored for ``run`` (``{}`` when the project has no such run with entries)."""
        summary = self._call("get_run_summary", project=project, run=run)
        config = summary.get("config") if isinstance(summary, dict) else None
        return config if isinstance(config, dict) else {}

    def values_at(self, project: str, run: str, step: int) -> dict[str, list[Any]]:
        """Every value Trackio stored for ``run`` at ``step``, per metric, in the order stored.

        A step logged twice (by another writer, or an earlier publish) holds two
        values: a dashboard shows both, so the read-back sees both.
        """
        snapshot = self._call("get_snapshot", project=project, run=run, step=int(step))
        out: dict[str, list[Any]] = {}
        for key, entries in (snapshot.items() if isinstance(snapshot, dict) else ()):
            for entry in entries if isinstance(entries, list) else ():
                if isinstance(entry, dict) and entry.get("step") == step:
                    out.setdefault(key, []).append(entry.get("value"))
        return out


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def differences(sent: dict[str, float], stored: dict[str, list[Any]]) -> list[str]:
    """``key: sent X, stored Y`` for every sent point Trackio does not hold exactly, and only, at its step.

    JSON keeps a float exact, so equal means equal: no tolerance.
    """
    out = []
    for key in sorted(sent):
        values = stored.get(key) or []
        if not values or any(_number(v) != sent[key] for v in values):
            shown = ", ".join(repr(v)[:40] for v in values[:3]) or "nothing"
            out.append(f"{key}: sent {sent[key]!r}, stored {shown}")
    return out
