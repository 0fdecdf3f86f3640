"""The read side's backlog room: the validation and heavy QC backlogs, eval freshness, the early-stopping state.

Reached as ``Reader.backlog`` (:mod:`daemon.reader`). Each is decided by the one rule in core from the
stored bytes of the run's files, as the file side decides it (docs/contracts.md, "a backlog entry").
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

from traceml_tui.core import artifacts, freshness, hygiene_files, stopping
from traceml_tui.core import backlog as core_backlog
from traceml_tui.core.rundir import BACKLOG_KINDS, BACKLOG_OF_SIDE_KIND, BACKLOG_SIDE_KINDS, QC_BACKLOG, VALIDATION
from traceml_tui.core.state import BacklogState

from .read_query import Rows


def _file_order(path: str) -> tuple:
    """A backlog file's place as the file side lists them: by folder (requests, claims, receipts, failures),
    then by name."""
    parts = path.split("/")
    folder, name = (parts[-2], parts[-1]) if len(parts) > 1 else ("", path)
    return (list(BACKLOG_KINDS).index(folder) if folder in BACKLOG_KINDS else len(BACKLOG_KINDS), name)


#: One checkpoint of the validation backlog and where it stands (assembled once, in core: docs/contracts.md).
BacklogItem = core_backlog.BacklogEntry


class BacklogReader:
    """Backlog entries, outstanding requests, eval freshness and early stopping of the index's runs
    (``reader.backlog``). ``manifest`` is the files room's typed manifest of a run (its validation settings)."""

    def __init__(self, rows: Rows, manifest: Callable[[int], Optional[artifacts.Manifest]]):
        self._rows = rows
        self._manifest = manifest
        self._blocked: dict[int, tuple[int, int]] = {}  # run_id -> (data version, blocked requests)

    def entries(self, run_id: int, now: Optional[float] = None, kind: str = VALIDATION) -> tuple[BacklogItem, ...]:
        """Backlog entries of a run in checkpoint order, each with its decided state: the validation backlog, or
        with ``kind="qc"`` the heavy QC backlog (docs/qc.md) — one implementation, two kinds.

        Assembled by :func:`traceml_tui.core.backlog.backlog_entries` from the stored bytes of its files, as
        ``traceml validate status [--kind qc]`` assembles them from the files; the run's settings (one set of
        retry rules for both kinds) from its manifest.
        """
        now = time.time() if now is None else now
        settings = core_backlog.validation_settings(self._manifest(run_id))
        return core_backlog.backlog_entries(self._files(run_id, kind), now, settings=settings)

    def _files(self, run_id: int, kind: str) -> list[core_backlog.BacklogFile]:
        """The stored backlog files of one kind as ``(folder, name, content)``, by path."""
        sides = BACKLOG_SIDE_KINDS[kind]
        marks = ", ".join("?" * len(sides))
        return [(BACKLOG_OF_SIDE_KIND[side][1], os.path.basename(path), content)
                for side, path, content in self._rows(
                    f"SELECT kind, path, content FROM side_files WHERE run_id = ? AND kind IN ({marks}) ORDER BY path",
                    (run_id, *sides.values()))]

    def worker_qc(self, run_id: int, now: Optional[float] = None,
                  entries: Optional[tuple[BacklogItem, ...]] = None) -> Optional[dict]:
        """The run's heavy QC report (docs/qc.md) when its manifest requires worker QC, else None:
        ``{state, requested, completed, counts, outstanding, errors}``, its word decided by
        :func:`traceml_tui.core.state.decide_worker_qc` (the rule the summary uses) over :meth:`entries` of
        kind ``qc``; ``errors`` are the index's lines for the run's damaged QC files (their error rows)."""
        manifest = self._manifest(run_id)
        if not core_backlog.manifest_requires_worker_qc(manifest):
            return None
        entries = self.entries(run_id, now, kind=QC_BACKLOG) if entries is None else entries
        sides = tuple(BACKLOG_SIDE_KINDS[QC_BACKLOG].values())
        marks = ", ".join("?" * len(sides))
        errors = [error for _, error in sorted(
            self._rows(f"SELECT path, error FROM side_files WHERE run_id = ? AND kind IN ({marks})"
                       " AND error IS NOT NULL", (run_id, *sides)), key=lambda row: _file_order(row[0]))]
        return core_backlog.run_worker_qc(manifest, entries, errors)

    def blocked(self, now: Optional[float] = None) -> dict[int, int]:
        """Per run: validation requests ``blocked`` (every allowed attempt failed), by the entries' own states.

        Only runs with a failure file can have one, so only their entries are assembled (a query finds them),
        and each run's count is kept until its data version moves (a side file that changes bumps it): no
        claim, live or stale, ever leaves a request blocked, so the count does not move with the clock.
        """
        out = {}
        for run_id, version in self._rows(
                "SELECT r.run_id, r.updated_version FROM runs r WHERE EXISTS (SELECT 1 FROM side_files f"
                " WHERE f.run_id = r.run_id AND f.kind = 'failure')"):
            cached = self._blocked.get(run_id)
            if cached is None or cached[0] != version:
                n = sum(1 for e in self.entries(run_id, now) if e.state is BacklogState.BLOCKED)
                cached = self._blocked[run_id] = (version, n)
            if cached[1]:
                out[run_id] = cached[1]
        return out

    def outstanding(self) -> dict[int, int]:
        """Per run: validation requests without a receipt (the Runs table's backlog column).

        The fast path of ``sum(e.outstanding for e in entries(run))`` (:func:`traceml_tui.core.backlog.is_outstanding`)
        for every run in one query, without decoding: a stored backlog file decoded when it was indexed
        (``error`` is NULL exactly when :func:`traceml_tui.core.hygiene_files.decode_named` accepted it), and a
        valid file's key is its checkpoint. A test holds the two equal on damaged files.
        """
        out: dict[int, int] = {}
        for run_id, n in self._rows(
            "SELECT q.run_id, count(*) FROM side_files q WHERE q.kind = 'request' AND q.content IS NOT NULL"
            " AND q.error IS NULL AND NOT EXISTS (SELECT 1 FROM side_files c WHERE c.run_id = q.run_id"
            " AND c.kind = 'receipt' AND c.key = q.key AND c.content IS NOT NULL AND c.error IS NULL)"
            " GROUP BY q.run_id"
        ):
            out[run_id] = n
        return out

    def eval_freshness(self, run_id: int, train_step: Optional[int] = None) -> freshness.EvalFreshness:
        """The run's newest completed evaluation — an ``eval`` record or a validation receipt — and its lag behind
        ``train_step`` (default: the run's newest step), by :func:`traceml_tui.core.freshness.eval_freshness`."""
        evaluated = [freshness.Evaluated(step, checkpoint) for step, checkpoint in self._rows(
            "SELECT step, json_extract(body, '$.checkpoint') FROM events WHERE run_id = ? AND kind = 'eval'"
            " AND json_extract(body, '$.status') = 'completed' AND step IS NOT NULL ORDER BY step DESC LIMIT 1",
            (run_id,))]
        for path, content in self._rows("SELECT path, content FROM side_files WHERE run_id = ? AND kind = 'receipt'"
                                        " AND content IS NOT NULL AND error IS NULL", (run_id,)):
            try:
                receipt = hygiene_files.decode_named("receipts", os.path.basename(path), content)
            except hygiene_files.DamagedFile:
                continue  # a damaged receipt is no result
            if receipt.step is not None:
                evaluated.append(freshness.Evaluated(receipt.step, receipt.checkpoint))
        if train_step is None:
            rows = self._rows("SELECT last_step FROM runs WHERE run_id = ?", (run_id,))
            train_step = rows[0][0] if rows else None
        return freshness.eval_freshness(train_step, evaluated)

    def newest_evaluated_step(self, run_id: int) -> Optional[int]:
        """Step of the newest completed evaluation: an ``eval`` record or a validation receipt (:meth:`eval_freshness`)."""
        return self.eval_freshness(run_id).newest_step

    def early_stopping(self, run_id: int) -> Optional[stopping.StoppingView]:
        """The early-stopping policy's own state (``early_stopping.json`` as indexed): best value and step, patience
        used, stopped or not and why, ``min_delta`` and warm-up as the policy file says; None when the run has no
        such file or it is damaged (its error row names it)."""
        rows = self._rows("SELECT content FROM side_files WHERE run_id = ? AND kind = 'early_stopping'"
                          " AND content IS NOT NULL AND error IS NULL", (run_id,))
        if not rows:
            return None
        try:
            return stopping.stopping_view(hygiene_files.decode_early_stopping(rows[0][0]))
        except hygiene_files.DamagedFile:
            return None
