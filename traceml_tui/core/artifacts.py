"""Typed manifest, node outcome and final summary: the shapes writers write and readers decode.

The launcher builds a :class:`Manifest` and writes it with :func:`encode`;
every reader (daemon, summary builder, TUI, hygiene, export) decodes one with
:func:`decode_manifest`. The summary builder's payload is checked against
:class:`Summary` before it is written, and readers of our own summaries
decode the sections they show with :func:`decode_summary`. Unknown keys are
ignored, so newer writers — and ``traceml-ai`` summaries — stay readable;
``traceml compare`` keeps reading summaries as plain mappings for interop.

A value of the wrong type makes the whole document unreadable (``None``):
readers show "no manifest" rather than half of one. So does JSON nested
deeper than :data:`traceml_tui.core.jsonsafe.MAX_DEPTH`, refused before decoding,
and a number out of its bounds (:mod:`traceml_tui.core.bounds`: integers
within 64 bits, ranks and counts not negative, times between 1970 and year
9999): one damaged file is that file's error, never a failure of whoever
stores or shows its numbers (docs/daemon.md, "Damaged input").
"""

from __future__ import annotations

import functools
import os
from typing import Annotated, Any, Literal, Optional, Union

import msgspec

from traceml_tui.core import jsonsafe
from traceml_tui.core.bounds import INT64_MAX, Count, Epoch, Int64, IntKey, parse_int_key
from traceml_tui.core.hygiene_files import MAX_SECONDS
from traceml_tui.core.regular_file import read_regular

MANIFEST_SCHEMA_VERSION = 1

_encoder = msgspec.json.Encoder()


class Topology(msgspec.Struct, omit_defaults=False):
    nnodes: Optional[Count] = None
    nproc_per_node: Optional[Count] = None
    world_size: Optional[Count] = None


class Launch(msgspec.Struct):
    kind: str = "process"  # "process" (one process) or "torch.distributed.run"


class NodeExit(msgspec.Struct):
    node_rank: Count
    exit_code: Optional[Int64] = None


class GuardTraining(msgspec.Struct):
    """The node outcomes collected by node 0 (``guard.training``)."""

    status: Optional[str] = None  # completed | incomplete
    nodes_expected: Optional[Count] = None
    nodes_observed: Optional[Count] = None
    reasons: list[str] = msgspec.field(default_factory=list)
    nodes: list[NodeExit] = msgspec.field(default_factory=list)


class Guard(msgspec.Struct, omit_defaults=True):
    contract: Optional[dict[str, Any]] = None  # parsed by traceml_tui.guard.contract
    contract_digest: Optional[str] = None
    training: Optional[GuardTraining] = None


class Telemetry(msgspec.Struct):
    """What telemetry the run delivered (``telemetry``, beside ``status`` and ``guard.training``; seed 000).

    Written by node 0 at the end (:mod:`traceml_tui.run.telemetry`): ``status``
    is ``complete``, ``incomplete`` (``reasons``) or ``none``; ``records`` counts
    each rank's step records (each step once).
    """

    status: Optional[str] = None
    ranks_expected: Optional[Count] = None
    records: dict[str, Count] = msgspec.field(default_factory=dict)
    ranks_without_records: list[Count] = msgspec.field(default_factory=list)
    window: Optional[list[Int64]] = None  # the declared measurement window [start, end] of a guarded run
    window_incomplete_ranks: list[Count] = msgspec.field(default_factory=list)
    window_span_s: Optional[float] = None
    window_exceeds_retention: Optional[bool] = None
    reasons: list[str] = msgspec.field(default_factory=list)


# --------------------------------------------------------------------------- the manifest's blocks, typed
#
# The manifest keeps its ``guard.contract`` and ``hygiene`` blocks as written (the launcher writes what
# ``guard/contract.py`` and ``hygiene/config.py`` normalized; a resume compares them item by item), and
# readers see them through these structs: :meth:`Manifest.contract` and :meth:`Manifest.hygiene_settings`.
# A block is read field by field (:func:`decode_lenient`): a field out of its bounds — an edited manifest — is
# absent (its default applies) and the block's other fields still count.

Positive = Annotated[float, msgspec.Meta(gt=0.0, le=MAX_SECONDS)]  # seconds a block may declare (a claim's bound)
NonNegative = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_SECONDS)]
AtLeastOne = Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]


class ContractWorkload(msgspec.Struct):
    name: Optional[str] = None


