"""Regenerate screenshots/*.svg: one SVG of each `traceml watch` screen.

Builds the same fixed run directories as the snapshot tests (records written
with traceml_tui.core.records, index built by the real ingester, fixed clock), then
drives the real App headless and saves each screen. Usage:

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

import tui_data as d  # noqa: E402

from traceml_tui.tui.app import create_app  # noqa: E402
from traceml_tui.tui.source import IndexSource  # noqa: E402


async def _shoot(out: Path, tmp: Path) -> list[Path]:
    _, index = d.build_fixture(tmp)
    ref, cand = d.summary_pair(tmp / "summaries")
    saved = []

    async def save(app, name: str) -> None:
        path = out / f"{name}.svg"
        app.save_screenshot(filename=path.name, path=str(out))
        saved.append(path)

    source = IndexSource(index, clock=lambda: d.FIXED_NOW)
    try:
        for size, suffix in (((120, 30), ""), ((80, 24), "_80x24")):
            app = create_app(source, poll_interval=0.02)
            async with app.run_test(size=size) as pilot:
                await d.settle(pilot)
                await save(app, f"runs{suffix}")
        for name, run in (("run_detail", "resnet-ok"), ("run_detail_stalled", "vit-hang")):
            app = create_app(source, poll_interval=0.02)
            async with app.run_test(size=(120, 50)) as pilot:
                await d.settle(pilot)
                app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == run))
                await d.settle(pilot)
                await save(app, name)
        app = create_app(source, poll_interval=0.02)
        async with app.run_test(size=(120, 24)) as pilot:
            await d.settle(pilot)
            await pilot.press("b")
            await d.settle(pilot)
            await save(app, "backlog")
        app = create_app(source, poll_interval=0.02, compare=(str(ref), str(cand)), threshold_pct=5.0)
        async with app.run_test(size=(100, 30)) as pilot:
            await d.settle(pilot)
            await save(app, "compare")
    finally:
        source.close()
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
