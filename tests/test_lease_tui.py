"""`traceml watch` names what the launcher leases say: a node lost while another lives (`lost node 1`) and a
run whose only launcher died before any rank wrote (`lost`, launcher-lost). Real LeaseKeeper files, the real
ingester (clock injected: "not seen to change for L" is exact), the real Textual app."""

from __future__ import annotations

import pytest

from daemon.service import Ingester
from traceml_tui.core.rundir import RunDir
from traceml_tui.run.lease import LeaseKeeper
from traceml_tui.tui.app import create_app
from traceml_tui.tui.screens.run_detail import RunScreen
from traceml_tui.tui.source import IndexSource
from traceml_tui.tui.widgets.info_panel import InfoPanel
from traceml_tui.tui.widgets.runs_table import RunsTable

from support import tui_data as d

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("lasting_toasts")]

L = 2.0


def _keeper(run: RunDir, node: int) -> LeaseKeeper:
    run.node_dir(node).mkdir(parents=True, exist_ok=True)
    keeper = LeaseKeeper(run.lease(node), node, L)
    keeper._write()  # the test beats (no thread): the injected clock decides what "for L" means
    return keeper


@pytest.fixture
def lease_index(tmp_path):
    root = tmp_path / "logs"
    two, gone = RunDir(root / "two-nodes"), RunDir(root / "gone-early")
    clock = [d.FIXED_NOW]
    ingester = Ingester(tmp_path / "index.sqlite", [str(root)], use_inotify=False, clock=lambda: clock[0])
    node0, _node1, _only = _keeper(two, 0), _keeper(two, 1), _keeper(gone, 0)
    ingester.run_once()
    for _ in range(3):  # node 0 beats on; node 1 and gone-early's launcher never again
        clock[0] += 0.75 * L
        node0._write()
        ingester.run_once()
    ingester.close()
    source = IndexSource(tmp_path / "index.sqlite", clock=lambda: clock[0])
    yield source
    source.close()


@d.aio
async def test_runs_and_run_screens_name_the_lost_node_and_the_lost_launcher(lease_index):
    app = create_app(lease_index, poll_interval=0.02)
    async with app.run_test(size=(120, 30)) as pilot:
        await d.settle(pilot)
        table = pilot.app.screen.query_one(RunsTable)
        names = [str(getattr(c, "plain", c)) for c in table.get_column_at(1)]
        status = {n: d.strip_glyph(table.get_row_at(i)[0]) for i, n in enumerate(names)}
        assert status == {"two-nodes": "running · lost node 1", "gone-early": "lost"}  # as `traceml status` says
        pilot.app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == "two-nodes"))
        await d.settle(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, RunScreen)
        headline = screen.query_one("#headline", InfoPanel).data[1][0]
        assert "RUNNING · lost node 1" in (headline[0] if isinstance(headline, tuple) else headline)
        await pilot.press("escape")
        await d.settle(pilot)
        pilot.app.open_run(next(r.run_id for r in app.runs_snapshot.rows if r.name == "gone-early"))
        await d.settle(pilot)
        failure = pilot.app.screen.detail.failure
        assert failure is not None and failure.cause == "launcher-lost"  # no rank ever wrote: its launcher died