class ContractMeasurement(msgspec.Struct):
    start_step: Optional[Int64] = None
    completed_steps: Optional[Count] = None


class GuardContract(msgspec.Struct):
    """``guard.contract`` of a guarded run's manifest (normalized by :mod:`traceml_tui.guard.contract`)."""

    workload: Optional[ContractWorkload] = None
    measurement: Optional[ContractMeasurement] = None

    @property
    def window_end(self) -> Optional[int]:
        """The measurement window's last step (``start_step + completed_steps - 1``), when declared."""
        m = self.measurement
        if m is None or m.start_step is None or m.completed_steps is None:
            return None
        return m.start_step + m.completed_steps - 1


class ValidationBlock(msgspec.Struct):
    """``hygiene.validation`` (docs/hygiene.md); None: not declared or out of bounds (the default applies)."""

    recipe: Optional[str] = None
    cadence: Optional[AtLeastOne] = None
    max_attempts: Optional[AtLeastOne] = None
    lease_s: Optional[Positive] = None
    retry_backoff_s: Optional[NonNegative] = None
    timeout_s: Optional[Positive] = None


class EarlyStoppingBlock(msgspec.Struct):
    """``hygiene.early_stopping`` as declared (the policy's state is ``early_stopping.json``: core/stopping.py)."""

    enabled: bool = True
    reason: Optional[str] = None
    metric: Optional[str] = None
    direction: Optional[Literal["min", "max"]] = None
    min_delta: Optional[NonNegative] = None
    patience: Optional[AtLeastOne] = None
    warmup: Optional[Count] = None
    max_budget: Optional[AtLeastOne] = None


class HygieneSettings(msgspec.Struct):
    """The manifest's ``hygiene`` block, typed (sections a run did not declare are None)."""

    validation: Optional[ValidationBlock] = None
    early_stopping: Optional[EarlyStoppingBlock] = None


def decode_lenient(value: Any, kind: type) -> Any:
    """``value`` (a JSON object) as a ``kind`` struct, leaving out each field that does not convert (its default
    applies); None when ``value`` is not an object. Nested struct fields are read the same way."""
    if not isinstance(value, dict):
        return None
    fields: dict[str, Any] = {}
    for key, name, annotation, nested in _field_plan(kind):
        if key not in value:
            continue
        raw = value[key]
        if nested is not None and isinstance(raw, dict):
            fields[name] = decode_lenient(raw, nested)
            continue
        try:
            fields[name] = msgspec.convert(raw, annotation)
        except (msgspec.ValidationError, TypeError, OverflowError, RecursionError):
            continue
    return kind(**fields)


@functools.lru_cache(maxsize=None)
def _field_plan(kind: type) -> tuple[tuple[str, str, Any, Optional[type]], ...]:
    """(JSON key, field name, annotation, nested struct) of each field of ``kind``: resolving annotations is slow
    (measured: most of a backlog read), and a struct's fields never change."""
    return tuple((f.encode_name, f.name, f.type, _struct_of(f.type)) for f in msgspec.structs.fields(kind))


