"""A run's JSON side files, parsed: bytes in, typed facts out (pure — no I/O, no SQL).

The ingester reads a side file (a regular file, at most :data:`SIDE_MAX_BYTES`)
and hands its bytes to :func:`parse`. What comes back is what it stores:

* ``content`` — the text kept in ``side_files.content`` (any JSON object);
* ``error`` — one message naming the file, for ``side_files.error`` and the
  ``errors`` table (bad JSON, not an object, not the shape its kind must have);
* ``key`` — a backlog file's checkpoint id, an outcome's node rank;
* ``facts`` — what the ``runs`` row needs, decoded with
  :mod:`traceml_tui.core.artifacts` and judged by :mod:`traceml_tui.core.state`
  (never by rules of our own): :class:`ManifestFacts`, :class:`OutcomeFacts`
  or :class:`SummaryFacts`; None for backlog files and for anything unreadable.

Backlog files and ``early_stopping.json`` are checked by their own decoders
(:mod:`traceml_tui.core.hygiene_files`; the latter through :mod:`daemon.early_stopping`).
"""

from __future__ import annotations

import calendar
import functools
import time
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional, Union

import msgspec

from traceml_tui.core import artifacts, bounds, hygiene_files, jsonsafe, rundir, state

from . import early_stopping

SIDE_MAX_BYTES = 64 << 20
#: Side-file kinds of the validation backlog (``validation/<folder>/*.json``) and of the QC backlog
#: (``qc/<folder>/*.json``, kinds ``qc_request``…: :data:`traceml_tui.core.rundir.BACKLOG_SIDE_KINDS`).
BACKLOG_KINDS = frozenset(rundir.BACKLOG_OF_SIDE_KIND)
#: Side-file kinds decoded into a typed struct, and the struct.
TYPED_KINDS = {"manifest": artifacts.Manifest, "outcome": artifacts.NodeOutcome, "summary": artifacts.Summary}


@dataclass(frozen=True)
class ManifestFacts:
    """The manifest fields kept in the ``runs`` row."""

    run_name: str
    status: Optional[str]  # running | completed | failed | interrupted
    training_status: Optional[str]  # guard.training.status: completed | incomplete
    nnodes: Optional[int]
    nproc_per_node: Optional[int]
    world_size: Optional[int]
    started_at: Optional[str]  # ISO-8601 UTC
    ended_at: Optional[str]
    max_attempts: Optional[int]  # hygiene.validation.max_attempts as declared (None: the default applies)


@dataclass(frozen=True)
class OutcomeFacts:
    """One node's guard outcome (``nodes/node_<k>/guard_outcome.json``)."""

    node: Optional[int]  # the node folder's number
    status: Optional[str]
    exit_code: Optional[int]
    failed: bool  # core.state.outcome_failed


@dataclass(frozen=True)
class SummaryFacts:
    """The final summary's run status (``run_context.run.status``) and the exit codes its ``failure`` section
    says the launcher reported for ranks whose own end records lack one (core.state.with_exit_codes)."""

    status: Optional[str]
    launcher_exit_codes: tuple[tuple[int, int], ...] = ()  # (rank, code), by rank


Facts = Union[ManifestFacts, OutcomeFacts, SummaryFacts, None]


class SideRead(NamedTuple):
    """What one version of a side file contributes to the index."""

    content: Optional[str]
    error: Optional[str]
    key: Optional[str]
    facts: Facts = None


