"""One validation request and where it stands: assembled once, for the files and for the index (docs/hygiene.md).

A request's facts lie in up to four kinds of small files under ``<run>/validation/`` (a request, a claim, a
receipt, failures; decoded by :mod:`traceml_tui.core.hygiene_files`). Two sides read them: the file side
(:func:`traceml_tui.hygiene.backlog.backlog_status`: ``traceml validate status``, the summary, the curve)
and the index side (``daemon/reader.py``: ``traceml watch``, ``traceml status``, the metrics). Both hand
their bytes to :func:`backlog_entries`, so both show the same entries with the same words:

* a checkpoint is in the backlog when it has a readable request; files of a checkpoint without one (a
  damaged request) are no entry;
* a damaged failure file still counts as the failed attempt its name records (never as none); any other
  damaged file counts as absent (a damaged receipt is no result);
* the state word is :func:`traceml_tui.core.state.decide_backlog`'s, the claim's staleness
  :func:`traceml_tui.core.state.claim_is_stale`'s (the owner probed by :mod:`traceml_tui.core.owner`), the
  retry time :func:`traceml_tui.core.state.retry_ready_at`'s;
* a request is *outstanding* while it has no receipt (:func:`is_outstanding`): a pending, claimed, failed or
  blocked request is never a result;
* entries are in checkpoint order: step, then publication time, then id (a step published again after a
  resume comes after its first publication).

The run's validation settings (``max_attempts``, ``lease_s``, ``retry_backoff_s``, ``timeout_s``) come
from its manifest's ``hygiene.validation`` block through :func:`validation_settings`, for every surface.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

from traceml_tui.core import hygiene_files as hf
from traceml_tui.core import owner as core_owner
from traceml_tui.core.rundir import BACKLOG_KINDS, BACKLOG_ROOTS, QC_BACKLOG, VALIDATION, RunDir
from traceml_tui.core.state import (
    BACKLOG_ORDER,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BACKOFF_S,
    DEFAULT_WORKER_TIMEOUT_S,
    BacklogState,
    claim_is_stale,
    count_states,
    decide_backlog,
    decide_worker_qc,
    retry_ready_at,
)

#: What a damaged failure file says instead of its own error text.
DAMAGED_FAILURE = "the failure record is damaged"


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class ValidationSettings:
    """A run's validation settings as its manifest declares them, defaults filled in (docs/hygiene.md)."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    lease_s: float = DEFAULT_LEASE_S
    retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S
    timeout_s: float = DEFAULT_WORKER_TIMEOUT_S

    def as_dict(self) -> dict[str, float]:
        return {"max_attempts": self.max_attempts, "lease_s": self.lease_s,
                "retry_backoff_s": self.retry_backoff_s, "timeout_s": self.timeout_s}


def validation_settings(manifest: Any) -> ValidationSettings:
    """The settings of a decoded :class:`traceml_tui.core.artifacts.Manifest` (None: a run without one — the
    SDK without ``traceml run`` — gets the defaults of :mod:`traceml_tui.core.state`).

    Read through the typed block (:class:`traceml_tui.core.artifacts.ValidationBlock`): a value outside what
    ``traceml.yaml`` allows (hygiene/config.py: positive, at most
    :data:`~traceml_tui.core.hygiene_files.MAX_SECONDS`; a backoff may be 0) is absent and its default applies,
    so a lease written into a claim is one the claim's decoder accepts.
    """
    block = manifest.hygiene_settings.validation if manifest is not None else None
    if block is None:
        return ValidationSettings()
    defaults = ValidationSettings()
    return ValidationSettings(
        max_attempts=block.max_attempts if block.max_attempts is not None else defaults.max_attempts,
        lease_s=block.lease_s if block.lease_s is not None else defaults.lease_s,
        retry_backoff_s=block.retry_backoff_s if block.retry_backoff_s is not None else defaults.retry_backoff_s,
        timeout_s=block.timeout_s if block.timeout_s is not None else defaults.timeout_s,
    )


# --------------------------------------------------------------------------- one entry


def is_outstanding(state: BacklogState) -> bool:
    """Whether a request in ``state`` still waits for its result: every state but ``completed``."""
    return state is not BacklogState.COMPLETED


