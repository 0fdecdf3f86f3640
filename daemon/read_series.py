"""The read side's series room: downsampled series, their newest buckets, node samples and step rows.

Reached as ``Reader.series`` (:mod:`daemon.reader`); the buckets were aggregated at ingest time
(:mod:`daemon.live`), so each call costs what it returns (docs/daemon.md, "Reader API").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from . import index as idx
from .read_query import Rows


@dataclass(frozen=True)
class SeriesPoint:
    """One bucket of steps: its step range, min, max, mean and count."""

    step_lo: int
    step_hi: int
    vmin: float
    vmax: float
    mean: float
    n: int


@dataclass(frozen=True)
class Series:
    """A downsampled series: each point is one bucket of steps with its min, max and mean."""

    run_id: int
    rank: int
    metric: str
    width: int
    points: tuple[SeriesPoint, ...]


@dataclass(frozen=True)
class NodeSample:
    """One system sample of a node: CPU, RAM and its GPUs' figures."""

    node: int
    ts: float
    cpu_pct: Optional[float]
    ram_used: Optional[int]
    ram_total: Optional[int]
    gpus: tuple[dict, ...]


class SeriesReader:
    """Series, sparkline tails, node samples and step counts of the index's runs (``reader.series``)."""

    def __init__(self, rows: Rows):
        self._rows = rows

    def metrics(self, run_id: int) -> tuple[str, ...]:
        """Names of the metrics that have series in this run."""
        names = []
        for m in idx.SERIES_METRICS:
            if self._rows(f"SELECT 1 FROM series WHERE run_id = ? AND {m}_n > 0 LIMIT 1", (run_id,)):
                names.append(m)
        names += [r[0] for r in self._rows("SELECT DISTINCT metric FROM series_extra WHERE run_id = ? ORDER BY metric",
                                           (run_id,))]
        return tuple(names)

    def points(self, run_id: int, rank: int, metric: str, max_points: Optional[int] = None) -> Series:
        """Downsampled series of ``metric`` (e.g. ``step_ms``, ``loss``, ``ratio/<component>``) for one rank."""
        width_rows = self._rows("SELECT width FROM series_width WHERE run_id = ? AND rank = ?", (run_id, rank))
        width = width_rows[0][0] if width_rows else 1
        if metric in idx.SERIES_METRICS:
            rows = self._rows(
                f"SELECT step_lo, step_hi, {metric}_min, {metric}_max, {metric}_sum, {metric}_n FROM series"
                f" WHERE run_id = ? AND rank = ? AND {metric}_n > 0 ORDER BY bucket", (run_id, rank))
        else:
            rows = self._rows("SELECT step_lo, step_hi, vmin, vmax, vsum, n FROM series_extra WHERE run_id = ?"
                              " AND rank = ? AND metric = ? AND n > 0 ORDER BY bucket", (run_id, rank, metric))
        points = [SeriesPoint(lo, hi, vmin, vmax, vsum / n, n) for lo, hi, vmin, vmax, vsum, n in rows]
        if max_points and len(points) > max_points:
            factor = -(-len(points) // max_points)
            merged = []
            for i in range(0, len(points), factor):
                g = points[i:i + factor]
                n = sum(p.n for p in g)
                merged.append(SeriesPoint(g[0].step_lo, g[-1].step_hi, min(p.vmin for p in g), max(p.vmax for p in g),
                                          sum(p.mean * p.n for p in g) / n, n))
            points = merged
            width *= factor
        return Series(run_id, rank, metric, width, tuple(points))

    def tail(self, run_id: int, rank: int, metric: str, buckets: int) -> tuple[float, ...]:
        """Means of the newest ``buckets`` buckets of a wide-table metric, oldest first (sparklines)."""
        if metric not in idx.SERIES_METRICS:
            raise ValueError(f"no wide series for {metric!r}")
        rows = self._rows(f"SELECT {metric}_sum, {metric}_n FROM series WHERE run_id = ? AND rank = ?"
                          " ORDER BY bucket DESC LIMIT ?", (run_id, rank, buckets))
        return tuple(s / n for s, n in reversed(rows) if n)

    def node_samples(self, run_id: int, node: Optional[int] = None, limit: int = 300) -> tuple[NodeSample, ...]:
        """The newest ``limit`` system samples (per node when ``node`` is None), oldest first."""
        nodes = [node] if node is not None else [r[0] for r in self._rows(
            "SELECT DISTINCT node FROM system WHERE run_id = ?", (run_id,))]
        out = []
        for n in sorted(nodes):
            rows = self._rows("SELECT node, ts, cpu_pct, ram_used, ram_total, gpus FROM system WHERE run_id = ? AND"
                              " node = ? ORDER BY ts DESC LIMIT ?", (run_id, n, limit))
            for nd, ts, cpu, used, total, gpus in reversed(rows):
                out.append(NodeSample(nd, ts, cpu, used, total, tuple(json.loads(gpus)) if gpus else ()))
        return tuple(out)

    def step_count(self, run_id: int) -> int:
        """Number of step rows of a run (for tests and diagnostics; cost grows with the run)."""
        return int(self._rows("SELECT count(*) FROM steps WHERE run_id = ?", (run_id,))[0][0])
