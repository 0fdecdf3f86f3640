"""The validation backlog under ``<run_dir>/validation/`` (DESIGN.md, seed 004).

Any number of drainers on any node coordinate through small JSON files, one per
checkpoint:

* ``requests/<ckpt>.json``   ``{checkpoint, step, path, config_digest, created}``
* ``claims/<ckpt>.json``     ``{checkpoint, owner: {host, pid, start_time}, claimed, heartbeat, lease_s}``
* ``receipts/<ckpt>.json``   ``{checkpoint, step, config_digest, metrics, completed}``
* ``failures/<ckpt>-<n>.json`` ``{checkpoint, attempt, error, failed}``

Times are unix seconds. A claim is published by hard-linking a fully written
temp file into place, so it is created exclusively and never seen half
written. A claim is broken only after its owner is confirmed gone, under a
per-checkpoint ``flock`` so two recoverers cannot both remove a fresh claim.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from traceml_tui.core.atomic import atomic_write_json, dumps_json, fsync_dir

KINDS = ("requests", "claims", "receipts", "failures")
#: Tolerance when comparing process start times (psutil rounds them).
_START_TIME_SLACK_S = 1.0


def validation_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "validation"


def kind_dir(run_dir: Path, kind: str) -> Path:
    return validation_dir(run_dir) / kind


def request_path(run_dir: Path, checkpoint: str) -> Path:
    return kind_dir(run_dir, "requests") / f"{checkpoint}.json"


def claim_path(run_dir: Path, checkpoint: str) -> Path:
    return kind_dir(run_dir, "claims") / f"{checkpoint}.json"


def receipt_path(run_dir: Path, checkpoint: str) -> Path:
    return kind_dir(run_dir, "receipts") / f"{checkpoint}.json"


def ensure_dirs(run_dir: Path) -> None:
    for kind in KINDS:
        kind_dir(run_dir, kind).mkdir(parents=True, exist_ok=True)


def read_json(path: Path) -> Optional[dict]:
    """Read one side file; ``None`` when missing or unreadable (never half written)."""
    try:
        with open(path, "rb") as handle:
            value = json.loads(handle.read())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _json_files(folder: Path) -> Iterator[Path]:
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.endswith(".json") and not entry.name.startswith(".") and entry.is_file(follow_symlinks=False):
            yield Path(entry.path)


def order_key(request: dict) -> tuple:
    """Checkpoint order: step, then publication time, then id (re-published steps after a resume)."""
    step = request.get("step")
    created = request.get("created")
    return (
        step if isinstance(step, int) else -1,
        created if isinstance(created, (int, float)) else 0.0,
        str(request.get("checkpoint", "")),
    )


def list_requests(run_dir: Path) -> list[dict]:
    """All readable requests, in checkpoint order."""
    requests = []
    for path in _json_files(kind_dir(run_dir, "requests")):
        request = read_json(path)
        if request is not None and request.get("checkpoint") == path.stem:
            requests.append(request)
    requests.sort(key=order_key)
    return requests


def read_receipt(run_dir: Path, checkpoint: str) -> Optional[dict]:
    receipt = read_json(receipt_path(run_dir, checkpoint))
    if receipt is None or receipt.get("checkpoint") != checkpoint:
        return None
    return receipt


def list_receipts(run_dir: Path) -> dict[str, dict]:
    receipts = {}
    for path in _json_files(kind_dir(run_dir, "receipts")):
        receipt = read_json(path)
        if receipt is not None and receipt.get("checkpoint") == path.stem:
            receipts[path.stem] = receipt
    return receipts


def list_failures(run_dir: Path) -> dict[str, list[dict]]:
    """Failure records grouped by checkpoint, oldest attempt first."""
    grouped: dict[str, list[dict]] = {}
    for path in _json_files(kind_dir(run_dir, "failures")):
        record = read_json(path)
        if record is None or not isinstance(record.get("checkpoint"), str):
            continue
        grouped.setdefault(record["checkpoint"], []).append(record)
    for records in grouped.values():
        records.sort(key=lambda r: r.get("attempt") if isinstance(r.get("attempt"), int) else 0)
    return grouped


def failure_count(run_dir: Path, checkpoint: str) -> int:
    prefix = f"{checkpoint}-"
    count = 0
    for path in _json_files(kind_dir(run_dir, "failures")):
        if path.stem.startswith(prefix) and path.stem[len(prefix):].isdigit():
            count += 1
    return count


def read_claim(run_dir: Path, checkpoint: str) -> Optional[dict]:
    return read_json(claim_path(run_dir, checkpoint))


# --------------------------------------------------------------------------- owners


def current_owner() -> dict:
    """Identity of this process as a claim owner: host, pid and process start time."""
    import psutil

    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start_time": psutil.Process(pid).create_time()}


def owner_alive(owner: Any, claim: dict, *, now: Optional[float] = None) -> bool:
    """Whether a claim's owner may still be working on it.

    Same host: alive iff the pid exists, is not a zombie and started at the
    recorded time (a reused pid is a different process). Another host cannot be
    inspected, so its owner counts as alive while its heartbeat is younger
    than the lease.
    """
    import psutil

    if not isinstance(owner, dict):
        return False
    now = time.time() if now is None else now
    if owner.get("host") == socket.gethostname():
        pid = owner.get("pid")
        if not isinstance(pid, int) or pid <= 0:
            return False
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
            started = process.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
        recorded = owner.get("start_time")
        if not isinstance(recorded, (int, float)):
            return True  # cannot tell a reused pid apart: assume alive rather than steal
        return abs(started - float(recorded)) <= _START_TIME_SLACK_S
    heartbeat = claim.get("heartbeat")
    lease = claim.get("lease_s")
    if not isinstance(heartbeat, (int, float)) or not isinstance(lease, (int, float)):
        return False
    return now - float(heartbeat) <= float(lease)


def claim_is_stale(claim: dict, *, now: Optional[float] = None) -> bool:
    return not owner_alive(claim.get("owner"), claim, now=now)


# --------------------------------------------------------------------------- claims


def _link_exclusive(path: Path, payload: dict) -> bool:
    """Publish ``payload`` at ``path`` only if nothing is there (temp file + ``os.link``)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(dumps_json(payload))
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        fsync_dir(path.parent)
        return True
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def make_claim(checkpoint: str, owner: dict, lease_s: float, *, now: Optional[float] = None) -> dict:
    now = time.time() if now is None else now
    return {"checkpoint": checkpoint, "owner": owner, "claimed": now, "heartbeat": now, "lease_s": float(lease_s)}


