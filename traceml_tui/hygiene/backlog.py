"""The validation backlog under ``<run_dir>/validation/`` (docs/hygiene.md).

Any number of drainers on any node coordinate through small JSON files, one per
checkpoint:

* ``requests/<ckpt>.json``   ``{checkpoint, step, path, config_digest, created}``
* ``claims/<ckpt>.json``     ``{checkpoint, owner: {host, pid, start_time}, claimed, heartbeat, lease_s, worker: {pgid, start_time}}``
* ``receipts/<ckpt>.json``   ``{checkpoint, step, config_digest, metrics, completed}``
* ``failures/<ckpt>-<n>.json`` ``{checkpoint, attempt, error, failed}``

Times are unix seconds. A claim is published by hard-linking a fully written
temp file into place, so it is created exclusively and never seen half
written. A claim is broken only after its owner is confirmed gone, under a
per-checkpoint ``flock`` so two recoverers cannot both remove a fresh claim.

Paths come from :class:`traceml_tui.core.rundir.RunDir`; the state of a
request (and its words) from :func:`traceml_tui.core.state.decide_backlog`;
whether a claim's owner lives from :func:`traceml_tui.core.owner.probe_owner`.
"""

from __future__ import annotations

import fcntl
import math
import os
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from traceml_tui.core import artifacts, hygiene_files, state
from traceml_tui.core import owner as core_owner
from traceml_tui.core.atomic import atomic_write_json, dumps_json, fsync_dir
from traceml_tui.core.jsonsafe import decode_bounded, loads_bounded
from traceml_tui.core.rundir import BACKLOG_KINDS, EARLY_STOPPING, VALIDATION, RunDir
from traceml_tui.core.state import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BACKOFF_S,
    DEFAULT_WORKER_TIMEOUT_S,
    BacklogState,
)


def ensure_dirs(run_dir: Path) -> None:
    layout = RunDir(run_dir)
    for folder in BACKLOG_KINDS:
        layout.backlog_dir(folder).mkdir(parents=True, exist_ok=True)


def read_json(path: Path) -> Optional[dict]:
    """Any JSON object file, untyped; ``None`` when missing or unreadable (backlog files: :func:`read_backlog_file`)."""
    try:
        with open(path, "rb") as handle:
            value = loads_bounded(handle.read())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError):  # includes JSON nested deeper than jsonsafe.MAX_DEPTH
        return None
    return value if isinstance(value, dict) else None


