"""Step time and its parts: the one definition every surface uses.

Textual-free, torch-free and numpy-free. The summary, the daemon's series,
the TUI and ``traceml compare`` all split a step with :func:`step_parts` /
:func:`split_step` and average with :func:`average_parts`, and label the parts
from :data:`PARTS`, so a part has one name and one value everywhere.

Per step, on one clock (milliseconds)::

    step time = input_wait + traced           time from the previous step's end to this step's end
              = data_wait + between_steps     the gap since the previous step's end (input_wait)
              + h2d + forward + backward + optimizer + residual      the traced envelope

* ``data_wait`` — time in ``next()`` of an instrumented loader (a
  ``torch.utils.data.DataLoader``, or an iterable passed to
  ``traceml.wrap_loader`` / iterated inside ``traceml.trace_loader``): the
  record's ``data_wait`` (in the gap) plus ``data_in_step`` (inside the traced
  step). Without an instrumented loader it is 0 and not *measured*.
* ``between_steps`` — the rest of the gap: work outside the traced step
  (checkpoint writes, logging, evaluation, an uninstrumented data source).
* ``residual`` — traced time not covered by a measured phase (all of the traced
  step when no model was passed to ``trace_step``).

Rules, applied identically everywhere:

* every part is ≥ 0 and the parts sum to the step time (to float rounding);
* a negative or non-finite timing counts as 0 / not measured;
* loader wait in the gap is capped at the gap (on the GPU clock the CPU-measured
  loader wait is capped at the GPU gap: a wait the device did not see costs it nothing);
* when the measured phases inside the traced step exceed the traced envelope
  (clock jitter, overlapping events), they are scaled down in proportion so they
  sum to the envelope and the residual is 0;
* an attempt's first step has no previous step end: its gap is unknown, so its
  step time is its traced time and its ``data_wait`` (in the gap) and
  ``between_steps`` are 0 (a loader wait inside its traced step still counts);
* averages of the parts and of the whole are taken over the same steps; a part
  that was measured in none of them averages to ``None`` (never a fabricated
  0), a part measured in only some steps counts 0 in the others.

``step_time_ms`` in ``final_summary.json`` (the figure ``traceml compare``
judges) is the average of the whole, i.e. input wait + traced step as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Optional

#: The parts of a step, in the order they happen, with their display labels.
PARTS: tuple[tuple[str, str], ...] = (
    ("data_wait", "Data wait"),
    ("between_steps", "Between steps"),
    ("h2d", "H2D"),
    ("forward", "Forward"),
    ("backward", "Backward"),
    ("optimizer", "Optimizer"),
    ("residual", "Residual"),
)
PART_NAMES: tuple[str, ...] = tuple(name for name, _ in PARTS)
PART_LABELS: dict[str, str] = dict(PARTS)
#: Label of the whole.
STEP_LABEL = "Step time"
#: Parts that are model compute (``compute_ms`` in the summary).
COMPUTE_PARTS: tuple[str, ...] = ("forward", "backward", "optimizer")


def metric_name(part: str) -> str:
    """The summary / compare metric name of a part (``between_steps`` → ``between_steps_ms``)."""
    return part + "_ms"


_MEASURED_CACHE: dict[int, frozenset] = {}


def _measured(mask: int) -> frozenset:
    found = _MEASURED_CACHE.get(mask)
    if found is None:
        found = frozenset(name for i, name in enumerate(PART_NAMES) if mask >> i & 1)
        _MEASURED_CACHE[mask] = found
    return found


_BIT = {name: 1 << i for i, name in enumerate(PART_NAMES)}
_DATA, _BETWEEN, _H2D, _FORWARD, _BACKWARD, _OPTIMIZER, _RESIDUAL = (_BIT[name] for name in PART_NAMES)


class StepParts(NamedTuple):
    """One step on one clock, split into its parts (milliseconds; immutable).

    ``whole`` is the step time; the seven parts (``PART_NAMES`` order) are ≥ 0
    and sum to it. ``measured`` names the parts the record measured (the others
    are 0 by absence). ``gap_known`` is False for an attempt's first step.
    """

    whole: float
    traced: float
    data_wait: float
    between_steps: float
    h2d: float
    forward: float
    backward: float
    optimizer: float
    residual: float
    measured: frozenset
    gap_known: bool

    def parts(self) -> tuple[float, ...]:
        """The part values in :data:`PART_NAMES` order."""
        return (self.data_wait, self.between_steps, self.h2d, self.forward, self.backward, self.optimizer,
                self.residual)

    def value(self, part: str) -> float:
        return getattr(self, part)

    @property
    def input_wait(self) -> float:
        """The gap since the previous step's end (``data_wait`` in the gap + ``between_steps``)."""
        return self.whole - self.traced

    @property
    def compute(self) -> float:
        return self.forward + self.backward + self.optimizer

    def as_dict(self) -> dict[str, float]:
        """``{"step_time": whole, part: value, ...}``."""
        return {"step_time": self.whole, **dict(zip(PART_NAMES, self.parts()))}


def _clean(value: Any) -> Optional[float]:
    """A timing as a float ≥ 0; None when missing or not finite."""
    if value is None:
        return None
    if type(value) is float and 0.0 <= value < math.inf:  # the common case, kept cheap
        return value
    if type(value) is not float:
        if isinstance(value, bool):
            return None
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
    if value != value or value in (math.inf, -math.inf):
        return None
    return value if value > 0.0 else 0.0