def _struct_of(annotation: Any) -> Optional[type]:
    """The struct type of an ``Optional[SomeStruct]`` field annotation, else None."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


class Manifest(msgspec.Struct, omit_defaults=False):
    """``manifest.json``: written by node 0's launcher at start and at the end (no paths, hosts, args, env)."""

    run_name: str
    schema_version: Int64 = MANIFEST_SCHEMA_VERSION
    status: str = "running"  # running → completed | failed | interrupted
    started_at: Optional[Epoch] = None
    ended_at: Optional[Epoch] = None
    exit_code: Optional[Int64] = None
    mode: Optional[str] = None
    history_enabled: Optional[bool] = None
    history_retention_s: Optional[float] = None
    topology: Topology = msgspec.field(default_factory=Topology)
    launch: Launch = msgspec.field(default_factory=Launch)
    trace_max_steps: Optional[Int64] = None
    attempts: Int64 = 1
    guard: Union[Guard, msgspec.UnsetType] = msgspec.UNSET  # guarded runs only
    hygiene: Union[dict[str, Any], msgspec.UnsetType] = msgspec.UNSET  # runs with a hygiene: block
    telemetry: Union[Telemetry, msgspec.UnsetType] = msgspec.UNSET  # written at the end by node 0

    @property
    def guarded(self) -> bool:
        return isinstance(self.guard, Guard)

    @property
    def guard_training_status(self) -> Optional[str]:
        return self.guard.training.status if isinstance(self.guard, Guard) and self.guard.training else None

    @property
    def contract(self) -> GuardContract:
        """``guard.contract``, typed (empty for an unguarded run)."""
        raw = self.guard.contract if isinstance(self.guard, Guard) else None
        return decode_lenient(raw, GuardContract) or GuardContract()

    @property
    def hygiene_settings(self) -> HygieneSettings:
        """The ``hygiene`` block, typed (empty for a run without one)."""
        return decode_lenient(self.hygiene_block, HygieneSettings) or HygieneSettings()

    @property
    def workload(self) -> Optional[str]:
        """The declared workload name of a guarded run."""
        workload = self.contract.workload
        return workload.name if workload is not None else None

    @property
    def declared_last_step(self) -> Optional[int]:
        """The last step the run declared it will reach: ``--trace-max-steps`` (the launcher refuses one short of
        the guard's window), else the end of the guard contract's measurement window.

        The window's end is the least a guarded run must reach, not its length: a reader shows it only while
        the run has not passed it (:meth:`last_step_ahead`)."""
        if self.trace_max_steps is not None:
            return self.trace_max_steps
        return self.contract.window_end

    def last_step_ahead(self, step: Optional[int]) -> Optional[int]:
        """:attr:`declared_last_step` while the run, at ``step``, has not passed it (shown as ``step/last`` and
        used for the ETA); None once past it: a guarded run longer than its window has no declared end."""
        last = self.declared_last_step
        return last if last is not None and (step is None or step <= last) else None

    @property
    def hygiene_block(self) -> dict[str, Any]:
        return self.hygiene if isinstance(self.hygiene, dict) else {}

    @property
    def max_validation_attempts(self) -> Optional[int]:
        """``hygiene.validation.max_attempts`` as declared (None: the default applies)."""
        validation = self.hygiene_settings.validation
        return validation.max_attempts if validation is not None else None


class OutcomeTraining(msgspec.Struct):
    status: Optional[str] = None  # completed | failed
    exit_code: Optional[Int64] = None


class NodeOutcome(msgspec.Struct):
    """``nodes/node_<k>/guard_outcome.json`` as readers see it (validated fully by traceml_tui.guard.outcome)."""

    node_rank: Optional[Count] = None
    run_name: Optional[str] = None
    training: OutcomeTraining = msgspec.field(default_factory=OutcomeTraining)
    completed_at: Optional[str] = None


class SummaryRun(msgspec.Struct):
    status: Optional[str] = None
    profile: Optional[str] = None


class RunContext(msgspec.Struct, omit_defaults=True):
    run: Optional[SummaryRun] = None
    declaration: Optional[dict[str, Any]] = None
    execution: Optional[dict[str, Any]] = None


class ComponentTrend(msgspec.Struct):
    """One loss component's scale-free ratio over the run (1.0 = what predicting zero scores)."""

    ratio_first: Optional[float] = None
    ratio_last: Optional[float] = None
    ratio_min: Optional[float] = None
    ratio_recent_median: Optional[float] = None
    learning: Optional[bool] = None


class EvalFreshness(msgspec.Struct, omit_defaults=True):
    completed: Int64 = 0
    pending: Int64 = 0
    newest_checkpoint: Optional[str] = None
    newest_step: Optional[Int64] = None
    lag_steps: Optional[Int64] = None
    backlog: Optional[Int64] = None


class TrainingSection(msgspec.Struct):
    """Our ``training`` section: loss, scale-free ratios and evaluation freshness."""

    steps_completed: Optional[Int64] = None
    examples: Optional[Int64] = None
    loss: Optional[dict[str, Optional[float]]] = None
    components: dict[str, ComponentTrend] = msgspec.field(default_factory=dict)
    eval: Optional[EvalFreshness] = None

    @property
    def worst_ratio(self) -> tuple[Optional[str], Optional[float]]:
        """The component with the highest recent ratio: the one that learns least."""
        best: tuple[Optional[str], Optional[float]] = (None, None)
        for name, trend in self.components.items():
            value = trend.ratio_recent_median if trend.ratio_recent_median is not None else trend.ratio_last
            if value is not None and (best[1] is None or value > best[1]):
                best = (name, value)
        return best


