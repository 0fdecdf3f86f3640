"""One glyph before every state word, so a state reads the same without colour (NO_COLOR, 16 colours).

Keyed by the values of the core's enums (``traceml_tui/core/state.py``); every
widget that shows a state word shows it as ``"<glyph> <word>"`` through
:func:`run_label`, :func:`rank_label` or :func:`backlog_label`. The word always
follows the glyph: the glyph adds, it never replaces.
"""

from __future__ import annotations

from traceml_tui.core.state import BacklogState, RankState, RunStatus

RUN_GLYPHS: dict[str, str] = {
    RunStatus.FAILED.value: "✗",
    RunStatus.LOST.value: "?",
    RunStatus.STALLED.value: "⚠",
    RunStatus.INTERRUPTED.value: "■",
    RunStatus.RUNNING.value: "▶",
    RunStatus.COMPLETED.value: "✓",
    RunStatus.MISSING.value: "·",
}
#: A rank shares its run's glyphs; ``aborted`` (it failed because another rank failed first) and ``waiting`` (in
#: a collective a hung peer never reached) are a rank's only.
RANK_GLYPHS: dict[str, str] = {s.value: RUN_GLYPHS.get(s.value, "↯") for s in RankState}
RANK_GLYPHS[RankState.WAITING.value] = "…"
BACKLOG_GLYPHS: dict[str, str] = {
    BacklogState.FAILED.value: "✗",
    BacklogState.BLOCKED.value: "✗",
    BacklogState.STALE_CLAIM.value: "⚠",
    BacklogState.CLAIMED.value: "▶",
    BacklogState.PENDING.value: "…",
    BacklogState.COMPLETED.value: "✓",
}
#: Every glyph in use (a reader of a cell strips one of these before the word).
ALL_GLYPHS: frozenset[str] = frozenset({*RUN_GLYPHS.values(), *RANK_GLYPHS.values(), *BACKLOG_GLYPHS.values()})


def _label(table: dict[str, str], word: str, shown: str | None = None) -> str:
    glyph = table.get(str(word).lower())
    text = str(word) if shown is None else shown
    return f"{glyph} {text}" if glyph else text


def run_label(status: str, shown: str | None = None) -> str:
    """``"✗ failed"``; ``shown`` replaces the text after the glyph (e.g. ``"FAILED — silent rank 2"``)."""
    return _label(RUN_GLYPHS, status, shown)


def rank_label(state: str, shown: str | None = None) -> str:
    """``"⚠ STALLED 40s"`` for ``rank_label("stalled", "STALLED 40s")``."""
    return _label(RANK_GLYPHS, state, shown)


def backlog_label(state: str) -> str:
    """``"⚠ stale-claim"``."""
    return _label(BACKLOG_GLYPHS, state)
