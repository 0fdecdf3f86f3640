"""Heavy QC through the backlog (hygiene/qc_backlog.py, docs/qc.md): one implementation, two kinds.

Real drainer processes (`traceml validate drain --kind qc`) over real files; the QC block refusals; the pure
worker-QC rule against its contract (hypothesis). The real 2-rank run is tests/test_qc_worker_run.py.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from traceml_tui.core import backlog as core_backlog
from traceml_tui.core.state import BacklogState, WorkerQcState, decide_worker_qc
from traceml_tui.hygiene import backlog, qc_backlog, qc_block
from traceml_tui.hygiene.checkpoints import publish_request
from traceml_tui.hygiene.config import HygieneConfigError, parse_hygiene, validation_config_digest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = yaml.safe_load((REPO / "examples" / "hygiene" / "traceml.yaml").read_text())
WORKER = ["sh", "-c", 'echo "{\\"dead_units\\": $2}"', "sh", "{checkpoint}", "{step}"]
QC = {
    "cadence": 200,  # the example publishes every 100 updates from 0: QC points 0, 200, 400 …
    "owner": "qc-tests",
    "output": "qc",
    "roster": {"name": "fixed-2", "members": ["a", "b"], "selection": "two named cases"},
    "items": {"batch_grid": {"inapplicable": "x"}, "field_stats": {"inapplicable": "x"},
              "galleries": {"inapplicable": "x"}, "worker_qc": "required"},
    "recipe": "heavy-qc-v1",
    "worker": WORKER,
}


def _hygiene(qc: dict, **validation) -> dict:
    block = copy.deepcopy(EXAMPLE["hygiene"])
    block["qc"] = copy.deepcopy(qc)
    block["validation"].update(validation)
    return block


def _publish(run_dir: Path, steps, qc: dict) -> list[dict]:
    """Publish real checkpoints (validation requests) and the QC requests of their QC points."""
    run_dir.mkdir(parents=True, exist_ok=True)
    weights = run_dir / "weights.bin"
    weights.write_bytes(b"weights")
    out = []
    for step in steps:
        request = publish_request(run_dir, weights, step=step, config_digest="sha256:validation")
        out.append(qc_backlog.publish_qc_request(run_dir, request, qc))
    return out


def _drain(traceml_cmd, run_dir: Path, worker: list[str], *extra: str) -> list[str]:
    return [*traceml_cmd, "validate", "drain", str(run_dir), "--kind", "qc", *extra, "--", *worker]


# --------------------------------------------------------------------------- the block


def test_a_required_worker_qc_normalizes_with_its_recipe_and_worker() -> None:
    qc = parse_hygiene(_hygiene(QC))["qc"]
    assert qc["items"]["worker_qc"] == {"required": True}
    assert qc["recipe"] == "heavy-qc-v1" and qc["worker"] == WORKER
    assert qc_backlog.declared_worker(qc) == {"recipe": "heavy-qc-v1", "worker": WORKER, "cadence": 200}


@pytest.mark.parametrize("change,said", [
    ({"worker": None}, "hygiene.qc.worker: required"),
    ({"worker": ["sh", "-c", "true"]}, "hygiene.qc.worker: must pass the checkpoint"),
    ({"recipe": None}, "hygiene.qc.recipe: required"),
    ({"cadence": 150}, "hygiene.qc.cadence: 150 is not a multiple of validation.cadence 100"),
])
def test_a_bad_worker_qc_block_is_refused_naming_the_field(change: dict, said: str) -> None:
    qc = {**QC, **change}
    with pytest.raises(HygieneConfigError) as err:
        parse_hygiene(_hygiene({k: v for k, v in qc.items() if v is not None}))
    assert str(err.value).startswith(said), str(err.value)


def test_worker_qc_needs_initialization_published() -> None:
    with pytest.raises(HygieneConfigError) as err:
        parse_hygiene(_hygiene(QC, first_evaluation=100))
    assert str(err.value).startswith("hygiene.validation.first_evaluation: must be 0 with items.worker_qc")


def test_a_worker_without_a_required_worker_qc_is_refused() -> None:
    qc = copy.deepcopy(QC)
    qc["items"]["worker_qc"] = {"inapplicable": "heavy QC runs in validate.py"}
    with pytest.raises(HygieneConfigError) as err:
        parse_hygiene(_hygiene(qc))
    assert str(err.value).startswith("hygiene.qc.recipe: only with items.worker_qc: required")


# --------------------------------------------------------------------------- requests and drains


def test_qc_requests_are_written_at_initialization_and_qc_points_only(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    written = _publish(run_dir, [0, 100, 200, 300, 400], parse_hygiene(_hygiene(QC))["qc"])
    assert [r["step"] if r else None for r in written] == [0, None, 200, None, 400]
    qc_requests = backlog.list_requests(run_dir, kind="qc")
    assert [r["checkpoint"] for r in qc_requests] == ["step-00000000", "step-00000200", "step-00000400"]
    for request in qc_requests:  # the same immutable checkpoint as its validation request, bound to the QC digest
        validation = json.loads(Path(run_dir / "validation/requests" / f"{request['checkpoint']}.json").read_text())
        assert request["path"] == validation["path"]
        assert request["config_digest"] == validation_config_digest(
            {"validation": {"recipe": "heavy-qc-v1", "worker": WORKER}})
    # a run without a required worker QC writes none
    other = tmp_path / "plain"
    assert _publish(other, [0], parse_hygiene(_hygiene({"cadence": 100}))["qc"]) == [None]
    assert not (other / "qc").exists()


def test_the_same_drainer_serves_qc_and_leaves_validation_alone(tmp_path: Path, traceml_cmd, cli_env) -> None:
    run_dir = tmp_path / "run"
    _publish(run_dir, [0, 100, 200], parse_hygiene(_hygiene(QC))["qc"])
    done = subprocess.run(_drain(traceml_cmd, run_dir, WORKER, "--recipe", "heavy-qc-v1"), env=cli_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "drained: 2 completed, 0 failed" in done.stdout
    assert sorted(backlog.list_receipts(run_dir, kind="qc")) == ["step-00000000", "step-00000200"]
    assert backlog.read_receipt(run_dir, "step-00000200", kind="qc")["metrics"] == {"dead_units": 200.0}
    assert backlog.list_receipts(run_dir) == {}  # the validation backlog is untouched: its 3 requests wait
    assert backlog.backlog_status(run_dir)["counts"] == {"pending": 3}
    assert qc_backlog.worker_qc_report(run_dir)["state"] == "passed"
    # and a validation drain never takes QC requests
    val_worker = ["sh", "-c", 'echo "{\\"r2\\": 1}"', "sh", "{checkpoint}"]
    subprocess.run([*traceml_cmd, "validate", "drain", str(run_dir), "--no-curve", "--", *val_worker], env=cli_env,
                   capture_output=True, text=True, timeout=120, check=True)
    assert len(backlog.list_receipts(run_dir)) == 3 and len(backlog.list_receipts(run_dir, kind="qc")) == 2


def test_a_qc_request_bound_to_another_recipe_is_refused_unclaimed(tmp_path: Path, traceml_cmd, cli_env) -> None:
    run_dir = tmp_path / "run"
    _publish(run_dir, [0], parse_hygiene(_hygiene(QC))["qc"])
    done = subprocess.run(_drain(traceml_cmd, run_dir, WORKER, "--recipe", "another-qc"), env=cli_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "step-00000000 was requested for validation config sha256:" in done.stderr
    assert backlog.list_receipts(run_dir, kind="qc") == {} and not list((run_dir / "qc/claims").glob("*.json"))


def test_failed_qc_is_retried_then_blocked_and_never_passed(tmp_path: Path, traceml_cmd, cli_env) -> None:
    run_dir = tmp_path / "run"
    block = parse_hygiene(_hygiene(QC))["qc"]
    _publish(run_dir, [0, 200], block)
    failing = ["sh", "-c", 'if [ "$2" = 200 ]; then echo broken >&2; exit 3; fi; echo "{\\"ok\\": 1}"', "sh",
               "{checkpoint}", "{step}"]
    for attempt in (1, 2, 3):  # no manifest here: the default max_attempts (3) of core/state.py
        subprocess.run(_drain(traceml_cmd, run_dir, failing, "--retry-backoff", "0"),
                       env=cli_env, capture_output=True, text=True, timeout=120, check=True)
        report = qc_backlog.worker_qc_report(run_dir)
        assert report["state"] == ("pending" if attempt < 3 else "failed")  # retried, then blocked
    [row] = report["outstanding"]
    assert row["checkpoint"] == "step-00000200" and row["failures"] == 3 and "broken" in row["last_error"]
    # the summary's rule: a required worker QC that did not pass fails QC, named
    section = qc_block.qc_report(run_dir, block, {"status": "not_recorded", "fields": {}, "failed_fields": []})
    assert section["items"]["worker_qc"]["state"] == "not_passed" and section["status"] == "failed"
    assert section["not_passed_items"] == ["worker_qc"]
    assert qc_block.items_word(section, True).startswith("FAILED, not passed: worker_qc (failed, 1/2")
    assert any(line.startswith("QC FAILED: worker QC not passed (failed): step-00000200 blocked after 3")
               for line in qc_block.report_lines(section))
    # the status command reads the QC backlog with the validation backlog's words
    status = subprocess.run([*traceml_cmd, "validate", "status", str(run_dir), "--kind", "qc"], env=cli_env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "1 blocked, 1 completed" in status.stdout


def test_no_qc_request_is_a_missing_worker_qc(tmp_path: Path) -> None:
    block = parse_hygiene(_hygiene(QC))["qc"]
    (tmp_path / "run").mkdir()
    section = qc_block.qc_report(tmp_path / "run", block, {"status": "not_recorded", "fields": {}, "failed_fields": []})
    assert section["items"]["worker_qc"]["state"] == "missing" and section["missing_items"] == ["worker_qc"]
    assert section["worker_qc"]["state"] == "not_requested" and section["status"] == "failed"


def test_a_damaged_qc_file_is_named_and_the_others_still_reported(tmp_path: Path, traceml_cmd, cli_env) -> None:
    run_dir = tmp_path / "run"
    _publish(run_dir, [0, 200], parse_hygiene(_hygiene(QC))["qc"])
    (run_dir / "qc/receipts/step-00000200.json").write_text("{not json")
    status = subprocess.run([*traceml_cmd, "validate", "status", str(run_dir), "--kind", "qc", "--json"],
                            env=cli_env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 1
    assert status.stderr.strip().startswith("traceml validate: damaged backlog file qc/receipts/step-00000200.json:")
    assert json.loads(status.stdout)["counts"] == {"pending": 2}  # a damaged receipt is no result


# --------------------------------------------------------------------------- the rule


@given(st.lists(st.sampled_from(list(BacklogState)), max_size=12))
def test_worker_qc_passes_only_when_every_request_completed(states: list[BacklogState]) -> None:
    word = decide_worker_qc(states)
    if not states:
        assert word is WorkerQcState.NOT_REQUESTED
    elif BacklogState.BLOCKED in states:
        assert word is WorkerQcState.FAILED
    elif all(s is BacklogState.COMPLETED for s in states):
        assert word is WorkerQcState.PASSED
    else:
        assert word is WorkerQcState.PENDING  # pending, claimed or failed QC is never passed
    assert (word is WorkerQcState.PASSED) == (bool(states) and not any(core_backlog.is_outstanding(s) for s in states))