def read_backlog_file(path: Path, folder: str, errors: Optional[list[str]] = None) -> Optional[dict]:
    """One backlog file of ``folder`` decoded by :mod:`traceml_tui.core.hygiene_files` (bounds checked).

    ``None`` when it is missing or damaged; a damaged one (not JSON, a value out of
    bounds, a checkpoint other than its file's name) adds one line to ``errors``
    — ``validation/<folder>/<name>: <what is wrong>`` — so a report shows it
    beside the files that are fine.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        _damaged(errors, folder, path, f"cannot read: {exc.strerror or exc}")
        return None
    try:
        return hygiene_files.as_dict(hygiene_files.decode_named(folder, path.name, data))
    except hygiene_files.DamagedFile as exc:
        _damaged(errors, folder, path, str(exc))
        return None


def _damaged(errors: Optional[list[str]], folder: str, path: Path, why: str) -> None:
    if errors is not None:
        errors.append(f"{VALIDATION}/{folder}/{path.name}: {why}")


def read_early_stopping(path: Path, errors: Optional[list[str]] = None) -> Optional[dict]:
    """``early_stopping.json`` (:mod:`traceml_tui.hygiene.early_stopping`) as written, once
    :func:`traceml_tui.core.hygiene_files.decode_early_stopping` accepted it (finite numbers, bounded
    integers, expected shapes): the one reader of that file, for early stopping, the summary, the curve
    and the export (here, not in ``early_stopping``, which imports torch when it broadcasts).

    None when it is missing or damaged; a damaged one adds one line to ``errors``.
    """
    try:
        data = Path(path).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if errors is not None:
            errors.append(f"{EARLY_STOPPING}: cannot read: {exc.strerror or exc}")
        return None
    try:
        hygiene_files.decode_early_stopping(data)
    except hygiene_files.DamagedFile as exc:
        if errors is not None:
            errors.append(f"{EARLY_STOPPING}: {exc}")
        return None
    # Checked above: the same bytes as plain values, exactly as written (what the summary shows).
    return decode_bounded(data)


def order_key(request: dict) -> tuple:
    """Checkpoint order: step, then publication time, then id (re-published steps after a resume)."""
    step = request.get("step")
    created = request.get("created")
    return (
        step if isinstance(step, int) else -1,
        created if isinstance(created, (int, float)) else 0.0,
        str(request.get("checkpoint", "")),
    )


def list_requests(run_dir: Path, errors: Optional[list[str]] = None) -> list[dict]:
    """All readable requests, in checkpoint order (damaged ones reported in ``errors``)."""
    requests = []
    for path in RunDir(run_dir).backlog_files("requests"):
        request = read_backlog_file(path, "requests", errors)
        if request is not None:
            requests.append(request)
    requests.sort(key=order_key)
    return requests


def read_receipt(run_dir: Path, checkpoint: str) -> Optional[dict]:
    return read_backlog_file(RunDir(run_dir).receipt(checkpoint), "receipts")


def list_receipts(run_dir: Path, errors: Optional[list[str]] = None) -> dict[str, dict]:
    receipts = {}
    for path in RunDir(run_dir).backlog_files("receipts"):
        receipt = read_backlog_file(path, "receipts", errors)
        if receipt is not None:
            receipts[path.stem] = receipt
    return receipts


def _failure_record(path: Path, errors: Optional[list[str]] = None) -> Optional[dict]:
    """One failure file; a damaged one still counts as the failed attempt its name says (never as none)."""
    checkpoint = hygiene_files.checkpoint_of("failures", path.name)
    record = read_backlog_file(path, "failures", errors)
    if record is None and checkpoint is not None:
        record = {"checkpoint": checkpoint, "attempt": None, "error": "the failure record is damaged", "failed": None}
    return record


def _attempt_key(record: dict) -> int:
    return record["attempt"] if isinstance(record.get("attempt"), int) else 0


def list_failures(run_dir: Path, errors: Optional[list[str]] = None) -> dict[str, list[dict]]:
    """Failure records grouped by checkpoint, oldest attempt first."""
    grouped: dict[str, list[dict]] = {}
    for path in RunDir(run_dir).backlog_files("failures"):
        record = _failure_record(path, errors)
        if record is not None:
            grouped.setdefault(record["checkpoint"], []).append(record)
    for records in grouped.values():
        records.sort(key=_attempt_key)
    return grouped


def failures_of(run_dir: Path, checkpoint: str) -> list[dict]:
    """The failure records of one checkpoint, oldest attempt first."""
    prefix = f"{checkpoint}-"
    records = []
    for path in RunDir(run_dir).backlog_files("failures"):
        if path.stem.startswith(prefix) and path.stem[len(prefix):].isdigit():
            record = _failure_record(path)
            records.append(record if record is not None else {"checkpoint": checkpoint})
    records.sort(key=_attempt_key)
    return records


def last_failed(records: list[dict]) -> Optional[float]:
    """When the newest of these failure records was written (None when none says)."""
    times = [r["failed"] for r in records if isinstance(r.get("failed"), (int, float)) and not isinstance(r.get("failed"), bool)]
    return max(times) if times else None


def failure_count(run_dir: Path, checkpoint: str) -> int:
    prefix = f"{checkpoint}-"
    count = 0
    for path in RunDir(run_dir).backlog_files("failures"):
        if path.stem.startswith(prefix) and path.stem[len(prefix):].isdigit():
            count += 1
    return count


def read_claim(run_dir: Path, checkpoint: str, errors: Optional[list[str]] = None) -> Optional[dict]:
    return read_backlog_file(RunDir(run_dir).claim(checkpoint), "claims", errors)


# --------------------------------------------------------------------------- owners

#: Identity of this process as a claim owner: host, pid and process start time.
current_owner = core_owner.current_owner


def _seconds(value: Any) -> Optional[float]:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond a double: no time at all
        return None
    return number if math.isfinite(number) else None


def claim_is_stale(claim: dict, *, now: Optional[float] = None) -> bool:
    """Whether a claim was abandoned (:func:`traceml_tui.core.state.claim_is_stale`).

    Same host: stale iff its owner process is gone (or the pid was reused).
    Another host cannot be inspected: stale once its heartbeat is older than its lease.
    """
    return state.claim_is_stale(
        heartbeat=_seconds(claim.get("heartbeat")),
        lease_s=_seconds(claim.get("lease_s")),
        now=time.time() if now is None else now,
        owner_alive=core_owner.probe_owner(claim.get("owner")),
    )


def owner_alive(owner: Any, claim: dict, *, now: Optional[float] = None) -> bool:
    """Whether a claim's owner may still be working on it (the negation of :func:`claim_is_stale`)."""
    return not claim_is_stale({**claim, "owner": owner}, now=now)


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
    path = RunDir(run_dir).claim(checkpoint)
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


