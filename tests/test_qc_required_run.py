"""A real 2-rank run whose QC block requires a batch grid it never logs (issue acceptance; docs/qc.md).

`traceml run` launches tests/scripts/qc_train.py (gloo DDP) next to a traceml.yaml
whose bound `hygiene.qc` requires batch_grid, field_stats and galleries; the script
records the field and the gallery at the declared cadence but never a batch grid.
The summary must name batch_grid as the missing item and fail QC, while the
items it did produce are `produced`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from traceml_tui.hygiene import qc_block

SCRIPT = Path(__file__).resolve().parent / "scripts" / "qc_train.py"
#: the bound roster leaves out src-35, which the script's gallery shows: the sidecar names it
MEMBERS = [f"src-{i:02d}" for i in range(35)]


def _config() -> dict:
    return {
        "mode": "summary",
        "history_enabled": True,
        "hygiene": {
            "history": {"schema": 1, "output": "ranks"},
            "curve": {"cadence": 2},
            "validation": {"recipe": "qc-run-v1", "cadence": 2, "first_evaluation": 0,
                           "worker": ["python", "validate.py", "--checkpoint", "{checkpoint}"],
                           "dispatcher": "external"},
            "early_stopping": {"enabled": False, "reason": "a fixed 6-update QC test"},
            "qc": {
                "cadence": 2,
                "owner": "qc-tests",
                "output": "qc",
                "roster": {"name": "fixed-35", "members": MEMBERS, "selection": "the first 35 of a seeded draw"},
                "items": {"batch_grid": "required", "field_stats": "required", "galleries": "required",
                          "worker_qc": {"inapplicable": "no heavy QC in this test"}},
            },
        },
    }


@pytest.mark.slow
def test_a_required_batch_grid_never_logged_is_a_named_failure(tmp_path: Path, cli_env: dict, traceml_cmd) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(SCRIPT, work / "qc_train.py")
    (work / "traceml.yaml").write_text(yaml.safe_dump(_config(), sort_keys=False))
    proc = subprocess.run([*traceml_cmd, "run", "qc_train.py", "--run-name", "qc", "--nproc-per-node", "2",
                           "--args", "--steps", "6"], cwd=work, env=cli_env, capture_output=True, text=True,
                          timeout=600)
    run_dir = work / "logs" / "qc"
    summary_path = run_dir / "final_summary.json"
    assert summary_path.is_file(), f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    summary = json.loads(summary_path.read_text())
    qc = summary["qc"]

    assert qc["bound"] is True and qc["owner"] == "qc-tests"
    assert qc["roster"]["digest"] == qc_block.roster_digest(MEMBERS) and qc["roster"]["size"] == 35
    assert qc["missing_items"] == ["batch_grid"]
    assert qc["status"] == "failed"
    assert qc["items"]["batch_grid"] == {"state": "missing", "required": True, "count": 0}
    # the items the script did produce are judged produced: the failure is the missing one alone
    assert qc["items"]["field_stats"]["state"] == "produced" and qc["fields"]["hidden"]["status"] == "ok"
    assert qc["items"]["galleries"] == {"state": "produced", "required": True, "count": 4}  # updates 0, 2, 4, 6
    assert qc["items"]["worker_qc"]["state"] == "inapplicable"
    text = (run_dir / "final_summary.txt").read_text()
    assert "QC FAILED: required item batch_grid was never produced" in text
    assert not (run_dir / "qc" / "batch_grid").exists()

    # the galleries the run saved: rank 0 only, every one with its measures beside it
    sidecars = sorted((run_dir / "qc/gallery/roster").glob("step-*.json"))
    assert [p.name for p in sidecars] == [f"step-{s:08d}.json" for s in (0, 2, 4, 6)]
    meta = json.loads(sidecars[-1].read_text())
    assert meta["pages"] == 2 and [g["available"] for g in meta["groups"]] == [20, 16]
    assert meta["measures"]["overall"]["coverage"]["value"] == 1.0
    assert meta["roster"] == {"name": "fixed-35", "digest": qc_block.roster_digest(MEMBERS),
                              "outside_roster": ["src-35"]}

    # the Trackio export's run table says the same, in the same words (a real local store)
    pytest.importorskip("trackio", reason="trackio not installed")
    env = dict(cli_env, TRACKIO_DIR=str(tmp_path / "trackio-store"))
    for name in ("TRACKIO_SERVER_URL", "TRACKIO_SPACE_ID", "TRACKIO_WRITE_TOKEN"):
        env.pop(name, None)
    sent = subprocess.run([*traceml_cmd, "export", "trackio", str(run_dir), "--project", "qc-tests", "--group", "g",
                           "--description", "Does a missing batch grid fail QC?"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert sent.returncode == 0, sent.stderr
    dump = ("import json, sys\nfrom trackio.sqlite_storage import SQLiteStorage\n"
            "print(json.dumps(SQLiteStorage.get_logs('qc-tests', 'qc'), default=str))")
    logs = json.loads(subprocess.run([sys.executable, "-c", dump], env=env, capture_output=True, text=True,
                                     timeout=120, check=True).stdout)
    table = [row["info/run"] for row in logs if "info/run" in row][-1]
    info = {row["quantity"]: row["value"] for row in table["_value"]}
    assert info["QC required items"] == "FAILED, never produced: batch_grid"
    assert {k for row in logs for k in row if k.startswith("gallery/roster/")} == {
        f"gallery/roster/{m}/qc" for m in ("coverage", "top_k_share", "gini", "entropy", "diversity")}
