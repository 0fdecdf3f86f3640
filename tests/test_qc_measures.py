"""Health measures beside QC figures (hygiene/qc_measures.py): properties of their contract (docs/qc.md)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceml_tui.hygiene import qc_measures as m

from support.lanes import examples

#: the machine may be loaded: generation speed is not what these tests check
LOADED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOURCES = st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=3), max_size=60)
COUNTS = st.lists(st.integers(min_value=0, max_value=1000), max_size=50)


@LOADED
@given(SOURCES, st.integers(min_value=0, max_value=40))
def test_coverage_is_distinct_over_eligible_in_unit_interval(sources: list[str], extra: int) -> None:
    distinct = len(set(sources))
    cov = m.coverage(sources, distinct + extra)
    assert cov["distinct"] == distinct and cov["eligible"] == distinct + extra
    if distinct + extra == 0:
        assert cov["value"] is None  # nothing eligible: no coverage, never a fabricated 0
    else:
        assert 0.0 <= cov["value"] <= 1.0
        assert cov["value"] == pytest.approx(distinct / (distinct + extra))
    if distinct:
        with pytest.raises(ValueError):
            m.coverage(sources, distinct - 1)  # fewer eligible than shown is a contradiction


@LOADED
@given(COUNTS)
def test_gini_is_in_unit_interval_zero_when_even_and_permutation_invariant(counts: list[int]) -> None:
    g = m.gini(counts)
    if sum(counts) == 0:
        assert g is None
        return
    assert 0.0 <= g <= 1.0
    shuffled = list(counts)
    random.Random(len(counts)).shuffle(shuffled)
    assert m.gini(shuffled) == pytest.approx(g, abs=1e-12)
    # scale invariance: the same proportions, twice the counts
    assert m.gini([2 * c for c in counts]) == pytest.approx(g, abs=1e-12)
    # the brute-force definition: mean absolute difference over twice the mean
    n, mean = len(counts), sum(counts) / len(counts)
    brute = sum(abs(a - b) for a in counts for b in counts) / (2 * n * n * mean)
    assert g == pytest.approx(brute, abs=1e-9)


@LOADED
@given(st.integers(min_value=1, max_value=30), st.integers(min_value=1, max_value=50))
def test_even_counts_have_zero_gini_and_full_entropy(n: int, c: int) -> None:
    assert m.gini([c] * n) == pytest.approx(0.0, abs=1e-12)
    assert m.normalized_entropy([c] * n) == pytest.approx(1.0)


@LOADED
@given(SOURCES, st.integers(min_value=1, max_value=10))
def test_concentration_bounds_monotone_top_k_and_permutation_invariance(sources: list[str], k: int) -> None:
    c = m.concentration(sources, k)
    if not sources:
        assert c["top_k_share"] is None and c["gini"] is None and c["entropy"] is None
        return
    assert 0.0 < c["top_k_share"] <= 1.0
    assert m.concentration(sources, k + 1)["top_k_share"] >= c["top_k_share"]
    if len(set(sources)) <= k:
        assert c["top_k_share"] == pytest.approx(1.0)
    assert 0.0 <= c["entropy"] <= 1.0
    shuffled = list(sources)
    random.Random(len(sources)).shuffle(shuffled)
    again = m.concentration(shuffled, k)
    assert again == pytest.approx(c)


def test_one_source_shown_over_and_over_is_concentrated() -> None:
    fair = m.concentration([f"s{i}" for i in range(16)], 1)
    skewed = m.concentration(["s0"] * 13 + ["s1", "s2", "s3"], 1)
    assert fair["gini"] == 0.0 and skewed["gini"] > 0.4
    assert skewed["top_k_share"] == pytest.approx(13 / 16) and fair["top_k_share"] == pytest.approx(1 / 16)
    assert skewed["entropy"] < fair["entropy"]


@settings(deadline=None, max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=2, max_value=12), st.integers(min_value=0, max_value=2**31 - 1))
def test_pixel_diversity_is_in_unit_interval_symmetric_and_zero_for_identical_tiles(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    thumbs = rng.random((n, m.THUMBNAIL, m.THUMBNAIL, 3))
    d = m.pixel_diversity(thumbs)
    assert 0.0 <= d <= 1.0
    assert m.pixel_diversity(thumbs[::-1]) == pytest.approx(d)  # order of the tiles does not matter
    assert m.pixel_diversity(np.repeat(thumbs[:1], n, axis=0)) == pytest.approx(0.0, abs=1e-6)
    # the fast (Gram matrix) form equals the pairwise definition
    flat = thumbs.reshape(n, -1)
    pairs = [np.sqrt(np.mean((flat[i] - flat[j]) ** 2)) for i in range(n) for j in range(i + 1, n)]
    assert d == pytest.approx(float(np.mean(pairs)), abs=1e-9)


def test_diversity_needs_two_examples_and_a_declared_distance_is_used_and_named() -> None:
    assert m.pixel_diversity(np.zeros((1, 4))) is None
    items = [0.0, 1.0, 3.0]

    def absolute(a: float, b: float) -> float:
        return abs(a - b)

    out = m.figure_measures(["a", "b", "c"], items=items, distance=absolute)
    assert out["diversity"] == {"distance": "absolute", "value": pytest.approx((1 + 3 + 2) / 3)}
    with pytest.raises(ValueError, match="declared distance"):
        m.figure_measures(["a", "b"], items=[0, 1], distance=lambda a, b: math.nan)
    default = m.figure_measures(["a", "b"], thumbnails=np.array([[0.0, 0.0], [1.0, 1.0]]))
    assert default["diversity"] == {"distance": m.PIXEL_DISTANCE, "value": pytest.approx(1.0)}


@LOADED
@given(SOURCES)
def test_headline_names_every_scalar_measure(sources: list[str]) -> None:
    out = m.figure_measures(sources, eligible=len(set(sources)) + 1)
    head = m.headline(out)
    assert set(head) == {"coverage", "top_k_share", "gini", "entropy", "diversity"}
    assert head["coverage"] == out["coverage"]["value"] and head["gini"] == out["concentration"]["gini"]
    assert out["tiles"] == len(sources)