@dataclass(frozen=True)
class BacklogEntry:
    """One checkpoint of the backlog: its decoded files and its state word (decided by ``core.state``)."""

    checkpoint: str
    state: BacklogState
    request: hf.Request
    claim: Optional[hf.Claim] = None
    receipt: Optional[hf.Receipt] = None
    failure_files: tuple[hf.Failure, ...] = ()  # oldest attempt first; a damaged file as DAMAGED_FAILURE
    retry_at: Optional[float] = None  # a failed request backing off: when it may be taken again (after now)

    @property
    def outstanding(self) -> bool:
        """No receipt yet (:func:`is_outstanding`)."""
        return is_outstanding(self.state)

    @property
    def step(self) -> Optional[int]:
        """The checkpoint's training step: the request's, else its receipt's."""
        if self.request.step is not None:
            return self.request.step
        return self.receipt.step if self.receipt is not None else None

    @property
    def created(self) -> Optional[float]:
        return self.request.created

    @property
    def claimed(self) -> Optional[float]:
        return self.claim.claimed if self.claim is not None else None

    @property
    def heartbeat(self) -> Optional[float]:
        return self.claim.heartbeat if self.claim is not None else None

    @property
    def lease_s(self) -> Optional[float]:
        return self.claim.lease_s if self.claim is not None else None

    @property
    def completed(self) -> Optional[float]:
        return self.receipt.completed if self.receipt is not None else None

    @property
    def failures(self) -> int:
        """Failed attempts recorded (damaged failure files included)."""
        return len(self.failure_files)

    @property
    def last_error(self) -> Optional[str]:
        return self.failure_files[-1].error if self.failure_files else None

    @property
    def last_failed(self) -> Optional[float]:
        """When the newest failure record says it failed (None when none says)."""
        return max((f.failed for f in self.failure_files if f.failed is not None), default=None)

    @property
    def metrics(self) -> tuple[tuple[str, Optional[float]], ...]:
        """The receipt's metrics by name (empty without a receipt)."""
        return tuple(sorted(self.receipt.metrics.items())) if self.receipt is not None else ()

    @property
    def owner(self) -> Optional[str]:
        """``host:pid`` of the claim's owner."""
        owner = self.claim.owner if self.claim is not None else None
        if owner is None:
            return None
        return f"{owner.host or '?'}:{owner.pid if owner.pid is not None else '?'}"

    @property
    def attempts(self) -> tuple[tuple[Optional[int], Optional[float], str], ...]:
        """Every failed attempt, oldest first: (attempt number as written, when it failed, its error text)."""
        return tuple((f.attempt, f.failed, str(f.error)) for f in self.failure_files)


def _attempt_order(failure: hf.Failure) -> tuple:
    return (failure.attempt if failure.attempt is not None else 0,
            failure.failed if failure.failed is not None else 0.0)


def assemble_entry(request: hf.Request, claim: Optional[hf.Claim], receipt: Optional[hf.Receipt],
                   failures: Iterable[hf.Failure], now: float, *, settings: ValidationSettings = ValidationSettings(),
                   probe: Callable[[Any], Optional[bool]] = core_owner.probe_owner) -> BacklogEntry:
    """One entry from a request's decoded files, its state decided at ``now``.

    ``probe`` says whether a claim's owner lives (:func:`traceml_tui.core.owner.probe_owner`: True/False on
    this host, None on another, where the heartbeat and lease decide); it is asked only about a claim that
    could decide the word (no receipt).
    """
    ordered = tuple(sorted(failures, key=_attempt_order))
    stale = False
    if claim is not None and receipt is None:
        owner = hf.as_dict(claim.owner) if claim.owner is not None else None
        stale = claim_is_stale(heartbeat=claim.heartbeat, lease_s=claim.lease_s, now=now, owner_alive=probe(owner))
    state = decide_backlog(has_receipt=receipt is not None, has_claim=claim is not None, claim_stale=stale,
                           failures=len(ordered), max_attempts=settings.max_attempts)
    retry_at = None
    if state is BacklogState.FAILED:
        last = max((f.failed for f in ordered if f.failed is not None), default=None)
        ready = retry_ready_at(failures=len(ordered), last_failed=last, backoff_s=settings.retry_backoff_s)
        retry_at = ready if ready is not None and ready > now else None
    return BacklogEntry(request.checkpoint, state, request, claim, receipt, ordered, retry_at)