def hold_lock(lock_path: Path) -> int:
    """Take the flock of ``lock_path`` (created if missing); returns the locked fd.

    The holder removes the lock file before releasing it, so a waiter that
    wins the lock re-checks that its fd is still the file at ``lock_path``
    and otherwise locks the new one: no lock file is left behind, and two
    processes never hold "the" lock on two different files.
    """
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held, named = os.fstat(fd), os.stat(lock_path)
            if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
                return fd
        except FileNotFoundError:
            pass  # removed by the holder before us: lock the next one
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def release_lock(lock_path: Path, fd: int) -> None:
    """Remove the lock file while still holding it, then release it."""
    try:
        os.unlink(lock_path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def clean_locks(run_dir: Path) -> int:
    """Remove lock files of claim recovery (``claims/.<checkpoint>.break``) nobody holds; returns how many.

    They are left behind by a recoverer killed while holding one (or by
    older versions, which never removed them).
    """
    layout = RunDir(run_dir)
    prefix, suffix = layout.claim_lock("\0").name.split("\0")  # the name RunDir gives them
    removed = 0
    try:
        names = [entry.name for entry in os.scandir(layout.backlog_dir("claims"))]
    except OSError:
        return 0
    for name in names:
        if not (name.startswith(prefix) and name.endswith(suffix)) or len(name) <= len(prefix) + len(suffix):
            continue
        lock_path = layout.claim_lock(name[len(prefix): -len(suffix)])
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held, named = os.fstat(fd), os.lstat(lock_path)
            if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
                os.unlink(lock_path)
                removed += 1
        except OSError:
            pass  # held right now (or gone): its holder removes it
        finally:
            os.close(fd)
    return removed


# --------------------------------------------------------------------------- workers


def worker_identity(pid: int) -> dict:
    """A validation worker as its claim records it: its process group (it leads one) and start time."""
    import psutil

    try:
        started: Optional[float] = psutil.Process(pid).create_time()
    except psutil.Error:
        started = None
    return {"pgid": pid, "start_time": started}


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still runs (zombies do not count)."""
    import psutil

    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def stop_worker(claim: dict, *, timeout: float = 10.0) -> bool:
    """Make sure the validation worker of an abandoned claim is gone; True when nothing of it runs.

    The claim records the worker's process group (``worker.pgid``). On this
    host the whole group gets SIGKILL, unless the group's leader pid now
    belongs to a younger process (the pid was reused: not ours to kill).
    A claim of another host, or one without a worker, has nothing to stop here.
    """
    import psutil

    worker = claim.get("worker")
    owner = claim.get("owner")
    if not isinstance(worker, dict) or not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
        return True
    pgid, started = worker.get("pgid"), worker.get("start_time")
    if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid <= 1 or pgid == os.getpgrp():
        return True
    try:
        leader = psutil.Process(pgid)
        if (isinstance(started, (int, float)) and leader.status() != psutil.STATUS_ZOMBIE
                and abs(leader.create_time() - float(started)) > core_owner.START_TIME_SLACK_S):
            return True  # a reused pid leads that group now
    except psutil.Error:
        pass  # the leader is gone; what is left of its group is still the worker's
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    deadline = time.monotonic() + timeout
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _break_stale_claim(run_dir: Path, checkpoint: str) -> bool:
    """Remove a claim whose owner is gone; serialized by a per-checkpoint flock.

    The flock is released by the kernel if this process dies, so a crashed
    recoverer never wedges recovery. Under the lock the claim is re-read: if
    it changed (another recoverer replaced it) it is left alone. Before the
    claim is removed, its worker is stopped (:func:`stop_worker`), so a
    checkpoint is never validated by two workers at once.
    """
    layout = RunDir(run_dir)
    path = layout.claim(checkpoint)
    lock_path = layout.claim_lock(checkpoint)
    fd = hold_lock(lock_path)
    try:
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return True  # already gone: the caller may claim
        try:
            existing: Optional[dict] = hygiene_files.as_dict(hygiene_files.decode_backlog("claims", raw))
        except hygiene_files.DamagedFile:
            existing = None
        # A torn or foreign file cannot be a live claim: claims are never written in place.
        if isinstance(existing, dict) and not claim_is_stale(existing):
            return False
        if isinstance(existing, dict) and not stop_worker(existing):
            return False  # its worker still runs and cannot be stopped from here: leave the claim
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
        release_lock(lock_path, fd)


def heartbeat(run_dir: Path, claim: dict) -> bool:
    """Refresh a claim we hold (atomic replace); ``False`` if it is no longer ours."""
    current = read_claim(run_dir, claim["checkpoint"])
    if current is None or current.get("owner") != claim.get("owner") or current.get("claimed") != claim.get("claimed"):
        return False
    claim["heartbeat"] = time.time()
    atomic_write_json(RunDir(run_dir).claim(claim["checkpoint"]), claim)
    return True


def release_claim(run_dir: Path, claim: dict) -> None:
    """Remove our claim (after its receipt or failure is durable)."""
    current = read_claim(run_dir, claim["checkpoint"])
    if current is not None and current.get("owner") == claim.get("owner") and current.get("claimed") == claim.get("claimed"):
        try:
            os.unlink(RunDir(run_dir).claim(claim["checkpoint"]))
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- results


def write_receipt(run_dir: Path, request: dict, metrics: dict, *, override: Optional[dict] = None) -> dict:
    """Record a completed validation, bound to its checkpoint and config digest (never overwritten).

    ``override`` (``{config_digest}``: what actually ran) marks a result produced
    by another validation config than the request's, on the drainer's ``--recipe-override``.
    """
    receipt = {
        "checkpoint": request["checkpoint"],
        "step": request.get("step"),
        "config_digest": request.get("config_digest"),
        "metrics": metrics,
        "completed": time.time(),
    }
    if override is not None:
        receipt["override"] = override
    atomic_write_json(RunDir(run_dir).receipt(request["checkpoint"]), receipt, exclusive=True)
    return receipt


def write_failure(run_dir: Path, checkpoint: str, error: str) -> dict:
    """Record one failed attempt as ``failures/<ckpt>-<n>.json`` (n = next free attempt number)."""
    layout = RunDir(run_dir)
    layout.backlog_dir("failures").mkdir(parents=True, exist_ok=True)
    attempt = failure_count(run_dir, checkpoint) + 1
    while True:
        record = {"checkpoint": checkpoint, "attempt": attempt, "error": error[:500], "failed": time.time()}
        try:
            atomic_write_json(layout.failure(checkpoint, attempt), record, exclusive=True)
            return record
        except FileExistsError:
            attempt += 1


# --------------------------------------------------------------------------- status


def retry_wait(run_dir: Path, checkpoint: str, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
               backoff_s: float = DEFAULT_RETRY_BACKOFF_S, now: Optional[float] = None) -> Optional[float]:
    """Whether a drainer may take this request (claims aside), and when.

    ``None``: never (it has a receipt or is blocked); ``0.0``: now; otherwise
    the seconds until its retry backoff (:func:`traceml_tui.core.state.retry_ready_at`) has passed.
    """
    records = failures_of(run_dir, checkpoint)
    word = state.decide_backlog(
        has_receipt=RunDir(run_dir).receipt(checkpoint).exists(), has_claim=False, claim_stale=False,
        failures=len(records), max_attempts=max_attempts,
    )
    if word in (BacklogState.COMPLETED, BacklogState.BLOCKED):
        return None
    ready = state.retry_ready_at(failures=len(records), last_failed=last_failed(records), backoff_s=backoff_s)
    now = time.time() if now is None else now
    return 0.0 if ready is None or ready <= now else ready - now


def claimable(run_dir: Path, checkpoint: str, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
              backoff_s: float = DEFAULT_RETRY_BACKOFF_S, now: Optional[float] = None) -> bool:
    """Whether a drainer may take this request now: no receipt, not blocked, not backing off (claims aside)."""
    return retry_wait(run_dir, checkpoint, max_attempts=max_attempts, backoff_s=backoff_s, now=now) == 0.0


def declared_validation(run_dir: Path) -> dict[str, float]:
    """The run's validation settings as its manifest declares them, defaults filled in (docs/hygiene.md).

    The one place that answers "the run's max_attempts" (and lease, retry
    backoff, worker timeout) for drainers, ``validate status``, the summary,
    early stopping and watch's source: ``max_attempts``, ``lease_s``,
    ``retry_backoff_s``, ``timeout_s``. A run without a manifest (the SDK
    without ``traceml run``) gets the defaults of :mod:`traceml_tui.core.state`.
    """
    try:
        manifest = artifacts.decode_manifest(RunDir(run_dir).manifest.read_bytes())
    except OSError:
        manifest = None
    block = manifest.hygiene_block.get("validation") if manifest is not None else None
    block = block if isinstance(block, dict) else {}

    def number(key: str, default: float, *, zero_ok: bool = False) -> float:
        # Within the bounds traceml.yaml allows (hygiene/config.py), so a lease written into a claim is one the
        # claim's decoder accepts; anything else (an edited manifest) falls back on the default.
        value = _seconds(block.get(key))
        ok = value is not None and (value > 0 or (zero_ok and value == 0)) and value <= hygiene_files.MAX_SECONDS
        return value if ok else default

    attempts = manifest.max_validation_attempts if manifest is not None else None
    return {
        "max_attempts": attempts if attempts is not None else DEFAULT_MAX_ATTEMPTS,
        "lease_s": number("lease_s", DEFAULT_LEASE_S),
        "retry_backoff_s": number("retry_backoff_s", DEFAULT_RETRY_BACKOFF_S, zero_ok=True),
        "timeout_s": number("timeout_s", DEFAULT_WORKER_TIMEOUT_S),
    }


def declared_max_attempts(run_dir: Path) -> int:
    """``hygiene.validation.max_attempts`` from the run's manifest, else :data:`DEFAULT_MAX_ATTEMPTS`."""
    return int(declared_validation(run_dir)["max_attempts"])


def backlog_status(run_dir: Path, *, max_attempts: Optional[int] = None, now: Optional[float] = None) -> dict:
    """The state of every request, in the :class:`~traceml_tui.core.state.BacklogState` words.

    ``pending``, ``claimed``, ``stale-claim``, ``failed`` (a retry is left),
    ``blocked`` (every allowed attempt failed) or ``completed``, decided by
    :func:`traceml_tui.core.state.decide_backlog`.

    Returns ``{requests: [...], newest_completed, latest_requested, counts, outstanding, errors}``;
    ``errors`` holds one line per damaged backlog file (:func:`read_backlog_file`), which is left out of the rest;
    ``counts`` follows :data:`~traceml_tui.core.state.BACKLOG_ORDER`; ``outstanding``
    lists every request that has no receipt (a pending or failed request is never a result).
    ``max_attempts`` defaults to the run's declared value (:func:`declared_max_attempts`).
    """
    now = time.time() if now is None else now
    declared = declared_validation(run_dir)
    if max_attempts is None:
        max_attempts = int(declared["max_attempts"])
    errors: list[str] = []  # one line per damaged backlog file; every other file is still reported
    requests = list_requests(run_dir, errors)
    receipts = list_receipts(run_dir, errors)
    failures = list_failures(run_dir, errors)
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
        claim = read_claim(run_dir, ckpt, errors) if receipt is None else None
        word = state.decide_backlog(
            has_receipt=receipt is not None,
            has_claim=claim is not None,
            claim_stale=claim is not None and claim_is_stale(claim, now=now),
            failures=len(fails),
            max_attempts=max_attempts,
        )
        row["state"] = word.value
        # A failed request with a retry left waits out its backoff (core/state.py retry_ready_at).
        ready = state.retry_ready_at(failures=len(fails), last_failed=last_failed(fails),
                                     backoff_s=declared["retry_backoff_s"]) if word is BacklogState.FAILED else None
        row["retry_at"] = ready if ready is not None and ready > now else None
        if receipt is not None:
            row["metrics"] = receipt.get("metrics", {})
            row["completed"] = receipt.get("completed")
            newest = row
        rows.append(row)
    counts = state.count_states((row["state"] for row in rows), state.BACKLOG_ORDER)
    outstanding = [row for row in rows if row["state"] != BacklogState.COMPLETED]
    latest = rows[-1] if rows else None
    return {
        "requests": rows,
        "newest_completed": None if newest is None else {
            "checkpoint": newest["checkpoint"], "step": newest["step"], "metrics": newest.get("metrics", {})},
        "latest_requested": None if latest is None else {"checkpoint": latest["checkpoint"], "step": latest["step"]},
        "counts": counts,
        "outstanding": [{"checkpoint": r["checkpoint"], "step": r["step"], "state": r["state"],
                         "failures": r["failures"], "last_error": r["last_error"], "retry_at": r["retry_at"]}
                        for r in outstanding],
        "errors": errors,
    }
