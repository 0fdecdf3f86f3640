"""The daemon's contract on damaged input, through the real ingester and a real SQLite index
(docs/daemon.md, "Damaged input"): no exception escapes, the other run is ingested whole, each valid line
is stored once, each bad line is one error row, and a damaged side file is at most one error row that
never stops its run's streams.

Streams start from lines of the committed real runs (``streams.py``); manifests, summaries and node
outcomes from real ones (the fixtures' manifest and summaries, an outcome built by the guard's own
``build_outcome``), then damaged: one value replaced by something out of every bound, a wrong type, a
key of any text, or the bytes cut short.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from daemon import sidefiles, status_cli
from daemon.reader import Reader
from traceml_tui.guard.outcome import build_outcome

from support.fuzz_streams import (
    CLEAN,
    CLEAN_STEPS,
    FIXTURES,
    damaged_lines,
    ingest,
    oracle,
    shifted_lines,
    stored,
    write_stream,
)

# Each example opens a fresh index: fewer of them than the pure properties (the ``long`` profile scales).
FEW = settings(max_examples=max(1, settings.default.max_examples // 3))


@FEW
@given(body=st.one_of(damaged_lines(max_lines=16), shifted_lines()))
def test_damaged_stream_stores_each_valid_line_once(body, caplog):
    caplog.set_level(logging.WARNING, logger="traceml.daemon")
    with tempfile.TemporaryDirectory() as tmp:
        root, index = Path(tmp) / "logs", Path(tmp) / "index.sqlite"
        write_stream(root / "fz", body)
        write_stream(root / "good", CLEAN)
        ingest(root, index, caplog)
        assert stored(index, root / "fz") == oracle(body)
        assert stored(index, root / "good") == (CLEAN_STEPS, 0)
        ingest(root, index, caplog)  # a restart reads nothing again
        assert stored(index, root / "fz") == oracle(body)


# ---------------------------------------------------------------------------------------- side files

NASTY = st.one_of(
    st.sampled_from([1 << 63, -(1 << 63) - 1, 1 << 64, 10 ** 30, -1, -5.0, 1e20, 1e308, -1e308, 0.5, True, None,
                     "", "\u00b2", "--1", "\ud800", "x" * 300, [], {}, [[[]]], {"a": {"b": None}}]),
    st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
)


HUGE_NUMBERS = st.sampled_from([1 << 63, 1 << 64, -(1 << 63) - 1, 10 ** 30, -1, -5.0, 1e20, 1e308, -1e308])


def _at(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _paths(value, prefix=()):
    """Every (path to a value) in a JSON tree, keys and list positions."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _replace(tree, path, new):
    if not path:
        return new
    tree = json.loads(json.dumps(tree))
    node = tree
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = new
    return tree


@st.composite
def damaged_json(draw, seed: dict) -> bytes:
    """``seed`` with one value replaced (or one key renamed, or a new key added), or its bytes cut short."""
    how = draw(st.sampled_from(["number", "number", "value", "key", "cut"]))
    if how == "cut":
        data = json.dumps(seed).encode()
        return data[: draw(st.integers(0, len(data) - 1))]
    paths = [p for p in _paths(seed) if p]
    if how == "number":  # a number of the seed out of every bound (the kind of damage that stopped a root)
        numbers = [p for p in paths if type(_at(seed, p)) in (int, float)]
        return json.dumps(_replace(seed, draw(st.sampled_from(numbers)), draw(HUGE_NUMBERS))).encode()
    path = draw(st.sampled_from(paths))
    if how == "key" and isinstance(path[-1], str):
        parent = json.loads(json.dumps(seed))
        node = parent
        for p in path[:-1]:
            node = node[p]
        node[draw(st.one_of(st.text(max_size=6), st.sampled_from(["\u00b2", "--1", "99999999999999999999"])))] = \
            node.pop(path[-1])
        tree = parent
    else:
        tree = _replace(seed, path, draw(NASTY))
    return json.dumps(tree, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


def _seed(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


MANIFEST = _seed("rank-raises/manifest.json")
SUMMARY = _seed("rank-raises/final_summary.json")
OUTCOME = build_outcome(run_name="bad", node_rank=0, nnodes=1, nproc_per_node=2, contract_digest="d" * 16,
                        exit_code=1, completed_at=1_796_051_667.0)
SIDE = {"manifest": ("manifest.json", MANIFEST), "summary": ("final_summary.json", SUMMARY),
        "outcome": ("nodes/node_0/guard_outcome.json", OUTCOME)}


@st.composite
def damaged_side(draw) -> tuple[str, str, bytes]:
    kind = draw(st.sampled_from(sorted(SIDE)))
    rel, seed = SIDE[kind]
    return kind, rel, draw(damaged_json(seed))


def _big_row_value() -> tuple[str, str, bytes]:
    """The summary with a 400-digit integer as rank 0's step time (kept: the row is free-form)."""
    tree = json.loads(json.dumps(SUMMARY))
    tree["step_time"]["groups"]["rows"]["0"]["metrics"]["step_time_ms"] = "__BIG__"
    return "summary", "final_summary.json", json.dumps(tree).replace('"__BIG__"', "1" + "0" * 400).encode()


@FEW
@given(case=damaged_side())
@example(case=_big_row_value())
def test_damaged_side_file_is_at_most_one_error_row(case, caplog):
    kind, rel, data = case
    caplog.set_level(logging.WARNING, logger="traceml.daemon")
    with tempfile.TemporaryDirectory() as tmp:
        root, index = Path(tmp) / "logs", Path(tmp) / "index.sqlite"
        write_stream(root / "bad", CLEAN)
        (root / "bad" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "bad" / rel).write_bytes(data)
        write_stream(root / "good", CLEAN)
        ingest(root, index, caplog)
        refused = sidefiles.parse(kind, rel, "0" if kind == "outcome" else None, data).error is not None
        assert stored(index, root / "bad") == (CLEAN_STEPS, int(refused))  # its run keeps its streams
        assert stored(index, root / "good") == (CLEAN_STEPS, 0)
        # … and every reading of the index works, the good run's and the bad one's: a summary kept with a
        # 400-digit number made every `traceml status` raise (found by fuzzing)
        with contextlib.redirect_stdout(io.StringIO()):
            assert status_cli.main(["--index", str(index), "--json"]) == 0
        with Reader(index) as reader:
            for run in reader.list_runs():
                reader.run_detail(run.run_id)
                reader.figures(run)


@given(damaged_side())
def test_side_file_facts_are_storable(case):
    """Pure: whatever the bytes, ``sidefiles.parse`` returns (never raises), and facts it gives hold only
    what SQLite stores: integers within 64 bits, times as text."""
    kind, rel, data = case
    read = sidefiles.parse(kind, rel, "0" if kind == "outcome" else None, data)
    assert (read.facts is None) or (read.error is None)
    for value in vars(read.facts).values() if read.facts is not None else ():
        for v in value if isinstance(value, tuple) else (value,):
            for x in v if isinstance(v, tuple) else (v,):
                assert x is None or isinstance(x, (str, bool)) or (isinstance(x, int) and -(1 << 63) <= x < 1 << 63)
