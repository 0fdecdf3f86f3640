"""Regenerate screenshots/*.svg: one SVG of each `traceml watch` screen.

Uses the same runs as the snapshot tests: the committed real runs of
tests/fixtures/runs (written by the real SDK and `traceml run`; regenerate them
with scripts/make_fixture_runs.py, see that folder's README), indexed by the
real ingester with a fixed clock; the straggler heatmap alone uses synthetic
step times. Drives the real App headless and saves each screen. Usage:

    python scripts/make_screenshots.py [OUT_DIR]   # default: screenshots/
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from traceml_tui.tui.app import create_app  # noqa: E402
from traceml_tui.tui.source import IndexSource  # noqa: E402

from support import fixture_runs as fr  # noqa: E402
from support import tui_data as d  # noqa: E402


async def _shoot(out: Path, tmp: Path) -> list[Path]:
    _, index = fr.build_real_index(tmp / "real")
    # the hygiene run with an early stop recorded by the real rule over its own receipts (tests/support/fixture_runs.py)
    _, stopped_index = fr.build_real_index(tmp / "stopped", prepare=fr.stop_hygiene_early)
    _, synthetic = d.build_fixture(tmp / "synthetic")
    ref, cand = d.summary_pair(tmp / "summaries")
    saved = []

    async def save(app, name: str) -> None:
        path = out / f"{name}.svg"
        app.save_screenshot(filename=path.name, path=str(out))
        saved.append(path)

    async def shoot(source, name: str, size: tuple[int, int], run: str = "", key: str = "", ready=None) -> None:
        app = create_app(source, poll_interval=0.02)
        async with app.run_test(size=size) as pilot:
            await d.settle(pilot)
            if run:
                app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == run))
                await d.settle(pilot)
            if key:
                await pilot.press(key)
                await d.settle(pilot)
            for _ in range(400 if ready is not None else 0):  # a screen that reads on its own worker
                if ready(app.screen):
                    break
                await pilot.pause(0.02)
            await pilot.pause()
            await save(app, name)

    source = IndexSource(index, clock=lambda: fr.SHOWN_AT)
    straggler = IndexSource(synthetic, clock=lambda: d.FIXED_NOW)
    stopped = IndexSource(stopped_index, clock=lambda: fr.SHOWN_AT)
    try:
        await shoot(source, "runs", (120, 30))
        await shoot(source, "runs_80x24", (80, 24))
        await shoot(source, "run_detail_failed", (120, 50), run=fr.name_of("rank_raises"))
        await shoot(source, "run_detail_lost", (120, 50), run=fr.name_of("rank_sigkilled"))
        await shoot(source, "run_detail_stalled", (120, 50), run=fr.name_of("hung"))
        await shoot(straggler, "run_detail", (120, 50), run="resnet-ok")
        # the real 2-rank DDP run at 100×30: braille step-time chart, one colour per rank, and the heatmap
        await shoot(source, "run_detail_charts", (100, 30), run=fr.name_of("completed"))
        await shoot(source, "backlog", (120, 24), key="b")
        await shoot(source, "help", (100, 40), key="question_mark")
        await shoot(source, "log", (120, 30), run=fr.name_of("rank_raises"), key="l",
                    ready=lambda screen: getattr(screen, "reads", 0) >= 1)
        await shoot(source, "describe", (100, 60), run=fr.name_of("hygiene"), key="d",
                    ready=lambda screen: getattr(screen, "loaded", False))
        await shoot(stopped, "run_detail_hygiene", (120, 62), run=fr.name_of("hygiene"))
        app = create_app(source, poll_interval=0.02)
        async with app.run_test(size=(120, 30)) as pilot:  # Enter on the hygiene run's blocked request
            await d.settle(pilot)
            app.open_backlog(next(r.run_id for r in app.runs_snapshot.rows if r.name == fr.name_of("hygiene")))
            await d.settle(pilot)
            table = app.screen.query_one("#backlog")
            order = [str(getattr(c, "plain", c)) for c in (table.get_row_at(i)[1] for i in range(table.row_count))]
            table.move_cursor(row=order.index("step-00000006"))
            await pilot.press("enter")
            await d.settle(pilot)
            await save(app, "backlog_request")
        app = create_app(source, poll_interval=0.02, compare=(str(ref), str(cand)), threshold_pct=5.0)
        async with app.run_test(size=(100, 30)) as pilot:
            await d.settle(pilot)
            await save(app, "compare")
    finally:
        source.close()
        straggler.close()
        stopped.close()
    return saved


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else REPO / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for path in asyncio.run(_shoot(out, Path(tmp))):
            print(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
