"""``TraceMLCallback`` for the ``pytorch_lightning`` namespace (the same callback as
:mod:`traceml_tui.integrations.lightning`, on ``pytorch_lightning.Callback``; docs/trainers.md).

Importing this module does not import pytorch_lightning; the class is built on first use.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "TraceMLCallback":
        from traceml_tui.integrations.lightning import callback_class

        return callback_class("pytorch_lightning")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
