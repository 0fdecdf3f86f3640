"""Node outcomes of a guarded run (seed 000, "Saved artifacts and completion checks").

After its local training command exits, every guarded launcher writes
``<run>/nodes/node_<k>/guard_outcome.json``: a small, versioned record bound
to the run by its public name, the launch topology and the digest of the
normalized contract. Node 0 then collects the expected outcomes, within a
bounded wait, into the ``guard.training`` block of ``manifest.json``; the
final summary carries only the aggregate ``launcher_completion``.

The record layout is the one the published traceml-ai package writes, so
either tool's collector accepts the other's outcomes::

    {"schema_version": 1, "run_name": "...", "node_rank": 0, "nnodes": 2,
     "nproc_per_node": 4, "contract_digest": "sha256:...",
     "training": {"status": "completed", "exit_code": 0},
     "completed_at": "2026-01-01T00:00:00+00:00"}

It never holds command arguments, paths, host names, environment contents,
device identifiers or credentials.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from traceml_tui.core.atomic import atomic_write_json
from traceml_tui.core.jsonsafe import loads_bounded
from traceml_tui.core.rundir import OUTCOME, RunDir

OUTCOME_SCHEMA_VERSION = 1
MAX_OUTCOME_BYTES = 16 * 1024
OUTCOME_FILENAME = OUTCOME

REASON_MISSING = "node_outcome_missing"
REASON_INVALID = "node_outcome_invalid"
REASON_CONFLICT = "node_outcome_conflict"
REASON_FAILED = "node_training_failed"
REASON_COLLECTION_FAILED = "node_outcome_collection_failed"
REASON_CODES = frozenset({REASON_MISSING, REASON_INVALID, REASON_CONFLICT, REASON_FAILED, REASON_COLLECTION_FAILED})

_STATUS_TO_REASON = {"missing": REASON_MISSING, "invalid": REASON_INVALID, "conflict": REASON_CONFLICT}


def outcome_path(run_dir: Path, node_rank: int) -> Path:
    """Where node ``node_rank`` of the run in ``run_dir`` reports its outcome."""
    return RunDir(run_dir).outcome(node_rank)


def _exit_code(value: int) -> int:
    # subprocess reports death by signal N as -N; record the shell's 128+N so
    # the stored code is a non-negative exit status any reader accepts.
    code = int(value)
    return 128 - code if code < 0 else code


def build_outcome(
    *,
    run_name: str,
    node_rank: int,
    nnodes: int,
    nproc_per_node: int,
    contract_digest: str,
    exit_code: int,
    completed_at: float,
) -> dict:
    """The outcome record of one node, from facts only (no environment, paths or hosts).

    ``exit_code`` 0 records ``completed`` training, anything else ``failed``;
    a negative code (killed by signal N) is stored as ``128 + N``.
    ``completed_at`` is a Unix time, stored as an ISO-8601 UTC string.
    """
    code = _exit_code(exit_code)
    return {
        "schema_version": OUTCOME_SCHEMA_VERSION,
        "run_name": str(run_name),
        "node_rank": int(node_rank),
        "nnodes": int(nnodes),
        "nproc_per_node": int(nproc_per_node),
        "contract_digest": str(contract_digest),
        "training": {"status": "completed" if code == 0 else "failed", "exit_code": code},
        "completed_at": datetime.fromtimestamp(float(completed_at), timezone.utc).isoformat(),
    }


def write_outcome(run_dir: Path, node_rank: int, outcome: dict) -> Path:
    """Atomically write ``outcome`` as ``nodes/node_<k>/guard_outcome.json``; return its path.

    Raises ``ValueError`` when the record names another node or would exceed
    :data:`MAX_OUTCOME_BYTES` (a reader would reject it anyway).
    """
    if outcome.get("node_rank") != node_rank:
        raise ValueError(f"outcome is for node {outcome.get('node_rank')!r}, not node {node_rank}")
    encoded = json.dumps(outcome, allow_nan=False, ensure_ascii=False).encode("utf-8")
    if len(encoded) > MAX_OUTCOME_BYTES:
        raise ValueError(f"outcome is {len(encoded)} bytes, over the {MAX_OUTCOME_BYTES}-byte limit")
    path = outcome_path(run_dir, node_rank)
    atomic_write_json(path, outcome)
    return path


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_outcome(payload: Any, *, expected: Mapping[str, Any]) -> tuple[str, dict | None]:
    """Classify a parsed outcome against the run it should belong to.

    ``expected`` holds ``run_name``, ``node_rank``, ``nnodes``,
    ``nproc_per_node`` and ``contract_digest``. Returns ``("ok", payload)``,
    ``("invalid", None)`` for a malformed record or unsupported schema, or
    ``("conflict", payload)`` for a well-formed record of another run,
    topology or declaration.
    """
    if not isinstance(payload, dict):
        return "invalid", None
    version = payload.get("schema_version")
    if not _is_int(version) or version != OUTCOME_SCHEMA_VERSION:
        return "invalid", None
    run_name = payload.get("run_name")
    topology = tuple(payload.get(key) for key in ("node_rank", "nnodes", "nproc_per_node"))
    digest = payload.get("contract_digest")
    completed_at = payload.get("completed_at")
    training = payload.get("training")
    if (
        not isinstance(run_name, str)
        or not all(_is_int(value) for value in topology)
        or not isinstance(digest, str)
        or not isinstance(completed_at, str)
        or not completed_at
        or not isinstance(training, dict)
    ):
        return "invalid", None
    exit_code = training.get("exit_code")
    status = training.get("status")
    if not _is_int(exit_code) or exit_code < 0 or status not in ("completed", "failed"):
        return "invalid", None
    if (exit_code == 0) != (status == "completed"):
        return "invalid", None
    if (
        run_name != expected["run_name"]
        or topology != (expected["node_rank"], expected["nnodes"], expected["nproc_per_node"])
        or digest != expected["contract_digest"]
    ):
        return "conflict", payload
    return "ok", payload


def _read_bounded(path: Path) -> bytes | None:
    """Bytes of a regular file no larger than the limit; None when it is too large."""
    # O_NONBLOCK: opening a FIFO planted at the path must not hang node 0.
    # O_NOFOLLOW: an outcome is written in place by its launcher, never linked.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        if info.st_size > MAX_OUTCOME_BYTES:
            return None
        chunks: list[bytes] = []
        remaining = MAX_OUTCOME_BYTES + 1  # a file that grew after fstat is still caught
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return None if len(data) > MAX_OUTCOME_BYTES else data


def read_outcome(path: Path, *, expected: Mapping[str, Any]) -> tuple[str, dict | None]:
    """Read and classify one outcome file: ``ok``, ``missing``, ``invalid`` or ``conflict``.

    ``invalid`` covers unreadable files, non-regular files, files over
    :data:`MAX_OUTCOME_BYTES` (checked before reading them whole), bad UTF-8,
    malformed JSON and unsupported schemas. See :func:`validate_outcome` for
    ``expected``.
    """
    path = Path(path)
    try:
        data = _read_bounded(path)
    except FileNotFoundError:
        return "missing", None
    except OSError:
        return "invalid", None
    if data is None:
        return "invalid", None
    try:
        payload = loads_bounded(data.decode("utf-8"))  # nested deeper than jsonsafe.MAX_DEPTH: ValueError
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "invalid", None
    return validate_outcome(payload, expected=expected)


def _training_block(expected_nodes: int, observed: dict[int, int], reasons: set[str]) -> dict:
    complete = not reasons and len(observed) == expected_nodes
    return {
        "status": "completed" if complete else "incomplete",
        "nodes_expected": expected_nodes,
        "nodes_observed": len(observed),
        "reasons": sorted(reasons),
        "nodes": [{"node_rank": rank, "exit_code": observed[rank]} for rank in sorted(observed)],
    }


def collect_outcomes(
    run_dir: Path,
    *,
    run_name: str,
    nnodes: int,
    nproc_per_node: int,
    contract_digest: str,
    timeout_s: float,
    poll_s: float = 0.2,
) -> dict:
    """Collect every expected node outcome into the manifest's ``guard.training`` block.

    Waits up to ``timeout_s`` for outcomes that are not there yet and returns
    as soon as every node has been classified. ``nodes`` lists the valid
    outcomes (completed or failed) in node order; invalid and conflicting
    records are counted only in ``reasons``. ``status`` is ``completed`` only
    when every expected node reported exit code 0. Never raises: an internal
    error yields ``incomplete`` with ``node_outcome_collection_failed``.
    """
    observed: dict[int, int] = {}
    reasons: set[str] = set()
    expected_nodes = nnodes if _is_int(nnodes) and nnodes >= 1 else 0
    try:
        if expected_nodes < 1:
            raise ValueError(f"nnodes must be a positive integer, got {nnodes!r}")
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        pending = set(range(expected_nodes))
        while True:
            for rank in sorted(pending):
                expected = {
                    "run_name": run_name,
                    "node_rank": rank,
                    "nnodes": nnodes,
                    "nproc_per_node": nproc_per_node,
                    "contract_digest": contract_digest,
                }
                status, payload = read_outcome(outcome_path(run_dir, rank), expected=expected)
                if status == "missing":
                    continue
                pending.discard(rank)
                if status == "ok" and payload is not None:
                    exit_code = payload["training"]["exit_code"]
                    observed[rank] = exit_code
                    if exit_code != 0:
                        reasons.add(REASON_FAILED)
                else:
                    reasons.add(_STATUS_TO_REASON[status])
            remaining = deadline - time.monotonic()
            if not pending or remaining <= 0:
                break
            time.sleep(min(max(0.001, float(poll_s)), remaining))
        if pending:
            reasons.add(REASON_MISSING)
    except Exception:  # noqa: BLE001 - collection must never replace the training result
        reasons.add(REASON_COLLECTION_FAILED)
    return _training_block(expected_nodes, observed, reasons)


def launcher_completion(training_block: Any) -> dict | None:
    """Project ``guard.training`` onto the summary's ``run_context.execution.launcher_completion``.

    Returns ``{"status", "nodes_observed", "reason_codes"}`` (reason codes
    sorted), or ``None`` when the block is malformed: a summary then omits
    ``launcher_completion`` rather than invent a result.
    """
    if not isinstance(training_block, Mapping):
        return None
    status = training_block.get("status")
    observed = training_block.get("nodes_observed")
    reasons = training_block.get("reasons")
    if (
        status not in ("completed", "incomplete")
        or not _is_int(observed)
        or observed < 0
        or not isinstance(reasons, list)
        or not all(isinstance(reason, str) and reason in REASON_CODES for reason in reasons)
    ):
        return None
    return {"status": status, "nodes_observed": observed, "reason_codes": sorted(set(reasons))}


__all__ = [
    "MAX_OUTCOME_BYTES",
    "OUTCOME_FILENAME",
    "OUTCOME_SCHEMA_VERSION",
    "REASON_CODES",
    "build_outcome",
    "collect_outcomes",
    "launcher_completion",
    "outcome_path",
    "read_outcome",
    "validate_outcome",
    "write_outcome",
]