class ValidationSection(msgspec.Struct):
    """Our ``validation`` section: what the run's validation backlog delivered (seed 004).

    Built by :func:`traceml_tui.hygiene.report.validation_report` from the
    backlog's state words and ``early_stopping.json``; ``status`` is
    ``complete`` or ``missing`` (nothing published, or requests left without
    a receipt). The counts are one per backlog state word (``stale_claim`` for
    ``stale-claim``) and sum to ``requested``.
    """

    status: Optional[str] = None
    missing: Optional[str] = None
    recipe: Optional[str] = None
    requested: Int64 = 0
    completed: Int64 = 0
    pending: Int64 = 0
    claimed: Int64 = 0
    stale_claim: Int64 = 0
    failed: Int64 = 0
    blocked: Int64 = 0
    newest_completed: Optional[dict[str, Any]] = None  # {checkpoint, step, metrics}
    latest_requested: Optional[dict[str, Any]] = None  # {checkpoint, step}
    best: Optional[dict[str, Any]] = None  # the selected checkpoint: {checkpoint, step, metric, value, selected_on, …}
    early_stopping: Optional[dict[str, Any]] = None  # {enabled, state, reason, trigger_checkpoint, …, after_stop}
    curve: Optional[str] = None  # learning_curve.png, relative to the run directory, when rendered


class FailureSection(msgspec.Struct):
    """Our ``failure`` section: who failed first, where and why (:mod:`traceml_tui.core.forensics`).

    Written by the launcher for a failed run (docs/run.md "Failure forensics");
    null for a clean one. No host names or absolute paths: ``exception`` is
    scrubbed and capped, ``log`` is relative to the run directory.
    """

    cause: str = "unknown"  # one of core.forensics.CAUSES
    rank: Optional[Int64] = None  # the first failing rank (None: no rank recorded anything)
    node: Optional[Int64] = None
    step: Optional[Int64] = None  # the step it was in: one past its last completed step
    last_step: Optional[Int64] = None
    state: Optional[str] = None  # its rank state word: failed | lost
    cause_text: str = ""
    exit_code: Optional[Int64] = None
    signal: Optional[str] = None
    exception: Optional[str] = None
    victims: list[Int64] = msgspec.field(default_factory=list)  # ranks aborted after it
    log: Optional[str] = None
    # rank -> the exit code its launcher reported, for every rank whose state that code decided (its end
    # record had none: core.state.with_exit_codes); readers apply the same codes to get the same rank words
    # (JSON keys: the rank as text, ASCII digits; anything else makes the summary unreadable, bounds.IntKey)
    exit_codes: dict[IntKey, Int64] = msgspec.field(default_factory=dict)
    # the hang that failed the run (core.hang.HangReport.to_dict(): culprits, waiting, collective, seq,
    # frame, text), when its cause is ``hang``
    hang: Optional[dict[str, Any]] = None

    @property
    def hang_text(self) -> Optional[str]:
        """The hang's one line (``r1 in train.py:42 `time.sleep`, not in all_reduce #57; r0 waiting …``)."""
        text = self.hang.get("text") if isinstance(self.hang, dict) else None
        return text if isinstance(text, str) else None

    def launcher_exit_codes(self) -> dict[int, int]:
        """:attr:`exit_codes` by rank; for a summary written before that field, the first failure's own code."""
        if self.exit_codes:
            return {parse_int_key(k): v for k, v in self.exit_codes.items() if parse_int_key(k) is not None}
        return {self.rank: self.exit_code} if self.rank is not None and self.exit_code is not None else {}


class _FailureOnly(msgspec.Struct):
    failure: Optional[FailureSection] = None


class _ValidationOnly(msgspec.Struct):
    validation: Optional[ValidationSection] = None


class _StepTimeOnly(msgspec.Struct):
    step_time: Any = None


class UnmeasuredEntry(msgspec.Struct):
    """A stream one rank did not measure, and why (``core/coverage.py``)."""

    rank: Count
    stream: str
    reason: str = ""


class IntegrationSection(msgspec.Struct):
    """The summary's ``integration`` section: were steps traced, which streams are dark (docs/run.md)."""

    steps_traced: Optional[bool] = None
    unmeasured: list[UnmeasuredEntry] = msgspec.field(default_factory=list)


