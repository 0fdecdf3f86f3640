"""A step repeated within one (run, rank, attempt): the first copy is the row kept, and every series folds that
copy only (docs/daemon.md rule 2: rows unique on (run, rank, attempt, step), the first line wins).

A repeated step is malformed input, so the records are written by hand here: repeats with other loss, lr,
grad_norm and step times, and other loss components (a component only the later copy has, a null ratio the
later copy fills in, a first copy without any). The same files are read by a real ``--once`` ingest (the cold
path) and by a real live ingester pass after pass (appends of new steps, repeats of stored ones, repeats
within one append), each into its own SQLite index; the series of both (``step_ms``, ``loss``, ``lr``,
``grad_norm`` and ``ratio/<component>``) must equal a fresh fold of the kept rows, computed here from the
records themselves, and each rank row (``rank_live``) shows its newest kept row's time and loss, and ratios of
a kept row.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.service import Ingester
from traceml_tui.core import records

from support.daemon_files import append_raw, header_line, steps_path

_RUN = "rep"
_METRICS = ("step_ms", "loss", "lr", "grad_norm")


def _rec(rank: int, step: int, salt: int, comps: dict | None) -> records.Step:
    """A step record whose values depend on ``salt`` (a repeat differs from its first copy); ``comps`` maps a
    component name to its ratio (None: a null ratio)."""
    ms = 50.0 + 7 * salt + step
    return records.Step(
        v=1, run=_RUN, rank=rank, attempt=0, step=step, ts=1000.0 + step + salt / 100,
        cpu_ms=records.Phases(step=ms, input_wait=1.0 + salt), loss=1.0 / step + salt, lr=1e-3 * (1 + salt),
        grad_norm=0.5 + salt, examples=32 * step,
        components=None if comps is None else {
            name: records.Component(value=r, target_ms=1.0, ratio=r) for name, r in comps.items()})


def _expected(recs: list[records.Step]) -> tuple[dict, dict]:
    """A fresh fold of the kept rows (the first copy of each (rank, step)): the wide series per (rank, bucket,
    metric) and the ``ratio/<name>`` series per (rank, metric, bucket), as (step_lo, step_hi, min, max, sum, n).
    Steps stay within one bucket width (≤ 512 steps: bucket = step - 1)."""
    kept: dict[tuple[int, int], records.Step] = {}
    for r in recs:
        kept.setdefault((r.rank, r.step), r)
    wide: dict = {}
    extra: dict = {}

    def put(table, key, step, value):
        if value is None:
            return
        lo, hi, vmin, vmax, vsum, n = table.get(key, (step, step, value, value, 0.0, 0))
        table[key] = (min(lo, step), max(hi, step), min(vmin, value), max(vmax, value), vsum + value, n + 1)

    for (rank, step), r in kept.items():
        assert step <= 512
        values = {"step_ms": r.cpu_ms.step + r.cpu_ms.input_wait, "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm}
        for m in _METRICS:
            put(wide, (rank, step - 1, m), step, values[m])
        for name, c in (r.components or {}).items():
            put(extra, (rank, "ratio/" + name, step - 1), step, c.ratio)
    return wide, extra


def _series(index: Path) -> tuple[dict, dict]:
    """What an index holds in the same shape as :func:`_expected` (metrics with no value left out)."""
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        wide = {}
        cols = ", ".join(f"{m}_min, {m}_max, {m}_sum, {m}_n" for m in _METRICS)
        for row in conn.execute(f"SELECT rank, bucket, step_lo, step_hi, {cols} FROM series"):
            rank, bucket, lo, hi = row[:4]
            for j, m in enumerate(_METRICS):
                vmin, vmax, vsum, n = row[4 + 4 * j: 8 + 4 * j]
                if n:
                    wide[(rank, bucket, m)] = (lo, hi, vmin, vmax, vsum, n)
        extra = {(r[0], r[1], r[2]): tuple(r[3:]) for r in conn.execute(
            "SELECT rank, metric, bucket, step_lo, step_hi, vmin, vmax, vsum, n FROM series_extra")}
        return wide, extra
    finally:
        conn.close()


def _assert_same(got: dict, want: dict, what: str) -> None:
    """Same keys; the same values (the wide series of a step time read back from the index may differ by the
    index's microsecond rounding)."""
    assert sorted(got) == sorted(want), what
    for key in want:
        g, w = got[key], want[key]
        assert g[:2] == w[:2] and g[5] == w[5], (what, key, g, w)
        assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-3) for a, b in zip(g[2:5], w[2:5])), (what, key, g, w)


