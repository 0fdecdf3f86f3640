"""What a run did not measure, in one set of words for every surface.

Two facts live here, decided once below the UI (docs/run.md, "Unmeasured
streams" and "A run with no step"):

* **Unmeasured streams** — ``unmeasured`` records (``core/records.py``) that a
  rank wrote through ``traceml.report_unmeasured(stream, reason)``: a trainer
  integration that could not attach (``stream`` ``all``) or a part of the step
  it cannot split. :func:`unmeasured_entries` folds them into the summary's
  ``integration.unmeasured`` list; :func:`unmeasured_line` is the one sentence the
  SDK prints, the summary card shows and ``traceml status`` repeats.
* **No step was traced** — a run whose ranks recorded no step record at all:
  :data:`NO_STEP_LINE` is what ``traceml run`` prints and the summary diagnosis says.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from traceml_tui.core import records

#: The one line a guarded run that recorded no step ends with (stderr, the summary's diagnosis and card).
NO_STEP_LINE = (
    "no step was traced: add a supported trainer or `traceml.trace_step` — "
    "`traceml compare` will be INCONCLUSIVE"
)
#: The summary diagnosis's action for such a run.
NO_STEP_ACTION = (
    "Use a supported trainer (Hugging Face or Lightning) under traceml run, "
    "or wrap each optimizer step in traceml.trace_step(model)."
)


def clip_stream(stream: Any) -> str:
    """A stream name as an ``unmeasured`` record may carry it: trimmed, one line, bounded.

    '' for an empty name or one that is not a string (nothing is recorded then).
    """
    if not isinstance(stream, str):
        return ""
    return " ".join(stream.split())[: records.MAX_STREAM_CHARS]


def clip_reason(reason: Any) -> str:
    """A reason as an ``unmeasured`` record may carry it: one line, bounded (cut with an ellipsis)."""
    text = " ".join(str(reason).split())
    limit = records.MAX_REASON_CHARS
    return text if len(text) <= limit else text[: limit - 1] + "…"


def unmeasured_line(stream: str, reason: str, ranks: Optional[Iterable[int]] = None) -> str:
    """The sentence for one dark stream: ``forward not measured (ranks 0, 1): <reason>``.

    ``all`` reads as "nothing measured". Without ``ranks`` the rank part is left out (the
    SDK prints this for its own rank).
    """
    what = "nothing measured" if stream == "all" else f"{stream} not measured"
    if ranks is not None:
        listed = sorted(set(ranks))
        if listed:
            what += f" (rank{'s' if len(listed) > 1 else ''} {', '.join(map(str, listed))})"
    return f"{what}: {reason}" if reason else what


def unmeasured_entries(found: Iterable[tuple[int, str, str]]) -> list[dict[str, Any]]:
    """``(rank, stream, reason)`` facts → the summary's ``integration.unmeasured`` list.

    One entry per (rank, stream): the first reason a rank gave for a stream stands
    (a resumed attempt repeating it adds nothing). Sorted by stream, then rank.
    """
    seen: dict[tuple[int, str], str] = {}
    for rank, stream, reason in found:
        name = clip_stream(stream)
        if name:  # a blank name (only whitespace) names no stream
            seen.setdefault((int(rank), name), clip_reason(reason))
    return [{"rank": rank, "stream": stream, "reason": reason}
            for (rank, stream), reason in sorted(seen.items(), key=lambda item: (item[0][1], item[0][0]))]


def unmeasured_lines(entries: Iterable[dict[str, Any]]) -> list[str]:
    """One :func:`unmeasured_line` per (stream, reason), naming the ranks that gave it."""
    grouped: dict[tuple[str, str], list[int]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        stream, reason, rank = entry.get("stream"), entry.get("reason"), entry.get("rank")
        if not isinstance(stream, str) or not stream or not isinstance(reason, str):
            continue
        ranks = grouped.setdefault((stream, reason), [])
        if isinstance(rank, int) and not isinstance(rank, bool):
            ranks.append(rank)
    return [unmeasured_line(stream, reason, ranks) for (stream, reason), ranks in grouped.items()]


def dark_streams(entries: Iterable[dict[str, Any]]) -> list[str]:
    """The distinct stream names of unmeasured entries, in order (``all`` first): a status table's cell."""
    names = {e.get("stream") for e in entries if isinstance(e, dict) and isinstance(e.get("stream"), str)}
    return sorted(names, key=lambda name: (name != "all", name))