def try_claim(run_dir: Path, checkpoint: str, owner: dict, lease_s: float) -> Optional[dict]:
    """Claim ``checkpoint`` for ``owner``; returns the claim, or ``None`` if someone holds it.

    A claim whose owner is confirmed gone is recovered (removed, then claimed
    afresh with the same exclusive link, so a concurrent plain claimer wins
    cleanly instead of being overwritten).
    """
    path = claim_path(run_dir, checkpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    claim = make_claim(checkpoint, owner, lease_s)
    if _link_exclusive(path, claim):
        return claim
    existing = read_claim(run_dir, checkpoint)
    if existing is not None and not claim_is_stale(existing):
        return None
    if not _break_stale_claim(run_dir, checkpoint):
        return None
    claim = make_claim(checkpoint, owner, lease_s)
    return claim if _link_exclusive(path, claim) else None


def _break_stale_claim(run_dir: Path, checkpoint: str) -> bool:
    """Remove a claim whose owner is gone; serialized by a per-checkpoint flock.

    The flock is released by the kernel if this process dies, so a crashed
    recoverer never wedges recovery. Under the lock the claim is re-read: if
    it changed (another recoverer replaced it) it is left alone.
    """
    path = claim_path(run_dir, checkpoint)
    lock_path = path.parent / f".{checkpoint}.break"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return True  # already gone: the caller may claim
        try:
            existing = json.loads(raw)
        except ValueError:
            existing = None
        # A torn or foreign file cannot be a live claim: claims are never written in place.
        if isinstance(existing, dict) and not claim_is_stale(existing):
            return False
        try:
            with open(path, "rb") as handle:
                if handle.read() != raw:
                    return False
        except FileNotFoundError:
            return True
        os.unlink(path)
        fsync_dir(path.parent)
        return True
    finally:
        os.close(fd)


def heartbeat(run_dir: Path, claim: dict) -> bool:
    """Refresh a claim we hold (atomic replace); ``False`` if it is no longer ours."""
    current = read_claim(run_dir, claim["checkpoint"])
    if current is None or current.get("owner") != claim.get("owner") or current.get("claimed") != claim.get("claimed"):
        return False
    claim["heartbeat"] = time.time()
    atomic_write_json(claim_path(run_dir, claim["checkpoint"]), claim)
    return True


def release_claim(run_dir: Path, claim: dict) -> None:
    """Remove our claim (after its receipt or failure is durable)."""
    current = read_claim(run_dir, claim["checkpoint"])
    if current is not None and current.get("owner") == claim.get("owner") and current.get("claimed") == claim.get("claimed"):
        try:
            os.unlink(claim_path(run_dir, claim["checkpoint"]))
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- results


def write_receipt(run_dir: Path, request: dict, metrics: dict) -> dict:
    """Record a completed validation, bound to its checkpoint and config digest (never overwritten)."""
    receipt = {
        "checkpoint": request["checkpoint"],
        "step": request.get("step"),
        "config_digest": request.get("config_digest"),
        "metrics": metrics,
        "completed": time.time(),
    }
    atomic_write_json(receipt_path(run_dir, request["checkpoint"]), receipt, exclusive=True)
    return receipt


def write_failure(run_dir: Path, checkpoint: str, error: str) -> dict:
    """Record one failed attempt as ``failures/<ckpt>-<n>.json`` (n = next free attempt number)."""
    folder = kind_dir(run_dir, "failures")
    folder.mkdir(parents=True, exist_ok=True)
    attempt = failure_count(run_dir, checkpoint) + 1
    while True:
        record = {"checkpoint": checkpoint, "attempt": attempt, "error": error[:500], "failed": time.time()}
        try:
            atomic_write_json(folder / f"{checkpoint}-{attempt}.json", record, exclusive=True)
            return record
        except FileExistsError:
            attempt += 1


# --------------------------------------------------------------------------- status


def backlog_status(run_dir: Path, *, max_attempts: int = 3, now: Optional[float] = None) -> dict:
    """Derive the state of every request: completed, running, stale claim, failed/blocked or pending.

    Returns ``{requests: [...], newest_completed, latest_requested, counts, outstanding}``;
    ``outstanding`` lists every request that has no receipt (a pending or
    failed request is never a result).
    """
    now = time.time() if now is None else now
    requests = list_requests(run_dir)
    receipts = list_receipts(run_dir)
    failures = list_failures(run_dir)
    rows = []
    newest = None
    for request in requests:
        ckpt = request["checkpoint"]
        fails = failures.get(ckpt, [])
        row = {
            "checkpoint": ckpt,
            "step": request.get("step"),
            "created": request.get("created"),
            "failures": len(fails),
            "last_error": fails[-1].get("error") if fails else None,
        }
        receipt = receipts.get(ckpt)
        if receipt is not None:
            row["state"] = "completed"
            row["metrics"] = receipt.get("metrics", {})
            row["completed"] = receipt.get("completed")
            newest = row
        else:
            claim = read_claim(run_dir, ckpt)
            if claim is not None:
                row["state"] = "stale_claim" if claim_is_stale(claim, now=now) else "running"
            elif len(fails) >= max_attempts:
                row["state"] = "blocked"
            elif fails:
                row["state"] = "failed"
            else:
                row["state"] = "pending"
        rows.append(row)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    outstanding = [row for row in rows if row["state"] != "completed"]
    latest = rows[-1] if rows else None
    return {
        "requests": rows,
        "newest_completed": None if newest is None else {
            "checkpoint": newest["checkpoint"], "step": newest["step"], "metrics": newest.get("metrics", {})},
        "latest_requested": None if latest is None else {"checkpoint": latest["checkpoint"], "step": latest["step"]},
        "counts": counts,
        "outstanding": [{"checkpoint": r["checkpoint"], "step": r["step"], "state": r["state"],
                         "failures": r["failures"], "last_error": r["last_error"]} for r in outstanding],
    }
