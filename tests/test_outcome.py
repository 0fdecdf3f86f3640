"""Node outcomes: written by each launcher, collected by node 0 (seed 000)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from traceml_tui.guard.contract import contract_digest, parse_guard_contract
from traceml_tui.guard.outcome import (
    MAX_OUTCOME_BYTES,
    OUTCOME_SCHEMA_VERSION,
    build_outcome,
    collect_outcomes,
    launcher_completion,
    outcome_path,
    read_outcome,
    write_outcome,
)

CONTRACT = parse_guard_contract(
    {
        "schema_version": 1,
        "workload": {"name": "ddp-minimal", "parameters": {"model": "tiny-mlp"}},
        "measurement": {"start_step": 1, "completed_steps": 20},
    }
)
DIGEST = contract_digest(CONTRACT)
RUN = "guard-reference"


def report(run_dir: Path, rank: int, exit_code: int = 0, *, nnodes: int = 2, digest: str = DIGEST) -> Path:
    outcome = build_outcome(
        run_name=RUN,
        node_rank=rank,
        nnodes=nnodes,
        nproc_per_node=2,
        contract_digest=digest,
        exit_code=exit_code,
        completed_at=time.time(),
    )
    return write_outcome(run_dir, rank, outcome)


def collect(run_dir: Path, *, nnodes: int = 2, timeout_s: float = 0.5) -> dict:
    return collect_outcomes(
        run_dir, run_name=RUN, nnodes=nnodes, nproc_per_node=2, contract_digest=DIGEST, timeout_s=timeout_s, poll_s=0.05
    )


def expected(rank: int = 0) -> dict:
    return {"run_name": RUN, "node_rank": rank, "nnodes": 2, "nproc_per_node": 2, "contract_digest": DIGEST}


def test_build_outcome_fields_are_exactly_the_seed_list():
    outcome = build_outcome(
        run_name=RUN, node_rank=1, nnodes=2, nproc_per_node=4, contract_digest=DIGEST, exit_code=0, completed_at=0.0
    )
    assert outcome == {
        "schema_version": OUTCOME_SCHEMA_VERSION,
        "run_name": RUN,
        "node_rank": 1,
        "nnodes": 2,
        "nproc_per_node": 4,
        "contract_digest": DIGEST,
        "training": {"status": "completed", "exit_code": 0},
        "completed_at": "1970-01-01T00:00:00+00:00",
    }


@pytest.mark.parametrize(("code", "status", "stored"), [(0, "completed", 0), (1, "failed", 1), (-9, "failed", 137)])
def test_exit_code_decides_training_status(code, status, stored):
    outcome = build_outcome(
        run_name=RUN, node_rank=0, nnodes=1, nproc_per_node=1, contract_digest=DIGEST, exit_code=code, completed_at=1.0
    )
    assert outcome["training"] == {"status": status, "exit_code": stored}


def test_round_trip_is_small_and_holds_no_secret(tmp_path):
    """A launcher writing its outcome leaks nothing from its environment, argv, host or paths."""
    run_dir = tmp_path / "logs" / RUN
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from traceml_tui.guard.outcome import build_outcome, write_outcome
        outcome = build_outcome(run_name={RUN!r}, node_rank=1, nnodes=2, nproc_per_node=2,
                                contract_digest={DIGEST!r}, exit_code=0, completed_at=time.time())
        write_outcome(Path(sys.argv[1]), 1, outcome)
        """
    )
    env = dict(os.environ, SECRET="hunter2", TRACEML_TOKEN="tok-5eCr3t")
    subprocess.run(
        [sys.executable, "-c", script, str(run_dir), "--api-key=argv-s3cret"], env=env, check=True, timeout=60
    )
    path = outcome_path(run_dir, 1)
    assert path == run_dir / "nodes" / "node_1" / "guard_outcome.json"
    data = path.read_bytes()
    assert len(data) <= MAX_OUTCOME_BYTES
    for leaked in (b"hunter2", b"tok-5eCr3t", b"argv-s3cret", str(tmp_path).encode(), socket.gethostname().encode()):
        assert leaked not in data
    assert not [p for p in path.parent.iterdir() if p.name != "guard_outcome.json"]  # no temp file left
    status, payload = read_outcome(path, expected=expected(1))
    assert status == "ok"
    assert payload == json.loads(data)


