"""``early_stopping.json`` in the index: the policy's own state, stored as the side file it is (docs/daemon.md).

The ingester stores every side file's text in ``side_files`` (kind ``early_stopping`` for this one) with its
error; :func:`parse` decides both with the one decoder of the file,
:func:`traceml_tui.core.hygiene_files.decode_early_stopping`, so a damaged state is one error row naming the
file (and the reader shows no state) instead of figures read by a rule of our own. ``Reader.early_stopping``
turns the stored text into :class:`traceml_tui.core.stopping.StoppingView`.
"""

from __future__ import annotations

from typing import Optional

from traceml_tui.core import hygiene_files

#: The side-file kind :meth:`traceml_tui.core.rundir.RunDir.scan` gives ``early_stopping.json``.
KIND = "early_stopping"


def parse(rel: str, key: Optional[str], data: bytes, content: str):
    """The stored form of the file's bytes: ``(content, error)`` — content kept as read (any JSON object),
    error one line when the policy's decoder refuses it (``early_stopping.json: … - at `$.policy.patience```)."""
    try:
        hygiene_files.decode_early_stopping(data)
    except hygiene_files.DamagedFile as exc:
        return content, f"{rel}: {exc}"
    return content, None
