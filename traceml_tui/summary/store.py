"""The one writer of ``final_summary.json`` / ``final_summary.txt``.

The launcher writes a run's summary when it ends (``run/launch.py``); after
that, only the ``validation`` section (and the ``qc`` section's worker QC: :func:`refresh_worker_qc`) may change — receipts drained after the
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


def refresh_worker_qc(run_dir: Path, manifest: dict) -> Optional[dict]:
    """Judge an ended run's required worker QC again from its QC backlog now (a QC drain after the run, docs/qc.md).

    Only the ``qc`` section's worker QC (its row, ``worker_qc``, ``not_passed_items``, ``status``) changes, by
    :func:`traceml_tui.hygiene.qc_block.with_worker_qc`, the rule the launcher's summary used. None without a
    summary or a bound ``qc`` section.
    """
    from traceml_tui.hygiene.qc_block import with_worker_qc

    try:
        data = RunDir(run_dir).summary_json.read_bytes()
    except OSError:
        return None
    if artifacts.decode_summary(data) is None:
        return None
    summary = json.loads(data)
    section = summary.get("qc")
    hygiene = manifest.get("hygiene") if isinstance(manifest.get("hygiene"), dict) else {}
    if not isinstance(section, dict) or not section.get("bound") or not isinstance(hygiene.get("qc"), dict):
        return None
    before = json.dumps(section, sort_keys=True)
    section = with_worker_qc(section, Path(run_dir), hygiene["qc"])
    if json.dumps(section, sort_keys=True) == before:
        return summary
    summary["qc"] = section
    return write_summary(run_dir, summary)
