"""Heavy QC through the backlog, in a real run (issue acceptance; docs/qc.md "Heavy QC through the backlog").

`traceml run --nproc-per-node 2` launches tests/scripts/qc_worker_train.py (gloo DDP), which publishes a
checkpoint at initialization and every 2 updates. Its traceml.yaml requires `worker_qc` at QC cadence 4, with
tests/scripts/validator.py --qc as the QC worker: the launcher writes QC requests for updates 0, 4 and 8 and
drains them with the same drainer as validation. The QC plan fails update 4 once (retried, then a receipt)
and update 8 always (blocked after max_attempts). The summary, its text and `traceml status --json` must all
say worker QC did not pass, naming the blocked checkpoint.

The run is launched once for the module (:func:`heavy`) and indexed by a real `traceml daemon --once`: the index
holds the QC backlog as the files hold it (docs/daemon.md, "What the index stores"), and `traceml status --json`,
a real metrics scrape and the Backlog screen show the index's worker-QC word — the summary's. Tests that change
the run work on a copy of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from traceml_tui.core import artifacts
from traceml_tui.core import backlog as core_backlog
from traceml_tui.hygiene import qc_backlog

from support import realruns

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = Path(__file__).resolve().parent / "scripts" / "qc_worker_train.py"
DUMP = textwrap.dedent(
    """
    import json, sys
    from trackio.sqlite_storage import SQLiteStorage
    print(json.dumps(SQLiteStorage.get_logs(sys.argv[1], sys.argv[2]), default=str))
    """
)
WORKER = ["python", "validator.py", "--checkpoint", "{checkpoint}", "--step", "{step}"]


def _config() -> dict:
    return {
        "mode": "summary",
        "history_enabled": True,
        "hygiene": {
            "history": {"schema": 1, "output": "ranks"},
            "curve": {"cadence": 2},
            "validation": {"recipe": "qc-worker-run-v1", "cadence": 2, "first_evaluation": 0, "worker": WORKER,
                           "max_attempts": 2, "retry_backoff_s": 0.2, "lease_s": 30},
            "early_stopping": {"enabled": False, "reason": "a fixed 8-update QC test"},
            "qc": {
                "cadence": 4,
                "owner": "qc-tests",
                "output": "qc",
                "roster": {"name": "fixed-3", "members": ["a", "b", "c"], "selection": "three named cases"},
                "items": {"batch_grid": {"inapplicable": "not this test"},
                          "field_stats": {"inapplicable": "not this test"},
                          "galleries": {"inapplicable": "not this test"},
                          "worker_qc": "required"},
                "recipe": "heavy-qc-v1",
                "worker": [*WORKER, "--qc"],
            },
        },
    }


QC_FILE = "qc/requests/step-00000004.json"


@dataclass(frozen=True)
class Heavy:
    """The module's one real run with a QC worker, and the index a real daemon made of it."""

    work: Path  # the training folder (traceml.yaml, the scripts, logs/)
    run_dir: Path
    plan: Path  # the QC worker's plan (which checkpoints fail)
    env: dict  # the environment of `traceml …` subprocesses (a private state folder)
    index: Path
    cmd: tuple[str, ...]

    def traceml(self, *args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
        """`traceml ARGS…` as a user runs it."""
        return subprocess.run([*self.cmd, *args], env=kw.pop("env", self.env), capture_output=True, text=True,
                              timeout=timeout, **kw)

    def index_once(self, root: Path, index: Path) -> subprocess.CompletedProcess:
        """A real `traceml daemon ROOT --index INDEX --once`."""
        done = self.traceml("daemon", str(root), "--index", str(index), "--once")
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    def copy_run(self, to: Path) -> Path:
        """A copy of the run under ``to/logs`` (a test that changes the run works on it)."""
        run = to / "logs" / self.run_dir.name
        shutil.copytree(self.run_dir, run)
        return run


@pytest.fixture(scope="module")
def heavy(tmp_path_factory) -> Heavy:
    """Launch the QC worker run once (the issue's acceptance run) and index it with a real daemon."""
    base = tmp_path_factory.mktemp("qc-worker-run")
    traceml_cmd = [sys.executable, "-m", "traceml_tui"]  # as the traceml_cmd fixture (function-scoped) runs it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "XDG_STATE_HOME": str(base / "state")}
    env.pop("TRACEML_RUN_DIR", None)
    work = base / "work"
    work.mkdir()
    shutil.copy(SCRIPT, work / "qc_worker_train.py")
    shutil.copy(realruns.VALIDATOR_SCRIPT, work / "validator.py")
    (work / "traceml.yaml").write_text(yaml.safe_dump(_config(), sort_keys=False))
    plan = work / "qc_plan.json"
    plan.write_text(json.dumps({"step-00000004": "fail_once", "step-00000008": "fail"}))
    env["REALRUNS_QC_PLAN"] = str(plan)
    proc = subprocess.run([*traceml_cmd, "run", "qc_worker_train.py", "--run-name", "heavy", "--nproc-per-node", "2",
                           "--args", "--steps", "8"], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = Heavy(work, work / "logs" / "heavy", plan, env, base / "index.sqlite", tuple(traceml_cmd))
    out.index_once(work / "logs", out.index)
    return out


async def _backlog_screen(index: Path) -> tuple[str, tuple, dict]:
    """The Backlog screen of the one run in ``index``, in the real Textual app: its summary panel's text, the
    table's columns and its rows' cells by key."""
    from traceml_tui.tui.app import create_app
    from traceml_tui.tui.screens.backlog import BacklogScreen
    from traceml_tui.tui.source import IndexSource
    from traceml_tui.tui.widgets.backlog_table import BacklogTable
    from traceml_tui.tui.widgets.info_panel import InfoPanel

    from support import tui_data

    source = IndexSource(index)
    try:
        app = create_app(source, poll_interval=0.02)
        async with app.run_test(size=(160, 40)) as pilot:
            await tui_data.settle(pilot)
            [row] = pilot.app.runs_snapshot.rows
            pilot.app.open_backlog(row.run_id)
            await tui_data.settle(pilot, rounds=3)
            assert isinstance(pilot.app.screen, BacklogScreen)
            table = pilot.app.screen.query_one(BacklogTable)
            rows = {key: tuple(tui_data.strip_glyph(c) for c in cells) for key, cells in table.table_rows}
            panel = str(pilot.app.screen.query_one("#backlog-summary", InfoPanel).render())
            return panel, table.shown_columns(), rows
    finally:
        source.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape_until(url: str, want: str, timeout: float = 120) -> str:
    """The exposition once it holds ``want`` (the daemon indexes, then serves; a loaded machine is slow)."""
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                last = resp.read().decode()
            if want in last:
                return last
        except OSError:
            pass  # not serving yet
        time.sleep(0.3)
    raise AssertionError(f"the metrics never showed {want!r}: {last[-2000:]}")


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _qc_entries_from_files(run_dir: Path, now: float) -> tuple:
    """The QC backlog as the file side assembles it (``traceml validate status --kind qc``)."""
    manifest = artifacts.decode_manifest((run_dir / "manifest.json").read_bytes())
    return core_backlog.backlog_entries(core_backlog.run_backlog_files(run_dir, "qc"), now,
                                        settings=core_backlog.validation_settings(manifest), root="qc")


def test_worker_qc_requests_receipts_retry_and_a_blocked_request_not_passed(heavy: Heavy, tmp_path: Path) -> None:
    run_dir = heavy.run_dir

    def names(kind: str, folder: str) -> list[str]:
        return sorted(p.stem for p in (run_dir / kind / folder).glob("*.json"))

    # validation: every checkpoint; QC: initialization and each QC point, the same immutable checkpoints
    assert names("validation", "requests") == [f"step-{s:08d}" for s in (0, 2, 4, 6, 8)]
    assert names("validation", "receipts") == names("validation", "requests")  # QC failures touch no validation
    assert names("qc", "requests") == ["step-00000000", "step-00000004", "step-00000008"]
    qc_request = json.loads((run_dir / "qc/requests/step-00000004.json").read_text())
    val_request = json.loads((run_dir / "validation/requests/step-00000004.json").read_text())
    assert qc_request["path"] == val_request["path"] and qc_request["step"] == 4
    assert qc_request["config_digest"].startswith("sha256:")
    assert qc_request["config_digest"] != val_request["config_digest"]  # bound to the QC recipe and worker
    # receipts written by the QC worker; update 4 failed once, was retried and completed
    assert names("qc", "receipts") == ["step-00000000", "step-00000004"]
    receipt = json.loads((run_dir / "qc/receipts/step-00000004.json").read_text())
    assert receipt["metrics"]["dead_units"] == 0 and receipt["config_digest"] == qc_request["config_digest"]
    assert names("qc", "failures") == ["step-00000004-1", "step-00000008-1", "step-00000008-2"]
    assert "drained:" in (run_dir / "qc" / "drainer.log").read_text()

    summary = json.loads((run_dir / "final_summary.json").read_text())
    qc = summary["qc"]
    assert qc["worker_qc"]["state"] == "failed"  # pending or failed QC is never passed
    assert qc["worker_qc"]["requested"] == 3 and qc["worker_qc"]["completed"] == 2
    assert qc["worker_qc"]["counts"] == {"blocked": 1, "completed": 2}
    [blocked] = qc["worker_qc"]["outstanding"]
    assert blocked["checkpoint"] == "step-00000008" and blocked["state"] == "blocked" and blocked["failures"] == 2
    assert qc["items"]["worker_qc"] == {"state": "not_passed", "required": True, "count": 2}
    assert qc["not_passed_items"] == ["worker_qc"] and qc["missing_items"] == []
    assert qc["status"] == "failed"
    assert summary["validation"]["status"] == "complete"  # validation and QC are judged apart
    text = (run_dir / "final_summary.txt").read_text()
    assert "QC FAILED: worker QC not passed (failed): step-00000008 blocked after 2 failed attempts" in text

    # the QC backlog from the command line, by the same code as validation's
    status = heavy.traceml("validate", "status", str(run_dir), "--kind", "qc", "--json", timeout=120)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"] == {"blocked": 1, "completed": 2}

    # the Trackio export (a real local store) carries the QC state beside validation's readouts
    pytest.importorskip("trackio", reason="trackio not installed: the [trackio] extra")
    store_env = {**heavy.env, "TRACKIO_DIR": str(tmp_path / "trackio-store")}
    for name in ("TRACKIO_SERVER_URL", "TRACKIO_SPACE_ID", "TRACKIO_WRITE_TOKEN"):
        store_env.pop(name, None)
    export = heavy.traceml("export", "trackio", str(run_dir), "--project", "heavy-qc", "--group", "qc",
                           "--description", "Does heavy QC pass? a blocked QC request", env=store_env)
    assert export.returncode == 0, export.stderr[-2000:]
    dumped = subprocess.run([sys.executable, "-c", DUMP, "heavy-qc", "heavy"], env=store_env, capture_output=True,
                            text=True, timeout=120)
    assert dumped.returncode == 0, dumped.stderr
    infos = [row["info/run"] for row in json.loads(dumped.stdout) if "info/run" in row]
    rows = {r["quantity"]: r["value"] for r in infos[-1]["_value"]}
    assert rows["worker QC"].startswith("worker QC not passed (failed): step-00000008 blocked after 2 failed")
    assert rows["worker QC"].endswith("2/3 QC requests completed")
    assert rows["QC required items"] == "FAILED, not passed: worker_qc (failed, 2/3 QC requests completed)"
    assert str(rows["failed readouts"]) == "0"  # validation completed: the two backlogs are reported apart


def test_the_index_holds_the_qc_backlog_the_files_hold(heavy: Heavy) -> None:
    from daemon.reader import Reader

    now = time.time()
    with Reader(heavy.index) as reader:
        [run] = reader.list_runs(now=now)
        entries = reader.backlog.entries(run.run_id, now=now, kind="qc")
        # file side == index side: the same entries (files, states, attempts) and the same report and word
        assert entries == _qc_entries_from_files(heavy.run_dir, now)
        assert [(e.checkpoint, e.state.value, e.failures) for e in entries] == [
            ("step-00000000", "completed", 0), ("step-00000004", "completed", 1), ("step-00000008", "blocked", 2)]
        report = reader.backlog.worker_qc(run.run_id, now)
        assert report == qc_backlog.worker_qc_report(heavy.run_dir)
        summary = json.loads((heavy.run_dir / "final_summary.json").read_text())
        assert report == {**summary["qc"]["worker_qc"], "errors": []}
        # the two backlogs stay apart: validation's entries, outstanding count and freshness hold no QC file
        validation = reader.backlog.entries(run.run_id, now=now)
        assert [e.checkpoint for e in validation] == [f"step-{s:08d}" for s in (0, 2, 4, 6, 8)]
        assert all(e.state.value == "completed" for e in validation)
        assert reader.backlog.outstanding().get(run.run_id, 0) == 0  # the blocked QC request is not validation's
        view = reader.backlog_view(run.run_id, now=now)
        assert [b.checkpoint for _, b in view.qc_items] == [e.checkpoint for e in entries]
        assert view.worker_qc == (("heavy", report),)
        assert [(state.value, n) for state, n in view.counts] == [("completed", 5)]  # validation's counts
        kinds = {k for (k,) in reader.conn.execute("SELECT DISTINCT kind FROM side_files WHERE path LIKE 'qc/%'")}
        assert kinds == {"qc_request", "qc_receipt", "qc_failure"}


def test_status_json_metrics_and_the_backlog_screen_show_the_index_qc_word(heavy: Heavy, tmp_path: Path) -> None:
    summary = json.loads((heavy.run_dir / "final_summary.json").read_text())
    word = summary["qc"]["worker_qc"]["state"]
    assert word == "failed"

    # traceml status --json: the index's report, equal to the summary's
    js = heavy.traceml("status", "--index", str(heavy.index), "--json")
    assert js.returncode == 0, js.stderr[-2000:]
    [row] = json.loads(js.stdout)["runs"]
    assert row["worker_qc"] == {**summary["qc"]["worker_qc"], "errors": []}

    # a real scrape of a real `traceml daemon --metrics` over the run: the same word, the QC requests by state
    port = _free_port()
    daemon = subprocess.Popen([*heavy.cmd, "daemon", str(heavy.work / "logs"), "--index", str(tmp_path / "m.sqlite"),
                               "--no-inotify", "--metrics", f"127.0.0.1:{port}", "--metrics-retention",
                               str(10 * 365 * 86400)], env=heavy.env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        text = _scrape_until(f"http://127.0.0.1:{port}/metrics", "traceml_worker_qc_state{")
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    samples = _samples(text)
    lab = (("run", "heavy"), ("run_id", str(row["run_id"])))
    states = {dict(k[1])["state"]: v for k, v in samples.items() if k[0] == "traceml_worker_qc_state"}
    assert states == {"passed": 0.0, "pending": 0.0, "failed": 1.0, "not_requested": 0.0}
    assert [s for s, v in states.items() if v == 1.0] == [row["worker_qc"]["state"]]
    qc_requests = {dict(k[1])["state"]: v for k, v in samples.items() if k[0] == "traceml_qc_backlog_requests"}
    assert {s: v for s, v in qc_requests.items() if v} == {"blocked": 1.0, "completed": 2.0}
    assert samples[("traceml_qc_backlog_outstanding", lab)] == 1.0
    assert ("traceml_qc_backlog_oldest_outstanding_age_seconds", lab) in samples
    validation = {dict(k[1])["state"]: v for k, v in samples.items() if k[0] == "traceml_backlog_requests"}
    assert {s: v for s, v in validation.items() if v} == {"completed": 5.0}  # beside validation's, apart

    # the Backlog screen of `traceml watch`: the QC requests beside validation's, and the same word
    panel, columns, rows = asyncio.run(_backlog_screen(heavy.index))
    assert "heavy QC: failed (blocked 1 · completed 2) — step-00000008 blocked" in panel
    assert "completed 5" in panel  # validation's own counts, beside it
    assert columns[:3] == ("Run", "Checkpoint", "Kind")
    kind_at, state_at = columns.index("Kind"), columns.index("State")
    qc_rows = {key: cells for key, cells in rows.items() if cells[kind_at] == "QC"}
    assert {key: cells[state_at] for key, cells in qc_rows.items()} == {
        "heavy/qc:step-00000000": "completed", "heavy/qc:step-00000004": "completed",
        "heavy/qc:step-00000008": "blocked"}
    assert sum(1 for cells in rows.values() if cells[kind_at] == "val") == 5


def test_reingesting_the_qc_backlog_adds_nothing(heavy: Heavy) -> None:
    def held() -> tuple:
        with sqlite3.connect(f"file:{heavy.index}?mode=ro", uri=True) as conn:
            return (conn.execute("SELECT run_id, path, kind, key, size, mtime_ns, content, error FROM side_files"
                                 " ORDER BY run_id, path").fetchall(),
                    conn.execute("SELECT count(*) FROM errors").fetchone()[0],
                    conn.execute("SELECT count(*) FROM runs").fetchone()[0])

    before = held()
    assert sum(1 for row in before[0] if row[1].startswith("qc/")) == 8  # 3 requests, 2 receipts, 3 failures
    again = heavy.index_once(heavy.work / "logs", heavy.index)
    assert "ingested 0 record(s)" in again.stdout + again.stderr
    assert held() == before  # exactly once: a second pass over the same files adds and changes nothing


def test_a_damaged_qc_request_is_one_error_row_and_the_others_still_index(heavy: Heavy, tmp_path: Path) -> None:
    from daemon.reader import Reader

    run = heavy.copy_run(tmp_path)
    damaged = run / QC_FILE
    damaged.write_text(json.dumps({**json.loads(damaged.read_text()), "step": 1 << 63}))  # beyond 64 bits
    index = tmp_path / "damaged.sqlite"
    done = heavy.index_once(run.parent, index)
    assert "refused 1 file(s)" in done.stdout + done.stderr
    now = time.time()
    with Reader(index) as reader:
        [summary] = reader.list_runs(now=now)
        errors = [e for e in reader.events.errors(summary.run_id) if QC_FILE in (e.path or "") + e.message]
        assert len(errors) == 1 and "$.step" in errors[0].message
        entries = reader.backlog.entries(summary.run_id, now=now, kind="qc")
        assert [e.checkpoint for e in entries] == ["step-00000000", "step-00000008"]  # the others still index
        assert entries == _qc_entries_from_files(run, now)
        report = reader.backlog.worker_qc(summary.run_id, now)
    file_side = qc_backlog.worker_qc_report(run)
    assert report == file_side  # the same entries, word and error line as the files give
    [line] = report["errors"]
    assert line.startswith(QC_FILE + ":") and "$.step" in line
    assert report["state"] == "failed"  # the damaged request is no passed QC; the blocked one still fails it


def test_a_later_qc_drain_reaches_the_index_on_its_next_pass(heavy: Heavy, tmp_path: Path) -> None:
    run = heavy.copy_run(tmp_path)
    index = tmp_path / "later.sqlite"
    heavy.index_once(run.parent, index)
    summary = json.loads((run / "final_summary.json").read_text())

    # a later QC drain on the ended run (the worker fixed, one more attempt allowed) re-judges the summary
    plan = tmp_path / "fixed_plan.json"
    plan.write_text(json.dumps({}))
    later = heavy.traceml("validate", "drain", str(run), "--kind", "qc", "--max-attempts", "3", "--", *WORKER,
                          "--qc", cwd=heavy.work, env={**heavy.env, "REALRUNS_QC_PLAN": str(plan)})
    assert later.returncode == 0, later.stderr[-2000:]
    assert "drained: 1 completed" in later.stdout
    after = json.loads((run / "final_summary.json").read_text())
    assert after["qc"]["worker_qc"]["state"] == "passed" and after["qc"]["items"]["worker_qc"]["state"] == "produced"
    assert after["qc"]["status"] == "ok" and after["qc"]["not_passed_items"] == []
    assert "worker QC not passed" not in (run / "final_summary.txt").read_text()
    assert after["validation"] == summary["validation"]  # only the worker QC was judged again

    # the daemon's next pass brings the new receipt into the index: status --json says passed, as the summary
    heavy.index_once(run.parent, index)
    js = heavy.traceml("status", "--index", str(index), "--json")
    assert js.returncode == 0, js.stderr[-2000:]
    [row] = json.loads(js.stdout)["runs"]
    assert row["worker_qc"] == {**after["qc"]["worker_qc"], "errors": []}
