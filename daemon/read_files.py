"""The read side's files room: what a run's own files say, as the ingester stored them.

Reached as ``Reader.files`` (:mod:`daemon.reader`): the typed manifest, the final summary and its
sections, the nodes' guard outcomes, the nodes that wrote streams and the paths of the training logs
(docs/daemon.md, "Reader API"). The backlog's files are the backlog room's (:mod:`daemon.read_backlog`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from traceml_tui.core import artifacts
from traceml_tui.core.rundir import RunDir
from traceml_tui.core.state import summary_is_current

from .read_query import Rows


@dataclass(frozen=True)
class Outcome:
    """One node's guard outcome (``nodes/node_<k>/guard_outcome.json``)."""

    node: Optional[int]
    status: Optional[str]
    exit_code: Optional[int]
    completed_at: Optional[str]
    error: Optional[str]


@dataclass(frozen=True)
class LogFile:
    """One node's training log: ``stream`` is ``stdout`` or ``stderr``; ``rel`` is relative to the run directory."""

    node: int
    stream: str
    rel: str


class FilesReader:
    """Manifests, summaries, outcomes and log paths of the index's runs (``reader.files``)."""

    def __init__(self, rows: Rows):
        self._rows = rows
        self._manifests: dict[int, tuple[int, Optional[artifacts.Manifest]]] = {}

    def _run_value(self, run_id: int, column: str) -> Any:
        """One column of the run's ``runs`` row (None when the run is not indexed)."""
        rows = self._rows(f"SELECT {column} FROM runs WHERE run_id = ?", (run_id,))
        return rows[0][0] if rows else None

    def manifest(self, run_id: int, version: Optional[int] = None) -> Optional[artifacts.Manifest]:
        """The run's manifest, typed (None when absent or unreadable); cached per run data version."""
        cached = self._manifests.get(run_id)
        if cached is not None and version is not None and cached[0] == version:
            return cached[1]
        rows = self._rows("SELECT content FROM side_files WHERE run_id = ? AND kind = 'manifest'"
                          " AND content IS NOT NULL", (run_id,))
        manifest = artifacts.decode_manifest(rows[0][0]) if rows else None
        if version is not None:
            self._manifests[run_id] = (version, manifest)
        return manifest

    def summary_bytes(self, run_id: int) -> Optional[bytes]:
        """The run's ``final_summary.json`` as ingested, or None."""
        rows = self._rows("SELECT content FROM side_files WHERE run_id = ? AND kind = 'summary'"
                          " AND content IS NOT NULL", (run_id,))
        return rows[0][0].encode("utf-8") if rows else None

    def summary_status(self, run_id: int) -> Optional[str]:
        """The status the run's final summary records, None while it is not the current attempt's."""
        if not summary_is_current(self._run_value(run_id, "manifest_status")):
            return None
        return self._run_value(run_id, "summary_status")

    def failure(self, run_id: int) -> Optional[artifacts.FailureSection]:
        """The ``failure`` section of the run's final summary as ingested (who, where, why), or None (also
        while a resumed attempt runs: that summary is the previous attempt's, core.state.summary_is_current)."""
        if not summary_is_current(self._run_value(run_id, "manifest_status")):
            return None
        content = self.summary_bytes(run_id)
        return artifacts.decode_failure(content) if content is not None else None

    def validation(self, run_id: int) -> Optional[artifacts.ValidationSection]:
        """The ``validation`` section of the run's final summary as ingested (backlog counts, best checkpoint,
        early-stopping state at the end), or None (no summary yet, or a run without validation)."""
        content = self.summary_bytes(run_id)
        return artifacts.decode_validation(content) if content is not None else None

    def outcomes(self, run_id: int) -> tuple[Outcome, ...]:
        """The nodes' guard outcomes by node (an unreadable one names its error)."""
        outcomes = []
        for key, content, error in self._rows(
            "SELECT key, content, error FROM side_files WHERE run_id = ? AND kind = 'outcome'", (run_id,)
        ):
            o = artifacts.decode_outcome(content) if content else None
            node = o.node_rank if o is not None and o.node_rank is not None else (
                int(key) if key and key.isdigit() else None)
            if o is None:
                outcomes.append(Outcome(node, None, None, None, error or "not a node outcome"))
            else:
                outcomes.append(Outcome(node, o.training.status, o.training.exit_code, o.completed_at, error))
        return tuple(sorted(outcomes, key=lambda o: (o.node is None, o.node or 0)))

    def nodes(self, run_id: int) -> tuple[int, ...]:
        """The nodes whose streams the run holds, in order."""
        return tuple(r[0] for r in self._rows("SELECT DISTINCT node FROM files WHERE run_id = ? AND node IS NOT NULL"
                                              " ORDER BY node", (run_id,)))

    def logs(self, run_id: int) -> tuple[str, tuple[LogFile, ...]]:
        """The run's directory and its nodes' training logs (stdout, stderr; paths from core.rundir).

        The index does not hold the logs: ``traceml watch``'s log view reads
        these files itself, read-only and bounded (docs/watch.md). A node
        folder is listed when it exists; a log that does not exist yet is
        still named (a live run may create it later). Unknown run: ``("", ())``.
        """
        rows = self._rows("SELECT dir FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            return "", ()
        layout = RunDir(rows[0][0])
        out = []
        for node in layout.node_ranks():
            for stream, path in (("stdout", layout.stdout_log(node)), ("stderr", layout.stderr_log(node))):
                out.append(LogFile(node, stream, path.relative_to(layout.path).as_posix()))
        return str(layout.path), tuple(out)