def test_write_refuses_mismatched_node(tmp_path):
    outcome = build_outcome(
        run_name=RUN, node_rank=0, nnodes=2, nproc_per_node=2, contract_digest=DIGEST, exit_code=0, completed_at=1.0
    )
    with pytest.raises(ValueError):
        write_outcome(tmp_path, 1, outcome)
    assert not outcome_path(tmp_path, 1).exists()


def test_all_nodes_completed(tmp_path):
    report(tmp_path, 0)
    report(tmp_path, 1)
    block = collect(tmp_path, timeout_s=30)  # returns at once: everything is there
    assert block == {
        "status": "completed",
        "nodes_expected": 2,
        "nodes_observed": 2,
        "reasons": [],
        "nodes": [{"node_rank": 0, "exit_code": 0}, {"node_rank": 1, "exit_code": 0}],
    }
    assert launcher_completion(block) == {"status": "completed", "nodes_observed": 2, "reason_codes": []}


def test_one_node_failed(tmp_path):
    report(tmp_path, 0)
    report(tmp_path, 1, exit_code=3)
    block = collect(tmp_path)
    assert block["status"] == "incomplete"
    assert block["reasons"] == ["node_training_failed"]
    assert block["nodes_observed"] == 2
    assert block["nodes"] == [{"node_rank": 0, "exit_code": 0}, {"node_rank": 1, "exit_code": 3}]


def test_missing_node_after_timeout(tmp_path):
    report(tmp_path, 0)
    block = collect(tmp_path, timeout_s=0.5)
    assert block["status"] == "incomplete"
    assert block["reasons"] == ["node_outcome_missing"]
    assert block["nodes_expected"] == 2 and block["nodes_observed"] == 1
    assert block["nodes"] == [{"node_rank": 0, "exit_code": 0}]


