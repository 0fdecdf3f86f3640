"""Hang forensics: which rank never arrived, where it is, and who waits for it (pure).

A rank's watchdog (``sdk/watchdog.py``) writes one ``hang`` record
(:class:`traceml_tui.core.records.Hang`) when its step overruns: the main
thread's innermost frames, the ``torch.distributed`` collective it is inside
and the process group's collective count. The rule that names the culprit is
:func:`traceml_tui.core.state.hang_roles` (so the rank words every surface
shows already say ``waiting``/``aborted`` for its peers); this module turns
hang records into the facts that rule reads (:func:`current_hang`,
:func:`fact_of`) and into the one line every surface prints
(:func:`hang_report`), e.g.::

    r1 in train.py:42 `time.sleep`, not in all_reduce #57; r0 waiting in all_reduce #57

docs/run.md "Hang forensics" documents the record and the words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import msgspec

from traceml_tui.core import records
from traceml_tui.core.state import HangFact, RankFacts, RankState, hang_roles

#: The longest call name and file name a line shows (characters).
_MAX_NAME = 80


def decode_hang(body: Any) -> Optional[records.Hang]:
    """A hang record from its JSON (bytes/str) or an already parsed dict; None when it is not one."""
    try:
        if isinstance(body, (bytes, str)):
            rec = records.decode(body)
        else:
            rec = msgspec.convert(dict(body, kind="hang"), records.Hang)
    except (records.RecordError, msgspec.ValidationError, TypeError, ValueError, RecursionError):
        return None
    return rec if isinstance(rec, records.Hang) else None


def current_hang(hang: Optional[records.Hang], attempt: Optional[int], last_step: Optional[int]) -> bool:
    """Whether a rank's hang record speaks for its silence now: same attempt, and no step completed after it
    (a step that overran and then finished leaves a record that no longer says anything)."""
    if hang is None or attempt is None or hang.attempt != attempt:
        return False
    return last_step is None or hang.step >= last_step


def fact_of(hang: records.Hang) -> HangFact:
    """The facts :func:`traceml_tui.core.state.hang_roles` reads from a record."""
    return HangFact(collective=hang.collective, seq=hang.seq, ts=hang.ts)


def user_frame(stack: Sequence[records.Frame]) -> Optional[records.Frame]:
    """The innermost frame of the training code (under the script's folder), else the innermost frame."""
    for frame in stack:
        if frame.user:
            return frame
    return stack[0] if stack else None


@dataclass(frozen=True)
class HangReport:
    """A hang as every surface shows it: the culprit rank(s), the waiting ranks, and one line."""

    culprits: tuple[int, ...]
    waiting: tuple[int, ...]
    collective: Optional[str]  # what the waiting ranks are inside (None: a collective torch issued itself, e.g. DDP)
    seq: Optional[int]  # the waiting ranks' collective count (the number of the collective they wait in)
    frame: Optional[dict]  # the first culprit's innermost user frame: file, line, func, call
    text: str

    def to_dict(self) -> dict:
        """Plain values (``status --json``, the summary's failure section)."""
        return {"culprits": list(self.culprits), "waiting": list(self.waiting), "collective": self.collective,
                "seq": self.seq, "frame": self.frame, "text": self.text}


def _name(collective: Optional[str], seq: Optional[int]) -> str:
    what = collective or "a collective"
    return f"{what} #{seq}" if seq is not None else what


def _where(frame: Optional[records.Frame]) -> str:
    if frame is None:
        return ""
    call = frame.call or frame.func
    return f" in {frame.file[-_MAX_NAME:]}:{frame.line} `{call[:_MAX_NAME]}`"


def _ranks(ranks: Sequence[int]) -> str:
    return ",".join(f"r{r}" for r in ranks)


def hang_report(ranks: Sequence[RankFacts], states: Sequence[RankState],
                hangs: Mapping[int, records.Hang]) -> Optional[HangReport]:
    """The hang among these ranks, or None when :func:`~traceml_tui.core.state.hang_roles` names no culprit.

    ``ranks`` and ``states`` are a run's rank facts (with their current
    :class:`~traceml_tui.core.state.HangFact`) and decided words; ``hangs``
    maps a rank id to its current hang record (the stack the line shows).
    """
    culprit_ix, waiting_ix = hang_roles(ranks, states)
    if not culprit_ix:
        return None
    culprits = tuple(sorted(ranks[i].rank for i in culprit_ix))
    waiting = tuple(sorted(ranks[i].rank for i in waiting_ix))
    waits = [hangs[r] for r in waiting if r in hangs]
    named = sorted({h.collective for h in waits if h.collective})
    collective = named[0] if len(named) == 1 else None
    seqs = [h.seq for h in waits if h.seq is not None]
    seq = max(seqs) if seqs else None
    target = _name(collective, seq)
    parts = []
    frame_dict = None
    for rank in culprits:
        hang = hangs.get(rank)
        if hang is None:
            parts.append(f"r{rank} silent, no hang record, not in {target}")
            continue
        frame = user_frame(hang.stack)
        if frame is not None and frame_dict is None:
            frame_dict = {"rank": rank, "file": frame.file, "line": frame.line, "func": frame.func,
                          "call": frame.call}
        behind = f" (at #{hang.seq})" if hang.seq is not None and seq is not None and hang.seq < seq else ""
        inside = f", in {_name(hang.collective, hang.seq)}" if hang.collective else ""
        parts.append(f"r{rank}{_where(frame)}{inside}, not in {target}{behind}")
    parts.append(f"{_ranks(waiting)} waiting in {target}")
    return HangReport(culprits=culprits, waiting=waiting, collective=collective, seq=seq, frame=frame_dict,
                      text="; ".join(parts))