class Summary(msgspec.Struct, omit_defaults=False):
    """``final_summary.json``: the published schema-1.9 layout plus our own sections.

    The sections ``traceml compare`` reads (``step_time``, ``system``,
    ``process``, ``step_memory``, ``analysis_window``, ``meta``) stay mappings
    here: their layout is the published one and compare reads them as such.
    """

    schema_version: Any = None
    generated_at: Optional[str] = None
    duration_s: Optional[float] = None
    analysis_window: dict[str, Any] = msgspec.field(default_factory=dict)
    meta: dict[str, Any] = msgspec.field(default_factory=dict)
    run_context: RunContext = msgspec.field(default_factory=RunContext)
    primary_diagnosis: dict[str, Any] = msgspec.field(default_factory=dict)
    system: dict[str, Any] = msgspec.field(default_factory=dict)
    process: dict[str, Any] = msgspec.field(default_factory=dict)
    step_time: dict[str, Any] = msgspec.field(default_factory=dict)
    step_memory: dict[str, Any] = msgspec.field(default_factory=dict)
    training: Optional[TrainingSection] = None
    qc: Optional[dict[str, Any]] = None
    validation: Optional[ValidationSection] = None
    #: one line each: the end-of-run warnings of seed 004's rules (hygiene/warnings.py, docs/hygiene.md)
    hygiene_warnings: list[str] = msgspec.field(default_factory=list)
    environment: Optional[dict[str, Any]] = None
    failure: Optional[FailureSection] = None
    integration: Optional[IntegrationSection] = None
    text: str = ""

    @property
    def run_status(self) -> Optional[str]:
        return self.run_context.run.status if self.run_context.run else None


def _decode(data: Union[bytes, str, dict, None], kind: type) -> Any:
    if data is None:
        return None
    try:
        if isinstance(data, dict):
            return msgspec.convert(data, kind)
        if jsonsafe.nesting_depth(data) > jsonsafe.MAX_DEPTH:
            return None  # nested deeper than any artifact: not one (and never handed to the decoder)
        return msgspec.json.decode(data, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, TypeError):
        return None


def decode_manifest(data: Union[bytes, str, dict, None]) -> Optional[Manifest]:
    """A manifest from its JSON bytes (or a parsed mapping); None when it is not one."""
    return _decode(data, Manifest)


#: A manifest is a few KiB: a larger file is not one (and a link to ``/dev/zero`` would be read for ever).
MAX_MANIFEST_BYTES = 8 << 20


def read_manifest(path: Union[str, os.PathLike]) -> Optional[Manifest]:
    """The manifest file at ``path``, decoded (None: not a traceml manifest).

    ``OSError`` when it cannot be read: missing, not a regular file (a FIFO planted there made
    ``traceml validate status`` and ``traceml curve`` wait for ever; found fuzzing), or over
    :data:`MAX_MANIFEST_BYTES`. Opened without blocking, so a FIFO is refused, never waited on.
    """
    return decode_manifest(read_regular(path, MAX_MANIFEST_BYTES))


def decode_outcome(data: Union[bytes, str, dict, None]) -> Optional[NodeOutcome]:
    """A node outcome's status fields; None when it is not one."""
    return _decode(data, NodeOutcome)


def decode_summary(data: Union[bytes, str, dict, None]) -> Optional[Summary]:
    """Our typed view of a final summary (ours or traceml-ai's); None when it is not one."""
    return _decode(data, Summary)


def decode_failure(data: Union[bytes, str, dict, None]) -> Optional[FailureSection]:
    """Only the ``failure`` section of a final summary (None when absent, null or not readable)."""
    found = _decode(data, _FailureOnly)
    return found.failure if found is not None else None


def decode_validation(data: Union[bytes, str, dict, None]) -> Optional[ValidationSection]:
    """Only the ``validation`` section of a final summary (None when absent, null or not readable)."""
    found = _decode(data, _ValidationOnly)
    return found.validation if found is not None else None


def decode_step_time(data: Union[bytes, str, dict, None]) -> Any:
    """Only the ``step_time`` section of a final summary, as plain JSON values (None when absent or not readable).

    Its layout is the published one; ``core/straggler.py`` ``summary_window`` reads the per-rank rows from it.
    """
    found = _decode(data, _StepTimeOnly)
    return found.step_time if found is not None else None


def check_summary(payload: dict) -> dict:
    """Validate a summary payload against :class:`Summary` (raise ``msgspec.ValidationError``); return it."""
    msgspec.convert(payload, Summary)
    return payload


def encode(value: msgspec.Struct) -> bytes:
    """JSON bytes of a manifest/outcome/summary struct (unset fields left out)."""
    return _encoder.encode(value)


def to_builtins(value: msgspec.Struct) -> dict:
    """A struct as plain JSON-ready values (unset fields left out)."""
    return msgspec.to_builtins(value)
