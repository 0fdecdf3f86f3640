"""Step record v1: the one place that knows the field names of a record.

A JSONL file under ``ranks/rank_<r>/steps-<attempt>.jsonl`` (or
``nodes/node_<k>/system.jsonl``) starts with a header line that makes the
file unique, followed by one JSON object per line:

* ``header``      — ``v, kind, run, rank, attempt, uuid, ts`` (+ ``node_rank``, ``world_size``)
* ``step``        — one completed optimizer step (see :class:`Step`)
* ``eval``        — an evaluation observation (``role``, ``checkpoint``, ``split``, ``metrics``, ``status``)
* ``checkpoint``  — a published checkpoint (``id``, ``path`` relative to the run dir, ``step``)
* ``field_stats`` — latent-field distribution QC (``name``, ``space``, ``median``, ``p_low``, ``p_high``,
  ``occupancy``, percentile levels ``q_low``/``q_high``, bounds ``lower``/``upper``, ``count``, ``factor``)
* ``rank_end``    — the rank finished: ``status`` ``exited`` (the script returned; the SDK
  cannot see ``sys.exit(n)``, so ``exit_code`` is null), ``completed`` (``traceml.finish()``),
  ``failed`` (an uncaught exception) or ``interrupted`` (Ctrl-C); the word each stands for is
  decided by :func:`traceml_tui.core.state.rank_end_state`
* ``unmeasured``  — a stream this rank does not measure and why (``stream``, ``reason``): written
  once per stream per rank session by :func:`traceml_tui.sdk.report_unmeasured` (a trainer
  integration that could not attach, a phase it cannot split); ``stream`` is one of
  :data:`UNMEASURED_STREAMS` or ``all`` (nothing is measured); both strings are bounded
* ``system``      — one node sample in ``system.jsonl`` (see :class:`SystemSample`)
* ``hang``        — written once per hang by the rank's watchdog thread when a step overran (see :class:`Hang`):
  where the main thread is (innermost frames first) and whether it waits in a ``torch.distributed`` collective

Conventions: ``step`` counts completed steps from 1; ``ts`` is wall-clock
seconds at step end; timings are milliseconds; a phase that was not measured is
``null`` (never a fabricated 0); non-finite floats are written as ``null``.
Readers keep unknown keys (forward compatible); a new major shape bumps ``v``.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Optional, Union

import msgspec

from traceml_tui.core.bounds import Int64

RECORD_VERSION = 1
MAX_LINE_BYTES = 1 << 20  # readers refuse longer lines (docs/daemon.md, rule 4)

#: Phases timed on each clock, in the order they happen within a step; then the loader
#: waits measured inside them (``data_wait`` within ``input_wait``, ``data_in_step`` within ``step``).
PHASES: tuple[str, ...] = ("step", "input_wait", "h2d", "forward", "backward", "optimizer", "data_wait", "data_in_step")


class Phases(msgspec.Struct, omit_defaults=False, gc=False):
    """Per-phase timings on one clock, in milliseconds; ``None`` = not measured.

    ``step`` is the traced envelope and ``input_wait`` the whole gap since the
    previous step's end (null for an attempt's first step). ``data_wait`` is the
    part of that gap spent in ``next()`` of an instrumented loader and
    ``data_in_step`` the loader time inside the traced envelope; both are null
    when no instrumented loader fed the step, and both are CPU measurements (the
    GPU record repeats them). How a step splits into parts is
    :mod:`traceml_tui.core.steptime`'s, nobody else's.
    """

    step: Optional[float] = None
    input_wait: Optional[float] = None
    h2d: Optional[float] = None
    forward: Optional[float] = None
    backward: Optional[float] = None
    optimizer: Optional[float] = None
    data_wait: Optional[float] = None
    data_in_step: Optional[float] = None


class Memory(msgspec.Struct, gc=False):
    """Process memory at step end, in bytes."""

    rss: Optional[int] = None
    cuda_peak_allocated: Optional[int] = None
    cuda_peak_reserved: Optional[int] = None


class Component(msgspec.Struct, gc=False):
    """One loss component, scale-free (seed 004).

    ``target_ms`` is the mean square of the component's own target and
    ``ratio = value / target_ms``: 1.0 is what predicting zero scores.
    ``weighted = weight * value`` is its contribution to the total loss.
    """

    value: Optional[float]
    weight: float = 1.0
    weighted: Optional[float] = None
    target_ms: Optional[float] = None
    ratio: Optional[float] = None


class Header(msgspec.Struct, tag="header", tag_field="kind"):
    v: int
    run: str
    rank: int
    attempt: int
    uuid: str
    ts: float
    node_rank: Optional[int] = None
    world_size: Optional[int] = None
    stream: str = "steps"  # "steps" (rank file) or "system" (node file)


class Step(msgspec.Struct, tag="step", tag_field="kind", gc=False):
    v: int
    run: str
    rank: int
    attempt: int
    step: int
    ts: float
    cpu_ms: Phases = msgspec.field(default_factory=Phases)
    gpu_ms: Optional[Phases] = None
    loss: Optional[float] = None
    lr: Optional[float] = None
    grad_norm: Optional[float] = None
    examples: Optional[int] = None
    mem: Optional[Memory] = None
    components: Optional[dict[str, Component]] = None
    metrics: Optional[dict[str, Optional[float]]] = None  # task metrics on training data


class Eval(msgspec.Struct, tag="eval", tag_field="kind"):
    v: int
    run: str
    rank: int
    attempt: int
    step: int
    ts: float
    role: str = "eval"
    checkpoint: Optional[str] = None
    split: Optional[str] = None
    metrics: dict[str, Optional[float]] = msgspec.field(default_factory=dict)
    status: str = "completed"  # completed | pending | failed


class Checkpoint(msgspec.Struct, tag="checkpoint", tag_field="kind"):
    v: int
    run: str
    rank: int
    attempt: int
    step: int
    ts: float
    id: str = ""
    path: Optional[str] = None


class FieldStats(msgspec.Struct, tag="field_stats", tag_field="kind"):
    v: int
    run: str
    rank: int
    attempt: int
    step: int
    ts: float
    name: str = ""
    space: str = "linear"  # "linear" | "log": the space the statistics are computed in
    median: Optional[float] = None
    p_low: Optional[float] = None
    p_high: Optional[float] = None
    occupancy: Optional[float] = None  # fraction of values at (or beyond) a declared bound
    q_low: float = 5.0  # percentile levels of p_low / p_high
    q_high: float = 95.0
    lower: Optional[float] = None  # declared bounds, in the field's natural units
    upper: Optional[float] = None
    count: Optional[int] = None  # finite values that entered the statistics
    factor: Optional[float] = None  # predeclared collapse factor: spread < factor x initial spread fails


class RankEnd(msgspec.Struct, tag="rank_end", tag_field="kind"):
    v: int
    run: str
    rank: int
    attempt: int
    step: int
    ts: float
    status: str = "completed"
    exit_code: Optional[int] = None


class Frame(msgspec.Struct, gc=False):
    """One frame of a stack: ``file`` relative to the script's folder or to the import root that holds it
    (``torch/distributed/distributed_c10d.py``), else a bare file name — never absolute; ``func`` the
    function the frame runs; ``call`` the dotted name of the call it is in (``time.sleep``) when the source
    shows it; ``user``: the file is under the script's folder (the training code, not a library)."""

    file: str
    line: int
    func: str
    call: Optional[str] = None
    user: bool = False


