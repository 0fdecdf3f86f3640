"""The one writer of ``final_summary.json`` / ``final_summary.txt``.

The launcher writes a run's summary when it ends (``run/launch.py``); after
that, only the ``validation`` section may change — receipts drained after the
run by an external dispatcher's drainer (docs/hygiene.md) — and
:func:`refresh_validation` rewrites that section alone, built by the same
:func:`traceml_tui.summary.build.validation_section` the launcher used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from traceml_tui.core import artifacts, atomic
from traceml_tui.core.rundir import RunDir


def write_summary(run_dir: Path, summary: dict, *, exclusive: bool = False) -> dict:
    """Render the text card, check the payload readers decode, write both files atomically; returns it.

    ``exclusive=True`` never overwrites an existing ``final_summary.json`` (``FileExistsError``, nothing
    written): the summary a run started without ``traceml run`` writes at exit (``sdk/direct.py``).
    """
    from traceml_tui.summary.text import render_text

    summary["text"] = render_text(summary)
    artifacts.check_summary(summary)  # a payload readers could not decode is not published
    layout = RunDir(run_dir)
    atomic.atomic_write_json(layout.summary_json, summary, exclusive=exclusive)
    atomic.atomic_write_bytes(layout.summary_txt, summary["text"].encode("utf-8") + b"\n")
    return summary


def refresh_validation(run_dir: Path, manifest: dict) -> Optional[dict]:
    """Rebuild an ended run's summary ``validation`` section from the backlog as it is now; None without a summary.

    Every other section stays as the launcher wrote it. ``manifest`` is the
    run's manifest (its recorded ``hygiene`` block decides what was declared).
    """
    from traceml_tui.summary.build import validation_section

    try:
        data = RunDir(run_dir).summary_json.read_bytes()
    except OSError:
        return None  # no summary (yet): the launcher writes one with the section when the run ends
    if artifacts.decode_summary(data) is None:
        return None  # not a summary we can stand behind; never overwrite what we cannot read
    summary = json.loads(data)
    section = validation_section(Path(run_dir), manifest)
    if summary.get("validation") == section:
        return summary  # nothing new: a timer's idle drainer does not rewrite the files
    summary["validation"] = section
    return write_summary(run_dir, summary)
