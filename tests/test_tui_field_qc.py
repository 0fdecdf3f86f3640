"""Field-collapse QC (seed 004) shown by `traceml watch` on the Run screen, from a real index."""

from __future__ import annotations

import asyncio
from pathlib import Path

from traceml_tui.core import atomic, records
from traceml_tui.tui.app import create_app
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.info_panel import InfoPanel

from support import tui_data as d


def _field(name: str, step: int, low: float, high: float) -> records.FieldStats:
    return records.FieldStats(v=1, run="latent", rank=0, attempt=0, step=step, ts=d.T0 + step, name=name,
                              space="log", median=(low + high) / 2, p_low=low, p_high=high, occupancy=0.0)


def test_collapsed_field_is_flagged_on_the_run_screen(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    run = d.write_run(root, "latent", ranks=1, steps=10, finished=True, evals=False)
    fd = atomic.open_append(run / "ranks" / "rank_0" / "steps-0.jsonl")
    # sigma's spread falls to 0.05x its initial spread at step 10 (below the default factor 0.1); mu holds steady
    for step, width in ((0, 2.0), (5, 1.5), (10, 0.1)):
        atomic.append_line(fd, records.encode(_field("sigma", step, -width / 2, width / 2)))
    for step in (0, 5, 10):
        atomic.append_line(fd, records.encode(_field("mu", step, -1.0, 1.0)))
    index = tmp_path / "index.sqlite"
    d.ingest(index, [root])
    source = IndexSource(index, clock=lambda: d.FIXED_NOW)

    async def scenario() -> str:
        app = create_app(source, poll_interval=0.02)
        async with app.run_test(size=(120, 60)) as pilot:
            await d.settle(pilot)
            pilot.app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == "latent"))
            for _ in range(100):
                await pilot.pause(0.02)
                if pilot.app.screen.query("#fields"):
                    break
            panel = pilot.app.screen.query_one("#fields", InfoPanel)
            return str(panel.render())

    try:
        text = asyncio.run(scenario())
    finally:
        source.close()
    lines = text.splitlines()
    assert lines[0].startswith("Field QC")
    assert lines[1].startswith("FAILED  sigma: collapsed at step 10")
    assert lines[2].startswith("ok      mu")
