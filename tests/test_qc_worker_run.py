"""Heavy QC through the backlog, in a real run (issue acceptance; docs/qc.md "Heavy QC through the backlog").

`traceml run --nproc-per-node 2` launches tests/scripts/qc_worker_train.py (gloo DDP), which publishes a
checkpoint at initialization and every 2 updates. Its traceml.yaml requires `worker_qc` at QC cadence 4, with
tests/scripts/validator.py --qc as the QC worker: the launcher writes QC requests for updates 0, 4 and 8 and
drains them with the same drainer as validation. The QC plan fails update 4 once (retried, then a receipt)
and update 8 always (blocked after max_attempts). The summary, its text and `traceml status --json` must all
say worker QC did not pass, naming the blocked checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from support import realruns

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


async def _backlog_screen_text(index: Path) -> str:
    """The Backlog screen's summary panel of the one run in ``index``, in the real Textual app."""
    from traceml_tui.tui.app import create_app
    from traceml_tui.tui.screens.backlog import BacklogScreen
    from traceml_tui.tui.source import IndexSource
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
            return str(pilot.app.screen.query_one("#backlog-summary", InfoPanel).render())
    finally:
        source.close()


@pytest.mark.slow
def test_worker_qc_requests_receipts_retry_and_a_blocked_request_not_passed(
        tmp_path: Path, cli_env: dict, traceml_cmd) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(SCRIPT, work / "qc_worker_train.py")
    shutil.copy(realruns.VALIDATOR_SCRIPT, work / "validator.py")
    (work / "traceml.yaml").write_text(yaml.safe_dump(_config(), sort_keys=False))
    plan = work / "qc_plan.json"
    plan.write_text(json.dumps({"step-00000004": "fail_once", "step-00000008": "fail"}))
    env = {**cli_env, "REALRUNS_QC_PLAN": str(plan)}
    proc = subprocess.run([*traceml_cmd, "run", "qc_worker_train.py", "--run-name", "heavy", "--nproc-per-node", "2",
                           "--args", "--steps", "8"], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    run_dir = work / "logs" / "heavy"
    assert proc.returncode == 0, proc.stderr[-3000:]

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

    # traceml status --json shows the same report, from the daemon's side of the same core rules
    index = tmp_path / "index.sqlite"
    done = subprocess.run([*traceml_cmd, "daemon", str(work / "logs"), "--index", str(index), "--once"],
                          env=cli_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    js = subprocess.run([*traceml_cmd, "status", "--index", str(index), "--json"], env=cli_env,
                        capture_output=True, text=True, timeout=300)
    assert js.returncode == 0, js.stderr[-2000:]
    [row] = json.loads(js.stdout)["runs"]
    assert row["worker_qc"] == {**qc["worker_qc"], "errors": []}

    # the Backlog screen of `traceml watch` shows the run's QC backlog beside validation, in the same words
    backlog_text = asyncio.run(_backlog_screen_text(index))
    assert "heavy QC: failed (blocked 1 · completed 2) — step-00000008 blocked" in backlog_text
    assert "completed 5" in backlog_text  # validation's own counts, beside it

    # the QC backlog from the command line, by the same code as validation's
    status = subprocess.run([*traceml_cmd, "validate", "status", str(run_dir), "--kind", "qc", "--json"],
                            env=cli_env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"] == {"blocked": 1, "completed": 2}

    # the Trackio export (a real local store) carries the QC state beside validation's readouts
    pytest.importorskip("trackio", reason="trackio not installed: the [trackio] extra")
    store_env = {**cli_env, "TRACKIO_DIR": str(tmp_path / "trackio-store")}
    for name in ("TRACKIO_SERVER_URL", "TRACKIO_SPACE_ID", "TRACKIO_WRITE_TOKEN"):
        store_env.pop(name, None)
    export = subprocess.run([*traceml_cmd, "export", "trackio", str(run_dir), "--project", "heavy-qc", "--group",
                             "qc", "--description", "Does heavy QC pass? a blocked QC request"], env=store_env,
                            capture_output=True, text=True, timeout=300)
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

    # a later QC drain on the ended run (the worker fixed, one more attempt allowed) re-judges the summary
    plan.write_text(json.dumps({}))
    later = subprocess.run([*traceml_cmd, "validate", "drain", str(run_dir), "--kind", "qc", "--max-attempts", "3",
                            "--", *WORKER, "--qc"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert later.returncode == 0, later.stderr[-2000:]
    assert "drained: 1 completed" in later.stdout
    after = json.loads((run_dir / "final_summary.json").read_text())
    assert after["qc"]["worker_qc"]["state"] == "passed" and after["qc"]["items"]["worker_qc"]["state"] == "produced"
    assert after["qc"]["status"] == "ok" and after["qc"]["not_passed_items"] == []
    assert "worker QC not passed" not in (run_dir / "final_summary.txt").read_text()
    assert after["validation"] == summary["validation"]  # only the worker QC was judged again
