"""The validation backlog under ``<run_dir>/validation/`` (docs/hygiene.md) — and, with ``kind="qc"``, the heavy
QC backlog under ``<run_dir>/qc/`` (docs/qc.md): one implementation, two kinds.

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
from dataclasses import replace
from pathlib import Path
from typing import Any, Collection, Iterator, Optional

from traceml_tui.core import artifacts, hygiene_files, state
from traceml_tui.core import backlog as core_backlog
from traceml_tui.core import owner as core_owner
from traceml_tui.core.atomic import atomic_write_json, dumps_json, fsync_dir
from traceml_tui.core.jsonsafe import decode_bounded, loads_bounded
from traceml_tui.core.rundir import BACKLOG_KINDS, BACKLOG_ROOTS, EARLY_STOPPING, VALIDATION, RunDir
from traceml_tui.core.state import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BACKOFF_S,
    BacklogState,
)


def ensure_dirs(run_dir: Path, kind: str = VALIDATION) -> None:
    layout = RunDir(run_dir)
    for folder in BACKLOG_KINDS:
        layout.backlog_dir(folder, kind).mkdir(parents=True, exist_ok=True)


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


def read_backlog_file(path: Path, folder: str, errors: Optional[list[str]] = None,
                      kind: str = VALIDATION) -> Optional[dict]:
    """One backlog file of ``folder`` decoded by :mod:`traceml_tui.core.hygiene_files` (bounds checked).

    ``None`` when it is missing or damaged; a damaged one (not JSON, a value out of
    bounds, a checkpoint other than its file's name) adds one line to ``errors``
    — ``<kind root>/<folder>/<name>: <what is wrong>`` — so a report shows it
    beside the files that are fine.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        _damaged(errors, folder, path, f"cannot read: {exc.strerror or exc}", kind)
        return None
    try:
        return hygiene_files.as_dict(hygiene_files.decode_named(folder, path.name, data))
    except hygiene_files.DamagedFile as exc:
        _damaged(errors, folder, path, str(exc), kind)
        return None


def _damaged(errors: Optional[list[str]], folder: str, path: Path, why: str, kind: str = VALIDATION) -> None:
    if errors is not None:
        errors.append(f"{BACKLOG_ROOTS[kind]}/{folder}/{path.name}: {why}")


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


def list_requests(run_dir: Path, errors: Optional[list[str]] = None, kind: str = VALIDATION,
                  skip: Collection[str] = ()) -> list[dict]:
    """All readable requests, in checkpoint order (:func:`traceml_tui.core.backlog.request_order`; damaged ones
    reported in ``errors``), but those of the checkpoints in ``skip``, which are not read at all (a request's
    file is named after its checkpoint: ``core.hygiene_files.decode_named`` refuses any other)."""
    requests = []
    for path in RunDir(run_dir).backlog_files("requests", kind, skip=skip):
        request = read_backlog_file(path, "requests", errors, kind)
        if request is not None:
            requests.append(request)
    requests.sort(key=lambda r: core_backlog.request_order(hygiene_files.Request(**r)))
    return requests


def open_requests(run_dir: Path, kind: str = VALIDATION, skip: Collection[str] = ()) -> list[dict]:
    """The readable requests of ``kind`` without a receipt file (and not in ``skip``), in checkpoint order.

    What a drainer, the dispatcher and the launcher's blocked-request warning look at (every second while a run
    trains): a request whose receipt exists is completed (:func:`retry_wait` says None for it), so it is not
    even read. One listing of the receipts instead of reading every request and its receipt, failures and
    claim: at 1,000 checkpoints a look cost 68 ms (0.7 s on a loaded machine; tests/benchmarks/bench_backlog_looks.py).
    """
    done = {path.stem for path in RunDir(run_dir).backlog_files("receipts", kind)}
    return list_requests(run_dir, kind=kind, skip=done.union(skip) if skip else done)


def read_receipt(run_dir: Path, checkpoint: str, kind: str = VALIDATION) -> Optional[dict]:
    return read_backlog_file(RunDir(run_dir).receipt(checkpoint, kind), "receipts", kind=kind)


def list_receipts(run_dir: Path, errors: Optional[list[str]] = None, kind: str = VALIDATION) -> dict[str, dict]:
    receipts = {}
    for path in RunDir(run_dir).backlog_files("receipts", kind):
        receipt = read_backlog_file(path, "receipts", errors, kind)
        if receipt is not None:
            receipts[path.stem] = receipt
    return receipts


def _failure_record(path: Path, errors: Optional[list[str]] = None, kind: str = VALIDATION) -> Optional[dict]:
    """One failure file; a damaged one still counts as the failed attempt its name says (never as none)."""
    checkpoint = hygiene_files.checkpoint_of("failures", path.name)
    record = read_backlog_file(path, "failures", errors, kind)
    if record is None and checkpoint is not None:
        record = {"checkpoint": checkpoint, "attempt": None, "error": core_backlog.DAMAGED_FAILURE, "failed": None}
    return record


def _attempt_key(record: dict) -> int:
    return record["attempt"] if isinstance(record.get("attempt"), int) else 0


def list_failures(run_dir: Path, errors: Optional[list[str]] = None, kind: str = VALIDATION) -> dict[str, list[dict]]:
    """Failure records grouped by checkpoint, oldest attempt first."""
    grouped: dict[str, list[dict]] = {}
    for path in RunDir(run_dir).backlog_files("failures", kind):
        record = _failure_record(path, errors, kind)
        if record is not None:
            grouped.setdefault(record["checkpoint"], []).append(record)
    for records in grouped.values():
        records.sort(key=_attempt_key)
    return grouped


def failures_of(run_dir: Path, checkpoint: str, kind: str = VALIDATION) -> list[dict]:
    """The failure records of one checkpoint, oldest attempt first."""
    prefix = f"{checkpoint}-"
    records = []
    for path in RunDir(run_dir).backlog_files("failures", kind):
        if path.stem.startswith(prefix) and path.stem[len(prefix):].isdigit():
            record = _failure_record(path, kind=kind)
            records.append(record if record is not None else {"checkpoint": checkpoint})
    records.sort(key=_attempt_key)
    return records


def last_failed(records: list[dict]) -> Optional[float]:
    """When the newest of these failure records was written (None when none says)."""
    times = [r["failed"] for r in records if isinstance(r.get("failed"), (int, float)) and not isinstance(r.get("failed"), bool)]
    return max(times) if times else None


def failure_count(run_dir: Path, checkpoint: str, kind: str = VALIDATION) -> int:
    prefix = f"{checkpoint}-"
    count = 0
    for path in RunDir(run_dir).backlog_files("failures", kind):
        if path.stem.startswith(prefix) and path.stem[len(prefix):].isdigit():
            count += 1
    return count


def read_claim(run_dir: Path, checkpoint: str, errors: Optional[list[str]] = None,
               kind: str = VALIDATION) -> Optional[dict]:
    return read_backlog_file(RunDir(run_dir).claim(checkpoint, kind), "claims", errors, kind)


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


def try_claim(run_dir: Path, checkpoint: str, owner: dict, lease_s: float, kind: str = VALIDATION) -> Optional[dict]:
    """Claim ``checkpoint`` for ``owner``; returns the claim, or ``None`` if someone holds it.

    A claim whose owner is confirmed gone is recovered (removed, then claimed
    afresh with the same exclusive link, so a concurrent plain claimer wins
    cleanly instead of being overwritten).
    """
    path = RunDir(run_dir).claim(checkpoint, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    claim = make_claim(checkpoint, owner, lease_s)
    if _link_exclusive(path, claim):
        return claim
    existing = read_claim(run_dir, checkpoint, kind=kind)
    if existing is not None and not claim_is_stale(existing):
        return None
    if not _break_stale_claim(run_dir, checkpoint, kind):
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


def clean_locks(run_dir: Path, kind: str = VALIDATION) -> int:
    """Remove lock files of claim recovery (``claims/.<checkpoint>.break``) nobody holds; returns how many.

    They are left behind by a recoverer killed while holding one (or by
    older versions, which never removed them).
    """
    layout = RunDir(run_dir)
    prefix, suffix = layout.claim_lock("\0", kind).name.split("\0")  # the name RunDir gives them
    removed = 0
    try:
        names = [entry.name for entry in os.scandir(layout.backlog_dir("claims", kind))]
    except OSError:
        return 0
    for name in names:
        if not (name.startswith(prefix) and name.endswith(suffix)) or len(name) <= len(prefix) + len(suffix):
            continue
        lock_path = layout.claim_lock(name[len(prefix): -len(suffix)], kind)
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


def _break_stale_claim(run_dir: Path, checkpoint: str, kind: str = VALIDATION) -> bool:
    """Remove a claim whose owner is gone; serialized by a per-checkpoint flock.

    The flock is released by the kernel if this process dies, so a crashed
    recoverer never wedges recovery. Under the lock the claim is re-read: if
    it changed (another recoverer replaced it) it is left alone. Before the
    claim is removed, its worker is stopped (:func:`stop_worker`), so a
    checkpoint is never validated by two workers at once.
    """
    layout = RunDir(run_dir)
    path = layout.claim(checkpoint, kind)
    lock_path = layout.claim_lock(checkpoint, kind)
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


def heartbeat(run_dir: Path, claim: dict, kind: str = VALIDATION) -> bool:
    """Refresh a claim we hold (atomic replace); ``False`` if it is no longer ours."""
    current = read_claim(run_dir, claim["checkpoint"], kind=kind)
    if current is None or current.get("owner") != claim.get("owner") or current.get("claimed") != claim.get("claimed"):
        return False
    claim["heartbeat"] = time.time()
    atomic_write_json(RunDir(run_dir).claim(claim["checkpoint"], kind), claim)
    return True


def release_claim(run_dir: Path, claim: dict, kind: str = VALIDATION) -> None:
    """Remove our claim (after its receipt or failure is durable)."""
    current = read_claim(run_dir, claim["checkpoint"], kind=kind)
    if current is not None and current.get("owner") == claim.get("owner") and current.get("claimed") == claim.get("claimed"):
        try:
            os.unlink(RunDir(run_dir).claim(claim["checkpoint"], kind))
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- results


def write_receipt(run_dir: Path, request: dict, metrics: dict, *, override: Optional[dict] = None,
                  kind: str = VALIDATION) -> dict:
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
    atomic_write_json(RunDir(run_dir).receipt(request["checkpoint"], kind), receipt, exclusive=True)
    return receipt


def write_failure(run_dir: Path, checkpoint: str, error: str, kind: str = VALIDATION) -> dict:
    """Record one failed attempt as ``failures/<ckpt>-<n>.json`` (n = next free attempt number)."""
    layout = RunDir(run_dir)
    layout.backlog_dir("failures", kind).mkdir(parents=True, exist_ok=True)
    attempt = failure_count(run_dir, checkpoint, kind) + 1
    while True:
        record = {"checkpoint": checkpoint, "attempt": attempt, "error": error[:500], "failed": time.time()}
        try:
            atomic_write_json(layout.failure(checkpoint, attempt, kind), record, exclusive=True)
            return record
        except FileExistsError:
            attempt += 1


# --------------------------------------------------------------------------- status


def retry_wait(run_dir: Path, checkpoint: str, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
               backoff_s: float = DEFAULT_RETRY_BACKOFF_S, now: Optional[float] = None,
               kind: str = VALIDATION) -> Optional[float]:
    """Whether a drainer may take this request (claims aside), and when.

    ``None``: never (it has a receipt or is blocked); ``0.0``: now; otherwise
    the seconds until its retry backoff (:func:`traceml_tui.core.state.retry_ready_at`) has passed.
    """
    records = failures_of(run_dir, checkpoint, kind)
    word = state.decide_backlog(
        has_receipt=RunDir(run_dir).receipt(checkpoint, kind).exists(), has_claim=False, claim_stale=False,
        failures=len(records), max_attempts=max_attempts,
    )
    if word in (BacklogState.COMPLETED, BacklogState.BLOCKED):
        return None
    ready = state.retry_ready_at(failures=len(records), last_failed=last_failed(records), backoff_s=backoff_s)
    now = time.time() if now is None else now
    return 0.0 if ready is None or ready <= now else ready - now


def claimable(run_dir: Path, checkpoint: str, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
              backoff_s: float = DEFAULT_RETRY_BACKOFF_S, now: Optional[float] = None, kind: str = VALIDATION) -> bool:
    """Whether a drainer may take this request now: no receipt, not blocked, not backing off (claims aside)."""
    return retry_wait(run_dir, checkpoint, max_attempts=max_attempts, backoff_s=backoff_s, now=now, kind=kind) == 0.0


def declared_validation(run_dir: Path) -> dict[str, float]:
    """The run's validation settings as its manifest declares them, defaults filled in (docs/hygiene.md).

    ``max_attempts``, ``lease_s``, ``retry_backoff_s``, ``timeout_s`` for drainers, ``validate status``, the
    summary and early stopping: :func:`traceml_tui.core.backlog.validation_settings` of the run's manifest,
    the rule the index side applies too.
    """
    try:
        manifest = artifacts.read_manifest(RunDir(run_dir).manifest)
    except OSError:
        manifest = None
    return core_backlog.validation_settings(manifest).as_dict()


def declared_max_attempts(run_dir: Path) -> int:
    """``hygiene.validation.max_attempts`` from the run's manifest, else :data:`DEFAULT_MAX_ATTEMPTS`."""
    return int(declared_validation(run_dir)["max_attempts"])


def backlog_files(run_dir: Path, errors: Optional[list[str]] = None,
                  kind: str = VALIDATION) -> Iterator[core_backlog.BacklogFile]:
    """Every backlog file of a run's ``kind`` as ``(folder, name, bytes)`` (bytes None when unreadable: one line
    in ``errors``): :func:`traceml_tui.core.backlog.run_backlog_files`."""
    return core_backlog.run_backlog_files(run_dir, kind, errors)


def backlog_entries(run_dir: Path, *, now: Optional[float] = None, max_attempts: Optional[int] = None,
                    errors: Optional[list[str]] = None, kind: str = VALIDATION) -> tuple[core_backlog.BacklogEntry, ...]:
    """The run's backlog as :func:`traceml_tui.core.backlog.backlog_entries` assembles it from its files (the index
    side assembles the same entries from the same bytes). ``max_attempts`` defaults to the run's declared value."""
    settings = core_backlog.ValidationSettings(**declared_validation(run_dir))
    if max_attempts is not None:
        settings = replace(settings, max_attempts=max_attempts)
    return core_backlog.backlog_entries(backlog_files(run_dir, errors, kind), time.time() if now is None else now,
                                        settings=settings, errors=errors, root=BACKLOG_ROOTS[kind])


def backlog_status(run_dir: Path, *, max_attempts: Optional[int] = None, now: Optional[float] = None,
                   kind: str = VALIDATION) -> dict:
    """The state of every request, in the :class:`~traceml_tui.core.state.BacklogState` words.

    ``pending``, ``claimed``, ``stale-claim``, ``failed`` (a retry is left),
    ``blocked`` (every allowed attempt failed) or ``completed``, decided by
    :func:`traceml_tui.core.state.decide_backlog` over the entries of :func:`backlog_entries`.

    Returns ``{requests: [...], newest_completed, latest_requested, counts, outstanding, errors}``;
    ``errors`` holds one line per damaged backlog file, which is left out of the rest;
    ``counts`` follows :data:`~traceml_tui.core.state.BACKLOG_ORDER`; ``outstanding``
    lists every request that has no receipt (a pending or failed request is never a result).
    ``max_attempts`` defaults to the run's declared value (:func:`declared_max_attempts`).
    ``kind``: ``validation`` or ``qc`` (the QC backlog, docs/qc.md): one implementation, two kinds.
    """
    errors: list[str] = []  # one line per damaged backlog file; every other file is still reported
    entries = backlog_entries(run_dir, now=now, max_attempts=max_attempts, errors=errors, kind=kind)
    rows = []
    for entry in entries:
        row = {"checkpoint": entry.checkpoint, "step": entry.step, "created": entry.created,
               "failures": entry.failures, "last_error": entry.last_error, "state": entry.state.value,
               "retry_at": entry.retry_at}
        if entry.receipt is not None:
            row["metrics"] = dict(entry.receipt.metrics)
            row["completed"] = entry.completed
        rows.append(row)
    newest = core_backlog.newest_completed(entries)
    latest = entries[-1] if entries else None
    return {
        "requests": rows,
        "newest_completed": None if newest is None else {
            "checkpoint": newest.checkpoint, "step": newest.step, "metrics": dict(newest.receipt.metrics)},
        "latest_requested": None if latest is None else {"checkpoint": latest.checkpoint, "step": latest.step},
        "counts": state.count_states((e.state.value for e in entries), state.BACKLOG_ORDER),
        "outstanding": [{"checkpoint": e.checkpoint, "step": e.step, "state": e.state.value, "failures": e.failures,
                         "last_error": e.last_error, "retry_at": e.retry_at}
                        for e in core_backlog.outstanding(entries)],
        "errors": errors,
    }