def split_step(
    traced: Any,
    input_wait: Any = None,
    *,
    data_wait: Any = None,
    data_in_step: Any = None,
    h2d: Any = None,
    forward: Any = None,
    backward: Any = None,
    optimizer: Any = None,
) -> Optional[StepParts]:
    """Split one step from scalar timings (ms; ``None`` = not measured).

    ``traced`` is the traced envelope (the record's ``step``), ``input_wait`` the
    gap since the previous step's end (``None`` for an attempt's first step),
    ``data_wait`` the loader wait within that gap and ``data_in_step`` the loader
    wait inside the traced envelope. Returns ``None`` when ``traced`` is missing.
    About 1-2 µs per step.
    """
    return _split(traced, input_wait, data_wait, data_in_step, h2d, forward, backward, optimizer)


def _split(traced: Any, input_wait: Any, data_wait: Any, data_in_step: Any, h2d: Any, forward: Any, backward: Any,
           optimizer: Any) -> Optional[StepParts]:
    t = _clean(traced)
    if t is None:
        return None
    mask = _RESIDUAL
    gap = _clean(input_wait)
    if gap is None:
        data = between = 0.0
        whole = t
    else:
        mask |= _BETWEEN
        dw = _clean(data_wait)
        if dw is not None:
            mask |= _DATA
            data = dw if dw < gap else gap
        else:
            data = 0.0
        between = gap - data
        whole = t + gap
    total = 0.0
    ds = _clean(data_in_step)
    if ds is None:
        ds = 0.0
    else:
        mask |= _DATA
        total += ds
    hd = _clean(h2d)
    if hd is None:
        hd = 0.0
    else:
        mask |= _H2D
        total += hd
    fw = _clean(forward)
    if fw is None:
        fw = 0.0
    else:
        mask |= _FORWARD
        total += fw
    bw = _clean(backward)
    if bw is None:
        bw = 0.0
    else:
        mask |= _BACKWARD
        total += bw
    op = _clean(optimizer)
    if op is None:
        op = 0.0
    else:
        mask |= _OPTIMIZER
        total += op
    if total > t:  # clock jitter / overlapping events: scale the inner phases to the envelope
        scale = t / total
        ds, hd, fw, bw, op = ds * scale, hd * scale, fw * scale, bw * scale, op * scale
        residual = 0.0
    else:
        residual = t - total
    measured = _MEASURED_CACHE.get(mask)
    if measured is None:
        measured = _measured(mask)
    return StepParts(whole, t, data + ds, between, hd, fw, bw, op, residual, measured, gap is not None)


def step_parts(phases: Any) -> Optional[StepParts]:
    """Split one record's timings on one clock (``Step.cpu_ms`` or ``Step.gpu_ms``).

    Accepts a :class:`traceml_tui.core.records.Phases` (or anything with the same
    attributes; missing ones count as not measured). ``None`` when ``phases`` is
    None or has no traced time.
    """
    if phases is None:
        return None
    try:
        return _split(phases.step, phases.input_wait, phases.data_wait, phases.data_in_step, phases.h2d,
                      phases.forward, phases.backward, phases.optimizer)
    except AttributeError:
        get = getattr
        return _split(get(phases, "step", None), get(phases, "input_wait", None), get(phases, "data_wait", None),
                      get(phases, "data_in_step", None), get(phases, "h2d", None), get(phases, "forward", None),
                      get(phases, "backward", None), get(phases, "optimizer", None))


@dataclass(frozen=True)
class PartsAverage:
    """Averages of the whole and of each part over the same steps, and each part's share.

    ``parts[name]`` is the average in ms (``None`` when no step measured that
    part); ``shares[name]`` is its percentage of ``whole`` (``None`` when the
    part was not measured or the whole is 0). Measured parts sum to ``whole``
    and every share is within [0, 100]. ``steps_without_gap`` counts the steps
    whose gap was unknown (an attempt's first step: its traced time only).
    """

    steps: int
    whole: float
    traced: float
    parts: dict
    shares: dict
    steps_without_gap: int = 0

    @property
    def input_wait(self) -> float:
        return self.whole - self.traced

    @property
    def compute(self) -> Optional[float]:
        values = [self.parts[p] for p in COMPUTE_PARTS if self.parts[p] is not None]
        return sum(values) if values else None

    def rows(self) -> list[tuple[str, str, Optional[float], Optional[float]]]:
        """``(name, label, average ms, share %)`` per part, in :data:`PARTS` order."""
        return [(name, label, self.parts[name], self.shares[name]) for name, label in PARTS]


def average_parts(items: Iterable[Optional[StepParts]]) -> Optional[PartsAverage]:
    """Average split steps (``None`` items are skipped); ``None`` when there are none."""
    n = no_gap = 0
    whole = traced = 0.0
    sums = [0.0] * len(PART_NAMES)
    mask: set = set()
    for item in items:
        if item is None:
            continue
        n += 1
        if not item.gap_known:
            no_gap += 1
        whole += item.whole
        traced += item.traced
        for i, value in enumerate(item.parts()):
            sums[i] += value
        mask |= item.measured
    if not n:
        return None
    avg_whole = whole / n
    parts: dict[str, Optional[float]] = {}
    shares: dict[str, Optional[float]] = {}
    for name, total in zip(PART_NAMES, sums):
        if name not in mask:
            parts[name] = shares[name] = None
            continue
        value = total / n
        parts[name] = value
        shares[name] = min(100.0, value / avg_whole * 100.0) if avg_whole > 0.0 else None
    return PartsAverage(n, avg_whole, traced / n, parts, shares, no_gap)