def request_order(request: hf.Request) -> tuple:
    """Checkpoint order: step, then publication time, then id (re-published steps after a resume)."""
    step, created = request.step, request.created
    return (step if step is not None else -1, created if created is not None else 0.0, request.checkpoint)


def order_key(entry: BacklogEntry) -> tuple:
    """An entry's place in checkpoint order (:func:`request_order` of its request)."""
    return request_order(entry.request)


# --------------------------------------------------------------------------- a run's backlog

#: One backlog file as a side hands it over: its folder (``requests``…), its name and its bytes (None when
#: they could not be read; the side reports why).
BacklogFile = tuple[str, str, Union[bytes, str, None]]


def backlog_entries(files: Iterable[BacklogFile], now: float, *, settings: ValidationSettings = ValidationSettings(),
                    errors: Optional[list[str]] = None,
                    probe: Callable[[Any], Optional[bool]] = core_owner.probe_owner,
                    root: str = "validation") -> tuple[BacklogEntry, ...]:
    """Every entry of a run's backlog from its files, in checkpoint order (see the module docstring).

    A file that does not decode adds one line to ``errors``: ``<root>/<folder>/<name>: <what is wrong>`` (``root``:
    ``validation``, or ``qc`` for the QC backlog of docs/qc.md, which is assembled by the same rules).
    """
    requests: dict[str, hf.Request] = {}
    claims: dict[str, hf.Claim] = {}
    receipts: dict[str, hf.Receipt] = {}
    failures: dict[str, list[hf.Failure]] = {}
    for folder, name, data in files:
        value: Optional[hf.BacklogFile] = None
        if data is not None:
            try:
                value = hf.decode_named(folder, name, data)
            except hf.DamagedFile as exc:
                if errors is not None:
                    errors.append(f"{root}/{folder}/{name}: {exc}")
        if folder == "failures":
            if value is None:  # damaged or unreadable: still the failed attempt its name records
                checkpoint = hf.checkpoint_of(folder, name)
                if checkpoint is None:
                    continue
                value = hf.Failure(checkpoint=checkpoint, error=DAMAGED_FAILURE)
            failures.setdefault(value.checkpoint, []).append(value)
        elif value is not None:
            {"requests": requests, "claims": claims, "receipts": receipts}[folder][value.checkpoint] = value
    entries = [assemble_entry(request, claims.get(ckpt), receipts.get(ckpt), failures.get(ckpt, ()), now,
                              settings=settings, probe=probe)
               for ckpt, request in requests.items()]
    entries.sort(key=order_key)
    return tuple(entries)


def outstanding(entries: Iterable[BacklogEntry]) -> list[BacklogEntry]:
    """The entries still waiting for their result, in checkpoint order."""
    return [e for e in entries if e.outstanding]


def newest_completed(entries: Iterable[BacklogEntry]) -> Optional[BacklogEntry]:
    """The last completed entry in checkpoint order (the newest evaluated checkpoint), or None."""
    done = [e for e in entries if e.state is BacklogState.COMPLETED]
    return done[-1] if done else None


def run_backlog_files(run_dir: "os.PathLike[str] | str", kind: str = VALIDATION,
                      errors: Optional[list[str]] = None) -> Iterator[BacklogFile]:
    """Every backlog file of a run's ``kind`` (``validation`` or ``qc``) as ``(folder, name, bytes)``, read from
    its run directory (bytes None when unreadable: one line in ``errors``); a file gone since the listing (a
    released claim) is left out. The one reader of a run's backlog files for the file side and the daemon."""
    layout = RunDir(run_dir)
    for folder in BACKLOG_KINDS:
        for path in layout.backlog_files(folder, kind):
            try:
                with open(path, "rb") as handle:
                    data: Optional[bytes] = handle.read()
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                if errors is not None:
                    errors.append(f"{BACKLOG_ROOTS[kind]}/{folder}/{path.name}: cannot read: {exc.strerror or exc}")
                data = None
            yield folder, path.name, data