class Hang(msgspec.Struct, tag="hang", tag_field="kind"):
    """Where a rank's main thread was when its step overran (``sdk/watchdog.py``; docs/run.md "Hang forensics").

    ``step`` is the rank's newest completed step (it hangs in the next one);
    ``waited_s`` how long since that step ended, ``limit_s`` the overrun that
    fired the record and ``median_s`` the rank's typical step interval.
    ``collective`` names the ``torch.distributed`` function the main thread is
    inside (``all_reduce``, ``barrier``, …), or is null; ``seq`` is the default
    process group's collective sequence number (collectives issued so far,
    DDP's own included) when torch exposes it, else null. ``stack`` holds the
    innermost frames first.
    """

    v: int
    run: str
    rank: int
    attempt: int
    step: int
    ts: float
    waited_s: Optional[float] = None
    limit_s: Optional[float] = None
    median_s: Optional[float] = None
    collective: Optional[str] = None
    seq: Optional[int] = None
    stack: list[Frame] = msgspec.field(default_factory=list)


#: The streams an ``unmeasured`` record may name (others are kept: a newer writer may know more);
#: ``all`` says the integration could not attach at all.
UNMEASURED_STREAMS: tuple[str, ...] = (
    "all", "input_wait", "forward", "backward", "optimizer", "loss", "lr", "grad_norm", "examples", "eval",
    "checkpoints",
)
#: Longest ``stream`` / ``reason`` an ``unmeasured`` record may carry (characters); writers cut, readers refuse.
MAX_STREAM_CHARS = 40
MAX_REASON_CHARS = 300


