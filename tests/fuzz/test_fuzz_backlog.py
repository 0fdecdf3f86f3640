"""The validation backlog's readers against damaged files (docs/security.md, "Fuzzing").

Start: the committed real hygiene run (tests/fixtures/runs/hygiene: requests, a claim, receipts, failures).
Each example damages one of its backlog files. Contracts:

* ``backlog_status`` (what ``validate status`` prints) never raises; a file that does not decode is exactly
  one error line naming it, a file that decodes is none; every other request is still reported;
* its text output encodes as UTF-8 and its ``--json`` output is strict JSON (no ``Infinity``/``NaN``);
* the index side (the daemon's pure side-file parser, then ``Reader.backlog``: watch's Backlog screen) never
  raises and decides the same state word for every request the file side shows — one decoder, one rule.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon import sidefiles
from daemon.reader import Reader
from traceml_tui.core import hygiene_files
from traceml_tui.core.jsonsafe import dumps_valid
from traceml_tui.hygiene.backlog import backlog_status
from traceml_tui.validate_cli import format_status

from support.fuzz_mutations import damaged, strict_json

FIXTURE = Path(__file__).parents[1] / "fixtures" / "runs" / "hygiene"
FILES = sorted(p.relative_to(FIXTURE).as_posix() for p in (FIXTURE / "validation").glob("*/*.json"))
CORPUS = Path(__file__).parent / "corpus" / "backlog"


@pytest.fixture(scope="module")
def hygiene(tmp_path_factory):
    """A copy of the real hygiene run under a root, and its index built by one pass of the real daemon."""
    base = tmp_path_factory.mktemp("fuzz-backlog")
    run = base / "logs" / "hygiene"
    shutil.copytree(FIXTURE, run)
    index = base / "idx.sqlite"
    env = {**os.environ, "XDG_STATE_HOME": str(base / "state")}
    subprocess.run([sys.executable, "-m", "traceml_tui", "daemon", str(run.parent), "--once", "--no-inotify",
                    "--index", str(index)], env=env, check=True, capture_output=True, timeout=300)
    with Reader(index) as reader:
        (summary,) = reader.list_runs()
    return run, index, summary.run_id


def _check(hygiene, rel: str, data: bytes) -> None:
    run, index, run_id = hygiene
    path = run / rel
    original = path.read_bytes()
    folder, name = Path(rel).parent.name, Path(rel).name
    try:
        hygiene_files.decode_named(folder, name, data)
        bad = False
    except hygiene_files.DamagedFile as exc:
        assert "\n" not in str(exc)
        bad = True
    now = time.time()
    path.write_bytes(data)
    try:
        status = backlog_status(run, now=now)
    finally:
        path.write_bytes(original)
    # one error line per damaged file, naming it; none for a file that decodes
    if bad:
        assert len(status["errors"]) == 1 and status["errors"][0].startswith(f"{rel}: "), status["errors"]
    else:
        assert status["errors"] == []
    format_status(status).encode("utf-8")  # printable: no lone surrogate reaches the terminal
    strict_json(dumps_valid(status))
    shown = {row["checkpoint"]: row["state"] for row in status["requests"]}
    requests = {Path(f).stem for f in FILES if f.startswith("validation/requests/")}
    assert set(shown) >= requests - {Path(rel).stem}  # every other request is still there

    # the index side: what the daemon stores for these bytes, read by watch's reader
    stored = sidefiles.parse(_kind(folder), rel, Path(rel).stem, data)
    with sqlite3.connect(index) as conn:
        before = conn.execute("SELECT key, content, error FROM side_files WHERE run_id = ? AND path = ?",
                              (run_id, rel)).fetchone()
        conn.execute("UPDATE side_files SET key = ?, content = ?, error = ? WHERE run_id = ? AND path = ?",
                     (stored.key, stored.content, stored.error, run_id, rel))
    try:
        with Reader(index) as reader:
            items = {item.checkpoint: item.state.value for item in reader.backlog.entries(run_id, now=now)}
    finally:
        with sqlite3.connect(index) as conn:
            conn.execute("UPDATE side_files SET key = ?, content = ?, error = ? WHERE run_id = ? AND path = ?",
                         (*before, run_id, rel))
    for checkpoint, word in shown.items():
        assert items.get(checkpoint) == word, (checkpoint, word, items)


def _kind(folder: str) -> str:
    return {v: k for k, v in hygiene_files.FOLDER_OF_KIND.items()}[folder]


@st.composite
def damaged_file(draw):
    rel = draw(st.sampled_from(FILES))
    return rel, draw(damaged((FIXTURE / rel).read_bytes()))


@given(case=damaged_file())
def test_backlog_readers_survive_any_damaged_file(hygiene, case):
    _check(hygiene, *case)


@pytest.mark.parametrize("found", sorted(p.name for p in CORPUS.glob("*.json")), ids=str)
def test_backlog_corpus(hygiene, found):
    """Cases found by fuzzing (and the R4 repros), kept as regression inputs: ``<folder>__<name>__<case>.json``."""
    folder, name, _ = found.split("__", 2)
    _check(hygiene, f"validation/{folder}/{name}.json", (CORPUS / found).read_bytes())


# --------------------------------------------------------------------------- the looks skip receipted requests
# The dispatcher (``has_unreceipted``, ``next_retry_s``), the drainer's scan and the launcher's blocked warning
# read only the requests without a receipt file (``backlog.open_requests``). Contract: over any backlog (receipts
# good, damaged or folders; failures up to blocked; claims; stray files) they answer as reading every request.

_BACKLOG_EVENTS = st.lists(st.one_of(
    st.tuples(st.just("publish")),
    st.tuples(st.just("complete"), st.integers(0, 20)),
    st.tuples(st.just("fail"), st.integers(0, 20)),
    st.tuples(st.just("claim"), st.integers(0, 20)),
    st.tuples(st.just("damage_receipt"), st.integers(0, 20), st.binary(max_size=20)),
    st.tuples(st.just("receipt_folder"), st.integers(0, 20)),
    st.tuples(st.just("stray"), st.sampled_from([".x.json", "notes.txt", "dir.json"])),
), max_size=30)


def test_looks_at_open_requests_answer_as_reading_every_request(tmp_path_factory):
    from hypothesis import HealthCheck, settings

    from traceml_tui.core.rundir import RunDir
    from traceml_tui.hygiene import backlog, dispatch
    from traceml_tui.hygiene.checkpoints import publish_checkpoint

    @given(events=_BACKLOG_EVENTS, backoff=st.sampled_from([0.0, 3600.0]))
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    def check(events, backoff):
        run = tmp_path_factory.mktemp("open") / "run"
        run.mkdir()
        rd = RunDir(run)
        published: list[str] = []
        for kind, *args in events:
            if kind == "publish":
                (run / "w.bin").write_bytes(b"w")
                published.append(publish_checkpoint(run, run / "w.bin", step=len(published) + 1, config_digest="d"))
                continue
            if kind == "stray":
                folder = rd.backlog_dir("requests")
                folder.mkdir(parents=True, exist_ok=True)
                (folder / args[0]).mkdir(exist_ok=True) if args[0] == "dir.json" else (folder / args[0]).write_bytes(b"{}")
                continue
            if not published:
                continue
            ckpt = published[args[0] % len(published)]
            request = backlog.read_json(rd.request(ckpt))
            receipt = rd.receipt(ckpt)
            if kind == "complete" and request is not None and not receipt.exists():
                backlog.write_receipt(run, request, {"m": 1.0})
            elif kind == "fail":
                backlog.write_failure(run, ckpt, "boom")
            elif kind == "claim":
                backlog.try_claim(run, ckpt, {"host": "h", "pid": 1, "started": 0.0}, 60.0)
            elif kind == "damage_receipt" and not receipt.is_dir():
                receipt.parent.mkdir(parents=True, exist_ok=True)
                receipt.write_bytes(args[1])
            elif kind == "receipt_folder" and not receipt.exists():
                receipt.mkdir(parents=True)
        every = backlog.list_requests(run)
        claimable = any(backlog.claimable(run, r["checkpoint"], max_attempts=2, backoff_s=backoff) for r in every)
        assert dispatch.has_unreceipted(run, 2, backoff) == claimable
        waits = [backlog.retry_wait(run, r["checkpoint"], max_attempts=2, backoff_s=backoff) for r in every
                 if backlog.read_claim(run, r["checkpoint"]) is None]
        known = [w for w in waits if w is not None]
        got = dispatch.next_retry_s(run, 2, backoff)
        assert (got is None) == (not known)
        if known:
            assert got == pytest.approx(min(known), abs=5.0)
        receipted = {r["checkpoint"] for r in every if rd.receipt(r["checkpoint"]).exists()}
        assert [r["checkpoint"] for r in backlog.open_requests(run)] == \
            [r["checkpoint"] for r in every if r["checkpoint"] not in receipted or rd.receipt(r["checkpoint"]).is_dir()]

    check()