def test_late_node_is_waited_for(tmp_path):
    report(tmp_path, 0)
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import time, sys
                from pathlib import Path
                from traceml_tui.guard.outcome import build_outcome, write_outcome
                time.sleep(0.3)
                write_outcome(Path(sys.argv[1]), 1, build_outcome(run_name={RUN!r}, node_rank=1, nnodes=2,
                    nproc_per_node=2, contract_digest={DIGEST!r}, exit_code=0, completed_at=time.time()))
                """
            ),
            str(tmp_path),
        ]
    )
    try:
        block = collect(tmp_path, timeout_s=60)
    finally:
        writer.wait(timeout=60)
    assert block["status"] == "completed" and block["nodes_observed"] == 2


def test_forged_digest_is_a_conflict(tmp_path):
    report(tmp_path, 0)
    other = contract_digest({**CONTRACT, "workload": {"name": "other", "parameters": {}}})
    report(tmp_path, 1, digest=other)
    block = collect(tmp_path)
    assert block["status"] == "incomplete"
    assert block["reasons"] == ["node_outcome_conflict"]
    assert block["nodes"] == [{"node_rank": 0, "exit_code": 0}]
    assert read_outcome(outcome_path(tmp_path, 1), expected=expected(1))[0] == "conflict"


def test_other_topology_or_run_is_a_conflict(tmp_path):
    report(tmp_path, 0, nnodes=3)
    assert read_outcome(outcome_path(tmp_path, 0), expected=expected(0))[0] == "conflict"
    assert read_outcome(outcome_path(tmp_path, 0), expected={**expected(0), "nnodes": 3, "run_name": "x"})[0] == (
        "conflict"
    )


def test_oversized_outcome_is_invalid(tmp_path):
    report(tmp_path, 0)
    big = outcome_path(tmp_path, 1)
    big.parent.mkdir(parents=True)
    payload = json.loads(outcome_path(tmp_path, 0).read_text())
    payload.update(node_rank=1, padding="x" * (1024 * 1024))
    big.write_text(json.dumps(payload))
    assert big.stat().st_size > 1024 * 1024
    block = collect(tmp_path)
    assert block["reasons"] == ["node_outcome_invalid"]
    assert block["status"] == "incomplete" and block["nodes_observed"] == 1


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"", b"\xff\xfe", b"[1, 2]", b'{"schema_version": 2}', b"null"],
    ids=["malformed", "empty", "bad-utf8", "list", "schema-2", "null"],
)
def test_malformed_outcome_is_invalid(tmp_path, content):
    report(tmp_path, 0)
    bad = outcome_path(tmp_path, 1)
    bad.parent.mkdir(parents=True)
    bad.write_bytes(content)
    block = collect(tmp_path)
    assert block["reasons"] == ["node_outcome_invalid"]
    assert block["status"] == "incomplete"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("training", {"status": "completed", "exit_code": 1}),
        ("training", {"status": "failed", "exit_code": 0}),
        ("training", {"status": "completed", "exit_code": True}),
        ("training", {"status": "done", "exit_code": 0}),
        ("completed_at", ""),
        ("node_rank", "1"),
        ("contract_digest", None),
        ("schema_version", True),
    ],
)
def test_inconsistent_record_is_invalid(tmp_path, field, value):
    path = report(tmp_path, 1)
    payload = json.loads(path.read_text())
    payload[field] = value
    path.write_text(json.dumps(payload))
    assert read_outcome(path, expected=expected(1)) == ("invalid", None)


def test_fifo_does_not_hang_collection(tmp_path):
    report(tmp_path, 0)
    fifo = outcome_path(tmp_path, 1)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    block = collect(tmp_path, timeout_s=5)
    assert block["reasons"] == ["node_outcome_invalid"]


def test_symlinked_outcome_is_invalid(tmp_path):
    real = report(tmp_path / "elsewhere", 1)
    link = outcome_path(tmp_path, 1)
    link.parent.mkdir(parents=True)
    link.symlink_to(real)
    assert read_outcome(link, expected=expected(1)) == ("invalid", None)


def test_several_reasons_are_sorted_and_unique(tmp_path):
    report(tmp_path, 0, exit_code=1, nnodes=4)
    report(tmp_path, 1, exit_code=2, nnodes=4)
    bad = outcome_path(tmp_path, 2)
    bad.parent.mkdir(parents=True)
    bad.write_text("{")
    block = collect(tmp_path, nnodes=4, timeout_s=0.2)
    assert block["reasons"] == ["node_outcome_invalid", "node_outcome_missing", "node_training_failed"]
    assert block["nodes_observed"] == 2
    assert launcher_completion(block) == {
        "status": "incomplete",
        "nodes_observed": 2,
        "reason_codes": ["node_outcome_invalid", "node_outcome_missing", "node_training_failed"],
    }


def test_internal_error_is_reported_not_raised(tmp_path):
    block = collect_outcomes(
        tmp_path, run_name=RUN, nnodes=0, nproc_per_node=2, contract_digest=DIGEST, timeout_s=0.1
    )
    assert block["status"] == "incomplete"
    assert block["reasons"] == ["node_outcome_collection_failed"]
    block = collect_outcomes(
        tmp_path, run_name=RUN, nnodes=1, nproc_per_node=2, contract_digest=DIGEST, timeout_s="soon"  # type: ignore[arg-type]
    )
    assert block["reasons"] == ["node_outcome_collection_failed"]


@pytest.mark.parametrize(
    "block",
    [
        None,
        [],
        {"status": "done", "nodes_observed": 1, "reasons": []},
        {"status": "completed", "nodes_observed": -1, "reasons": []},
        {"status": "completed", "nodes_observed": True, "reasons": []},
        {"status": "incomplete", "nodes_observed": 1, "reasons": ["made_up"]},
    ],
)
def test_malformed_training_block_has_no_launcher_completion(block):
    assert launcher_completion(block) is None