class Unmeasured(msgspec.Struct, tag="unmeasured", tag_field="kind"):
    """A stream this rank cannot measure, and why: written once per ``stream`` per rank session."""

    v: int
    run: str
    rank: int
    attempt: int
    ts: float
    stream: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_STREAM_CHARS)]
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON_CHARS)] = ""


# A node sample's counts are 64-bit integers (core/bounds.py): JSON has no bound, and one sample's 400-digit
# ``ram_used`` made the summary's mean raise and the whole final summary go unwritten (found fuzzing); such a
# line is now a bad line, skipped like any other.
class GpuSample(msgspec.Struct):
    index: Int64
    util_pct: Optional[float] = None
    mem_used: Optional[Int64] = None
    mem_total: Optional[Int64] = None
    temp_c: Optional[float] = None
    power_w: Optional[float] = None


class SystemSample(msgspec.Struct, tag="system", tag_field="kind"):
    v: int
    run: str
    node_rank: Int64
    ts: float
    cpu_pct: Optional[float] = None
    ram_used: Optional[Int64] = None
    ram_total: Optional[Int64] = None
    gpus: list[GpuSample] = msgspec.field(default_factory=list)


Record = Union[Header, Step, Eval, Checkpoint, FieldStats, RankEnd, Unmeasured, SystemSample, Hang]


# Step records and their parts are ``gc=False``: they never form reference cycles, and a
# block of 10k decoded records then creates no objects the cyclic garbage collector has
# to track (most of what bulk decoding in the daemon used to cost). The daemon's names:
LeanStep = Step
LeanRecord = Record

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)


class RecordError(ValueError):
    """A line that is not a valid v1 record; ``str()`` is one plain sentence."""


def finite_or_none(value: Any) -> Optional[float]:
    """Return ``value`` as a float, or ``None`` for missing/non-finite values."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # an integer beyond a float's range too (core/jsonsafe.py)
        return None
    return number if math.isfinite(number) else None


def encode(record: Record) -> bytes:
    """Encode one record as a JSON line (trailing ``\\n``). Non-finite floats become null."""
    return _encoder.encode(record) + b"\n"


def decode(line: bytes | str) -> Record:
    """Decode and validate one line into a typed record.

    Raises :class:`RecordError` for malformed JSON, a non-object, an unknown
    kind or a field of the wrong type. Unknown *keys* are ignored, so newer
    writers stay readable.
    """
    if isinstance(line, str):
        line = line.encode("utf-8")
    if len(line) > MAX_LINE_BYTES:
        raise RecordError(f"line of {len(line)} bytes exceeds the {MAX_LINE_BYTES}-byte limit")
    try:
        return _decoder.decode(line)
    except msgspec.ValidationError as exc:
        raise RecordError(f"invalid record: {exc}") from None
    except msgspec.DecodeError as exc:
        raise RecordError(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise RecordError("JSON nested too deeply") from None
