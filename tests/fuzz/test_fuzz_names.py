"""The names the daemon parses (``steps-<attempt>.jsonl``, ``rank_<r>``, ``node_<k>``) against their contract
(``core.rundir``, ``core.bounds``): any text parses to a number SQLite can store or to nothing, never an
exception; every name traceml writes reads back as its number; a name of ours out of range is refused
with a reason."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from traceml_tui.core import bounds, rundir

KINDS = {"attempt": (rundir.steps_file_name, rundir.parse_steps_name),
         "rank": (rundir.rank_dir_name, rundir.parse_rank_name),
         "node": (rundir.node_dir_name, rundir.parse_node_name)}
NAMES = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=20).map(os.fsdecode),  # what os.scandir gives for any bytes on disk
    st.builds(lambda p, d, s: p + d + s, st.sampled_from(["steps-", "rank_", "node_", ""]),
              st.text(alphabet="0123456789٣²", min_size=0, max_size=30), st.sampled_from([".jsonl", "", " "])),
)


@given(NAMES)
def test_any_name_parses_to_a_storable_number_or_nothing(name):
    for kind, (_, parse) in KINDS.items():
        n = parse(name)
        assert n is None or (type(n) is int and 0 <= n <= bounds.INT64_MAX)
        problem = rundir.name_problem(name, kind)
        assert problem is None or (n is None and "64-bit" in problem)
    shown = rundir.shown_name(name)
    assert isinstance(shown.encode("utf-8"), bytes)  # always storable text (raises for a lone surrogate)
    assert (rundir.name_not_utf8(name) is None) == (shown == name)


@given(st.sampled_from(sorted(KINDS)), st.integers(0, bounds.INT64_MAX))
def test_every_name_traceml_writes_reads_back(kind, n):
    make, parse = KINDS[kind]
    assert parse(make(n)) == n and rundir.name_problem(make(n), kind) is None


@given(st.sampled_from(sorted(KINDS)), st.integers(bounds.INT64_MAX + 1, 10 ** 40))
def test_a_name_of_ours_beyond_64_bits_is_refused_with_its_reason(kind, n):
    make, parse = KINDS[kind]
    assert parse(make(n)) is None
    assert f"{kind} number" in rundir.name_problem(make(n), kind)