# --------------------------------------------------------------------------- heavy QC (docs/qc.md)


def requires_worker_qc(qc: Any) -> bool:
    """Whether a normalized ``hygiene.qc`` block requires worker QC with a declared worker (docs/qc.md)."""
    if not isinstance(qc, Mapping) or not isinstance(qc.get("worker"), list):
        return False
    items = qc.get("items")
    row = items.get("worker_qc") if isinstance(items, Mapping) else None
    return isinstance(row, Mapping) and bool(row.get("required"))


def damaged_requests(errors: Iterable[str], root: str = QC_BACKLOG) -> list[str]:
    """The request files an ``errors`` list names (``qc/requests/<ckpt>.json: …``): damaged or unreadable, so
    their checkpoints have no entry. Both sides name a damaged backlog file by this path (:func:`backlog_entries`,
    the daemon's side-file error)."""
    prefix = f"{BACKLOG_ROOTS.get(root, root)}/requests/"
    return [line.split(": ", 1)[0] for line in errors if line.startswith(prefix)]


def worker_qc_report(entries: Iterable[BacklogEntry], errors: Iterable[str] = ()) -> dict[str, Any]:
    """A QC backlog's entries as every surface shows them (the summary's ``qc.worker_qc``, ``traceml status
    --json``): ``{state, requested, completed, counts, outstanding}``.

    ``state`` is :func:`traceml_tui.core.state.decide_worker_qc`'s word (``passed`` only when every request has its
    receipt); ``outstanding`` names every request without one (checkpoint, step, state, failures, last error).
    A damaged request file (named in ``errors``) is a QC point whose result cannot be known and that no worker
    can take: it counts as ``blocked`` for the word, so a damaged request never lets QC pass (docs/qc.md).
    """
    entries = tuple(entries)
    hidden = [BacklogState.BLOCKED] * len(damaged_requests(errors))
    return {
        "state": decide_worker_qc([*(e.state for e in entries), *hidden]).value,
        "requested": len(entries),
        "completed": sum(1 for e in entries if e.state is BacklogState.COMPLETED),
        "counts": count_states((e.state.value for e in entries), BACKLOG_ORDER),
        "outstanding": [{"checkpoint": e.checkpoint, "step": e.step, "state": e.state.value, "failures": e.failures,
                         "last_error": e.last_error} for e in outstanding(entries)],
    }


def manifest_requires_worker_qc(manifest: Any) -> bool:
    """Whether a decoded :class:`traceml_tui.core.artifacts.Manifest` requires worker QC (docs/qc.md)."""
    hygiene = manifest.hygiene if manifest is not None else None
    return isinstance(hygiene, dict) and requires_worker_qc(hygiene.get("qc"))


def run_worker_qc(manifest: Any, entries: Iterable[BacklogEntry], errors: Iterable[str]) -> Optional[dict[str, Any]]:
    """A run's worker-QC report as ``traceml status --json`` and the Backlog screen show it, from the entries of
    its QC backlog as the index holds them (``reader.backlog.worker_qc``) and the lines naming its damaged QC
    files: :func:`worker_qc_report` plus ``errors``; None when its manifest requires no worker QC.

    The file side (the summary, :func:`traceml_tui.hygiene.qc_backlog.worker_qc_report`) builds the same report
    from the files by the same two functions: the same bytes give the same report (tests/test_qc_worker_run.py).
    """
    if not manifest_requires_worker_qc(manifest):
        return None
    errors = list(errors)
    return {**worker_qc_report(entries, errors), "errors": errors}


__all__ = ["BacklogEntry", "BacklogFile", "DAMAGED_FAILURE", "ValidationSettings", "assemble_entry",
           "backlog_entries", "damaged_requests", "is_outstanding", "manifest_requires_worker_qc", "newest_completed",
           "order_key", "outstanding", "request_order", "requires_worker_qc", "run_backlog_files", "run_worker_qc",
           "validation_settings", "worker_qc_report"]