def _stored_rows(index: Path) -> dict:
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        return {(r[0], r[1]): r[2:] for r in conn.execute("SELECT rank, step, loss, lr, grad_norm FROM steps")}
    finally:
        conn.close()


def _rank_rows(index: Path) -> dict:
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        return {r[0]: (r[1], r[2], r[3], json.loads(r[4]) if r[4] else None) for r in conn.execute(
            "SELECT rank, last_step, last_ts, loss, ratios FROM rank_live")}
    finally:
        conn.close()


def _kept_ratios(r: records.Step):
    """The ratios a rank row shows for the kept row ``r`` (its non-null ones; None without any)."""
    got = {name: c.ratio for name, c in (r.components or {}).items() if c.ratio is not None}
    return got or None


def _cold(index: Path, root: Path) -> None:
    ing = Ingester(index, [str(root)], use_inotify=False)
    try:
        ing.run_once()
    finally:
        ing.close()


def _live(index: Path, root: Path, passes: list[list[tuple[Path, bytes]]]) -> None:
    """A live ingester (the live daemon's settings) reading ``passes``: each a list of appends made before it."""
    ing = Ingester(index, [str(root)], use_inotify=False)
    ing.open()
    try:
        ing.live_settings()
        ing.store.live.merge_every = math.inf  # merged at the end: the repeats meet rows still waiting
        for appends in passes:
            for path, data in appends:
                append_raw(path, data)
            ing.scan()
            ing.poll(ing.plan.everything())
            ing.commit_pass()
        ing.merge_live()
    finally:
        ing.close()


def _check(tmp: Path, passes: list[list[tuple[int, records.Step]]], exact_ratios: bool = False) -> None:
    """Write ``passes`` (per pass, (rank, record) appends) live, then ingest the same files cold; both indexes'
    series equal the fold of the kept rows, and the stored rows are the first copies."""
    root = tmp / "logs"
    paths = {rank: steps_path(root / _RUN, rank) for rank in {rank for p in passes for rank, _ in p}}
    recs = [r for p in passes for _, r in p]
    started: set = set()
    live_passes = []
    for p in passes:
        by_path: dict[Path, bytes] = {}
        for rank, r in p:
            path = paths[rank]
            if rank not in started:  # a stream's header comes with its first steps
                started.add(rank)
                by_path[path] = header_line(_RUN, rank)
            by_path[path] = by_path.get(path, b"") + records.encode(r)
        live_passes.append(list(by_path.items()))
    _live(tmp / "live.sqlite", root, live_passes)
    _cold(tmp / "cold.sqlite", root)
    want_wide, want_extra = _expected(recs)
    kept_recs: dict = {}
    for r in recs:
        kept_recs.setdefault((r.rank, r.step), r)
    kept = {key: (r.loss, r.lr, r.grad_norm) for key, r in kept_recs.items()}
    newest = {}  # per rank: its newest kept row, and its newest kept row with components
    for (rank, _), r in sorted(kept_recs.items()):
        newest[rank] = (r, r if r.components else newest.get(rank, (None, None))[1])
    for name in ("cold", "live"):
        index = tmp / f"{name}.sqlite"
        got_rows = _stored_rows(index)
        assert sorted(got_rows) == sorted(kept), name
        for key, values in kept.items():
            assert got_rows[key] == pytest.approx(values), (name, key)
        wide, extra = _series(index)
        _assert_same(extra, want_extra, f"{name}: ratio series")
        _assert_same(wide, want_wide, f"{name}: wide series")
        # The rank rows: the newest step's values are its kept copy's, and the ratios shown are a kept row's
        # (exactly the newest kept row's with components where the passes say it is within every tail).
        rank_rows = _rank_rows(index)
        assert sorted(rank_rows) == sorted(newest), name
        for rank, (last_step, last_ts, loss, ratios) in rank_rows.items():
            top, with_components = newest[rank]
            assert (last_step, last_ts, loss) == pytest.approx((top.step, top.ts, top.loss)), (name, rank)
            if exact_ratios:
                assert ratios == (_kept_ratios(with_components) if with_components else None), (name, rank)
            else:
                assert ratios is None or any(ratios == _kept_ratios(r) for (k, _), r in kept_recs.items()
                                             if k == rank and r.components), (name, rank, ratios)


