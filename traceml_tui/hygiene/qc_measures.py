"""Health measures saved beside every QC figure (seed 004: "coverage, concentration, diversity").

A figure that looks plausible can still show three sources over and over, or one
near-identical example in every tile. These numbers make that visible next to
the pixels, in the figure's JSON (``measures``) and on the Trackio dashboard
(docs/qc.md, "Health measures"). Pure functions of the figure's source ids and
tile pixels; the renderers (``gallery.py``, ``batch_grid.py``) call
:func:`figure_measures` and nothing recomputes them elsewhere.

* **coverage** — distinct sources shown / eligible sources (in [0, 1]; ``None``
  when nothing is eligible: an empty group has no coverage, not a zero one);
* **concentration** — of the per-source tile counts: the share of the ``top_k``
  most shown sources, the Gini coefficient (0 = every source shown equally
  often) and the entropy normalized by ``log(distinct)`` (1 = even);
* **diversity** — the mean pairwise distance between the examples: a declared
  distance function, or by default the RMS difference of 16 x 16 RGB
  thumbnails in [0, 1] pixel space (0 = all tiles identical).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable, Optional, Sequence

#: The k of the top-k share.
DEFAULT_TOP_K = 5
#: Thumbnail side of the pixel-space default distance (a coarse look: layout and intensity, not noise).
THUMBNAIL = 16
#: Pairwise distances are taken over at most this many examples (evenly spaced), so a large figure stays cheap.
MAX_DIVERSITY_EXAMPLES = 256
PIXEL_DISTANCE = "pixel_rms_16x16"


def coverage(sources: Sequence[str], eligible: Optional[int] = None) -> dict[str, Any]:
    """``{distinct, eligible, value}``: distinct sources over the eligible ones.

    ``eligible`` defaults to the distinct count (a figure that shows every
    eligible source). Fewer eligible than distinct sources shown is a
    contradiction and raises ``ValueError``.
    """
    distinct = len(set(sources))
    total = distinct if eligible is None else int(eligible)
    if total < distinct:
        raise ValueError(f"{distinct} distinct sources shown but only {total} eligible")
    return {"distinct": distinct, "eligible": total, "value": (distinct / total) if total else None}


def gini(counts: Sequence[float]) -> Optional[float]:
    """Gini coefficient of non-negative counts in [0, 1) (0 = all equal); ``None`` without a positive total."""
    values = sorted(float(c) for c in counts)
    n = len(values)
    total = sum(values)
    if n == 0 or total <= 0:
        return None
    # sum_i (2i - n - 1) x_(i) / (n * total): the sorted form of mean |x_i - x_j| / (2 mean)
    weighted = sum((2 * i - n - 1) * x for i, x in enumerate(values, start=1))
    return min(1.0, max(0.0, weighted / (n * total)))


def normalized_entropy(counts: Sequence[float]) -> Optional[float]:
    """Shannon entropy of the count distribution over ``log(n)`` in [0, 1]; 1.0 for a single source."""
    positive = [float(c) for c in counts if c > 0]
    total = sum(positive)
    if not positive:
        return None
    if len(positive) == 1:
        return 1.0  # one source is perfectly even over itself; concentration shows in coverage and top-k
    h = -sum((c / total) * math.log(c / total) for c in positive)
    return min(1.0, max(0.0, h / math.log(len(positive))))


def concentration(sources: Sequence[str], top_k: int = DEFAULT_TOP_K) -> dict[str, Any]:
    """``{top_k, top_k_share, gini, entropy}`` of how often each source is shown."""
    if top_k < 1:
        raise ValueError("top_k must be >= 1")
    counts = sorted(Counter(sources).values(), reverse=True)
    total = sum(counts)
    return {
        "top_k": int(top_k),
        "top_k_share": (sum(counts[:top_k]) / total) if total else None,
        "gini": gini(counts),
        "entropy": normalized_entropy(counts),
    }


def _spread_indices(n: int, limit: int) -> list[int]:
    if n <= limit:
        return list(range(n))
    return sorted({round(i * (n - 1) / (limit - 1)) for i in range(limit)})


def pixel_diversity(thumbnails: Any) -> Optional[float]:
    """Mean pairwise RMS difference of equally sized thumbnails with values in [0, 1]; ``None`` for < 2."""
    import numpy as np

    x = np.asarray(thumbnails, dtype=np.float64)
    n = x.shape[0] if x.ndim else 0
    if n < 2:
        return None
    x = x.reshape(n, -1)[_spread_indices(n, MAX_DIVERSITY_EXAMPLES)]
    sq = np.sum(x * x, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0) / x.shape[1]
    m = x.shape[0]
    upper = np.sqrt(d2[np.triu_indices(m, k=1)])
    return float(min(1.0, max(0.0, upper.mean())))


def declared_diversity(items: Sequence[Any], distance: Callable[[Any, Any], float]) -> Optional[float]:
    """Mean of a declared ``distance(a, b)`` over pairs of items; ``None`` for < 2 items.

    A distance that returns a negative or non-finite value is a broken declaration: ``ValueError``.
    """
    picked = [items[i] for i in _spread_indices(len(items), MAX_DIVERSITY_EXAMPLES)]
    if len(picked) < 2:
        return None
    total, pairs = 0.0, 0
    for i in range(len(picked)):
        for j in range(i + 1, len(picked)):
            d = float(distance(picked[i], picked[j]))
            if not math.isfinite(d) or d < 0:
                raise ValueError(f"the declared distance returned {d!r}: it must be a finite number >= 0")
            total += d
            pairs += 1
    return total / pairs


def figure_measures(sources: Sequence[str], *, eligible: Optional[int] = None, thumbnails: Any = None,
                    items: Optional[Sequence[Any]] = None, distance: Optional[Callable[[Any, Any], float]] = None,
                    distance_name: Optional[str] = None, top_k: int = DEFAULT_TOP_K) -> dict[str, Any]:
    """The ``measures`` object of one figure (or one gallery group): coverage, concentration, diversity.

    ``sources``: one source id per tile (repeats allowed: they are what
    concentration measures). Diversity uses ``distance`` over ``items`` when
    declared (recorded by ``distance_name`` or the function's name), else the
    pixel-space default over ``thumbnails``.
    """
    if distance is not None:
        value = declared_diversity(list(items or ()), distance)
        name = distance_name or getattr(distance, "__name__", None) or "declared"
    else:
        value = pixel_diversity(thumbnails) if thumbnails is not None and len(thumbnails) else None
        name = PIXEL_DISTANCE
    return {
        "tiles": len(sources),
        "coverage": coverage(sources, eligible),
        "concentration": concentration(sources, top_k),
        "diversity": {"distance": name, "value": value},
    }


def headline(measures: dict[str, Any]) -> dict[str, Optional[float]]:
    """The scalar measures of one ``measures`` object, by name (what the Trackio export charts).

    It is read back from a figure's JSON, so any part may be malformed: a part
    that is not an object gives ``None`` values (the export then sends nothing for them).
    """
    def part(name: str) -> dict:
        value = measures.get(name) if isinstance(measures, dict) else None
        return value if isinstance(value, dict) else {}

    cov, conc, div = part("coverage"), part("concentration"), part("diversity")
    return {
        "coverage": cov.get("value"),
        "top_k_share": conc.get("top_k_share"),
        "gini": conc.get("gini"),
        "entropy": conc.get("entropy"),
        "diversity": div.get("value"),
    }
