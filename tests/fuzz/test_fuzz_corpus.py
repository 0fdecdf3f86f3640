"""The corpus: every damaged input found by fuzzing, kept as a regression case (docs/security.md, "Fuzzing").

* ``corpus/blocks/*.jsonl`` — stream bodies: the fast path equals line by line on each, and the ingester
  stores each valid line once and one error row per bad line, the other run untouched.
* ``corpus/side/<kind>.<refused|kept>.<what>.json`` — a manifest, summary or node outcome: ``refused``
  ones are one error row (and a ``--once`` count), ``kept`` ones none; never a stopped root either way.
* ``corpus/names.txt`` — stream files and rank/node folders named with numbers beyond 64 bits: one error
  row each, the run's other files read.

A new case found by a longer run (``HYPOTHESIS_PROFILE=long``) is added as a file here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from streams import CLEAN, CLEAN_STEPS, header, ingest, oracle, stored, write_stream

from daemon import decode

CORPUS = Path(__file__).with_name("corpus")
BLOCKS = sorted((CORPUS / "blocks").glob("*.jsonl"))
SIDE = sorted((CORPUS / "side").glob("*.json"))
NAMES = (CORPUS / "names.txt").read_text().split()
SIDE_PATHS = {"manifest": "manifest.json", "summary": "final_summary.json",
              "outcome": "nodes/node_0/guard_outcome.json"}


@pytest.mark.parametrize("path", BLOCKS, ids=[p.stem for p in BLOCKS])
def test_block(path, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="traceml.daemon")
    block = path.read_bytes()
    fast, slow = decode.parse_block(block, 7), decode._parse_slow(block[:-1].split(b"\n"), 7)
    assert (fast.records, fast.offsets, fast.errors) == (slow.records, slow.offsets, slow.errors)
    root, index = tmp_path / "logs", tmp_path / "index.sqlite"
    body = block[:-1].split(b"\n")
    write_stream(root / "fz", body)
    write_stream(root / "good", CLEAN)
    ingest(root, index, caplog)
    assert stored(index, root / "fz") == oracle(body)
    assert stored(index, root / "good") == (CLEAN_STEPS, 0)


@pytest.mark.parametrize("path", SIDE, ids=[p.stem for p in SIDE])
def test_side_file(path, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="traceml.daemon")
    kind, verdict, _ = path.name.split(".", 2)
    root, index = tmp_path / "logs", tmp_path / "index.sqlite"
    write_stream(root / "bad", CLEAN)
    write_stream(root / "good", CLEAN)
    target = root / "bad" / SIDE_PATHS[kind]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(path.read_bytes())
    refused = verdict == "refused"
    assert ingest(root, index, caplog) == int(refused)
    assert stored(index, root / "bad") == (CLEAN_STEPS, int(refused))
    assert stored(index, root / "good") == (CLEAN_STEPS, 0)
    assert sum(SIDE_PATHS[kind] in r.getMessage() for r in caplog.records) == int(refused)  # said once


@pytest.mark.parametrize("rel", NAMES)
def test_name(rel, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="traceml.daemon")
    root, index = tmp_path / "logs", tmp_path / "index.sqlite"
    write_stream(root / "bad", CLEAN)
    write_stream(root / "good", CLEAN)
    target = root / "bad" / rel
    if rel.endswith("/"):
        target.mkdir(parents=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(header("bad") + b"\n" + b"\n".join(CLEAN) + b"\n")
    assert ingest(root, index, caplog) == 1
    assert stored(index, root / "bad") == (CLEAN_STEPS, 1)
    assert stored(index, root / "good") == (CLEAN_STEPS, 0)
    assert sum(rel.rstrip("/").split("/")[1] in r.getMessage() for r in caplog.records) == 1  # said once