def test_repeated_steps_fold_the_first_copy_cold_and_live(tmp_path):
    """Repeats within one append, repeats of stored steps in a later append, with other values and other
    components; one rank with more rows than a live append's fold (the cold path's own fold), one with few."""
    many = [(0, _rec(0, s, 0, {"mse": 0.01 * s} if s % 3 else None)) for s in range(1, 101)]
    passes = [
        many + [
            (1, _rec(1, 1, 0, {"mse": 0.3})),
            (1, _rec(1, 2, 0, {"kl": None})),
            (1, _rec(1, 3, 0, None)),
            (1, _rec(1, 2, 1, {"kl": 0.7, "mse": 0.9})),  # a repeat: a ratio for a null one, another component
            (1, _rec(1, 3, 1, {"mse": 0.2})),  # a repeat with components where the first copy had none
            (1, _rec(1, 4, 0, {"mse": 0.4})),
            (0, _rec(0, 50, 2, {"mse": 5.0, "kl": 6.0})),  # a repeat in the middle of a long block
        ],
        [  # repeats of stored steps, and of steps waiting in the live table, beside new ones
            (1, _rec(1, 1, 2, {"mse": 0.8, "kl": 0.1})),
            (1, _rec(1, 5, 0, {"mse": 0.5})),
            (1, _rec(1, 4, 3, {"kl": 0.9})),
            (0, _rec(0, 99, 3, {"mse": 9.0, "kl": 9.0})),
            (0, _rec(0, 101, 0, None)),
        ],
        [  # repeats within one append past every stored step, the newest step's among them
            (1, _rec(1, 6, 0, {"mse": 0.6})),
            (1, _rec(1, 7, 0, {"mse": 0.7})),
            (1, _rec(1, 6, 4, {"mse": 0.1, "kl": 0.2})),
            (1, _rec(1, 7, 5, {"kl": 0.3})),
        ],
        [  # an append of nothing but a repeat of the newest step, with other values and components
            (1, _rec(1, 7, 6, {"mse": 7.7})),
            (0, _rec(0, 101, 7, {"mse": 1.5})),
        ],
    ]
    _check(tmp_path, passes, exact_ratios=True)


_comps = st.one_of(st.none(), st.dictionaries(st.sampled_from(["mse", "kl"]),
                                               st.one_of(st.none(), st.floats(0.0, 10.0)), max_size=2))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(passes=st.lists(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 12), _comps), min_size=1, max_size=8),
                       min_size=1, max_size=4))
def test_any_repeats_fold_the_first_copy(tmp_path_factory, passes):
    """Random streams with repeated steps, in random passes: the cold series equal the live series equal the
    fold of the kept rows."""
    tmp = tmp_path_factory.mktemp("rep")
    salt = iter(range(10_000))
    _check(tmp, [[(rank, _rec(rank, step, next(salt), comps)) for rank, step, comps in p] for p in passes])