def time_text(value) -> Optional[str]:
    """An ISO-8601 UTC text for epoch seconds (a text is kept as written; a time outside
    :data:`traceml_tui.core.bounds.Epoch`'s range is None: the decoded manifest never holds one)."""
    if isinstance(value, str):
        return value
    seconds = bounds.epoch_or_none(value)
    if seconds is None:
        return None
    # milliseconds when there are any: the run's duration is computed from these (daemon/views.py run_times)
    whole, ms = divmod(round(seconds * 1000), 1000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    return f"{text}.{ms:03d}Z" if ms else f"{text}Z"


@functools.lru_cache(maxsize=4096)  # every listing reads each run's two texts again (the durations move with now)
def time_of_text(text: Optional[str]) -> Optional[float]:
    """Epoch seconds of a :func:`time_text` (``…:SSZ`` or ``…:SS.mmmZ``); None for any other text."""
    if not isinstance(text, str) or not text.endswith("Z"):
        return None
    base, dot, ms = text[:-1].partition(".")
    if dot and not (len(ms) == 3 and ms.isdigit()):
        return None
    try:
        return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + (int(ms) / 1000 if dot else 0.0)
    except (ValueError, OverflowError):
        return None


def _node_of(key: Optional[str]) -> Optional[int]:
    return int(key) if isinstance(key, str) and key.isdigit() else None


def manifest_facts(manifest: Optional[artifacts.Manifest]) -> Optional[ManifestFacts]:
    """The ``runs`` facts of a decoded manifest (None for None)."""
    if manifest is None:
        return None
    topo = manifest.topology
    return ManifestFacts(
        run_name=manifest.run_name, status=manifest.status, training_status=manifest.guard_training_status,
        nnodes=topo.nnodes, nproc_per_node=topo.nproc_per_node, world_size=topo.world_size,
        started_at=time_text(manifest.started_at), ended_at=time_text(manifest.ended_at),
        max_attempts=manifest.max_validation_attempts,
    )


def outcome_facts(outcome: Optional[artifacts.NodeOutcome], key: Optional[str]) -> Optional[OutcomeFacts]:
    """The facts of a decoded node outcome found in the folder of node ``key`` (None for None)."""
    if outcome is None:
        return None
    t = outcome.training
    return OutcomeFacts(_node_of(key), t.status, t.exit_code, state.outcome_failed(t.status, t.exit_code))


def summary_facts(summary: Optional[artifacts.Summary]) -> Optional[SummaryFacts]:
    """The ``runs`` facts of a decoded final summary (None for None)."""
    if summary is None:
        return None
    failure = summary.failure
    codes = failure.launcher_exit_codes() if failure is not None else {}
    return SummaryFacts(summary.run_status, tuple(sorted(codes.items())))


def decode_facts(kind: str, data: Union[bytes, str], key: Optional[str] = None) -> Facts:
    """The typed facts of a manifest, outcome or summary's bytes; None when they do not decode."""
    if kind == "manifest":
        return manifest_facts(artifacts.decode_manifest(data))
    if kind == "outcome":
        return outcome_facts(artifacts.decode_outcome(data), key)
    if kind == "summary":
        return summary_facts(artifacts.decode_summary(data))
    return None


def _why_not(data: bytes, kind: str) -> str:
    """The decoder's reason why ``data`` is not a valid ``kind`` (only called after a failed decode)."""
    try:
        jsonsafe.decode_bounded(data, type=TYPED_KINDS[kind])
    except (msgspec.ValidationError, msgspec.DecodeError, jsonsafe.NestingError) as exc:
        return str(exc)
    except RecursionError:
        return "nested too deeply"
    return "does not decode"


def too_large(rel: str, size: int) -> SideRead:
    """A side file over :data:`SIDE_MAX_BYTES`: not read, one error."""
    return SideRead(None, f"{rel}: {size} bytes is larger than the {SIDE_MAX_BYTES}-byte limit", None)


def parse(kind: str, rel: str, key: Optional[str], data: bytes) -> SideRead:
    """One side file's bytes → content, error, key and facts (see the module docstring).

    A JSON object that is not the shape its kind must have is kept as content
    (readers may still show it raw), with an error and no facts.
    """
    if kind in BACKLOG_KINDS:
        return _backlog_file(kind, rel, key, data)
    try:
        # Nesting is bounded before decoding (core.jsonsafe): a file thousands of levels deep is this file's
        # error, never a RecursionError that would abort the scan of everything else.
        value = jsonsafe.decode_bounded(data)
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        content = data.decode("utf-8")
    except (msgspec.DecodeError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        return SideRead(None, f"{rel}: {exc}", key)
    if kind == early_stopping.KIND:
        return SideRead(*early_stopping.parse(rel, key, data, content), key)
    if kind in TYPED_KINDS:
        facts = decode_facts(kind, data, key)
        if facts is None:
            return SideRead(content, f"{rel}: not a valid {kind}: {_why_not(data, kind)}", key)
        return SideRead(content, None, key, facts)
    return SideRead(content, None, key)


def _backlog_file(kind: str, rel: str, key: Optional[str], data: bytes) -> SideRead:
    """A backlog file (validation's or the QC backlog's: one rule for both kinds) judged by the one decoder of a
    backlog file (:func:`traceml_tui.core.hygiene_files.decode_named`), as ``traceml validate status`` and the
    summary judge it, so its error line is the file side's word for word (``qc/requests/x.json: not UTF-8 text
    (byte 0)``). A damaged file that is still a JSON object keeps its text as content (the reader leaves it out
    of the backlog, a failure still counts as the attempt its name records) and is named in the run's errors."""
    content: Optional[str] = None
    try:
        value = jsonsafe.decode_bounded(data)
        if isinstance(value, dict):
            content = data.decode("utf-8")
            checkpoint = value.get("checkpoint")
            key = checkpoint if isinstance(checkpoint, str) and checkpoint else key
    except (msgspec.DecodeError, ValueError, UnicodeDecodeError, RecursionError):
        pass  # not JSON at all: the decoder below says why
    try:
        hygiene_files.decode_named(rundir.BACKLOG_OF_SIDE_KIND[kind][1], rel.rsplit("/", 1)[-1], data)
    except hygiene_files.DamagedFile as exc:
        return SideRead(content, f"{rel}: {exc}", key)
    if content is None:  # accepted by the backlog decoder yet not kept (never seen): still this file's error
        return SideRead(None, f"{rel}: not a JSON object this index can keep", key)
    return SideRead(content, None, key)


class OutcomeRollup(NamedTuple):
    total: int  # outcomes present that decode
    failed: int  # … of which core.state.outcome_failed
    nodes: Optional[str]  # their node ranks, ascending, comma-separated ("0,1"); None when there is none


def outcome_rollup(outcomes: Iterable[Optional[OutcomeFacts]]) -> OutcomeRollup:
    """The ``runs`` outcome columns from a run's outcomes (undecodable ones are None and do not count)."""
    good = [o for o in outcomes if o is not None]
    nodes = sorted({o.node for o in good if o.node is not None})
    return OutcomeRollup(len(good), sum(1 for o in good if o.failed),
                         ",".join(map(str, nodes)) if nodes else None)
