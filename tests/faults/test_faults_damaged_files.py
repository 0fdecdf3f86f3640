"""Damaged files found by fuzzing the readers: each is one error row, never a stopped root or a lost line.

Every case builds the root the fuzzing found it in: two runs, ``good`` and ``bad``, five steps each, then
damages one file of ``bad`` (docs/daemon.md, "Damaged input"). The contract each asserts: the other run
and the damaged run's other files are ingested, the damaged file is one error row naming it, and
``traceml daemon --once`` exits 0 saying how many files it refused.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from daemon.reader import Reader

from support.daemon_files import index_rows

pytestmark = pytest.mark.faults

BIG = "99999999999999999999"  # beyond 2^63 - 1
HEADER = '{"kind":"header","v":1,"run":"%s","rank":0,"attempt":0,"uuid":"u-%s","ts":1.0}'
STEP = '{"kind":"step","v":1,"run":"%s","rank":0,"attempt":0,"step":%d,"ts":%d.0,"cpu_ms":{"step":1.0}}'


def _two_runs(root: Path) -> None:
    """``good`` and ``bad``, one rank each, a header and steps 1..5 (the fuzzing's base root)."""
    for run in ("good", "bad"):
        path = root / run / "ranks" / "rank_0" / "steps-0.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("\n".join([HEADER % (run, run)] + [STEP % (run, s, s) for s in range(1, 6)]) + "\n")


def _steps(index: Path, run: str) -> list[int]:
    with Reader(index) as r:
        found = r.find_run(run)
    assert found is not None, f"{run} not in the index"
    return [row[0] for row in index_rows(index, "SELECT step FROM steps WHERE run_id = ? ORDER BY step",
                                         (found.run_id,))]


def _errors(index: Path, run: str) -> list:
    with Reader(index) as r:
        return list(r.events.errors(r.find_run(run).run_id))


def _once(env) -> subprocess.CompletedProcess:
    return env.cli("daemon", str(env.root), "--once", "--no-inotify")


# --- R1a: a stream file, rank folder or node folder named with a number beyond 64 bits


@pytest.mark.parametrize("damage", ["stream", "rank", "node"])
def test_name_beyond_64_bits_is_one_error_row_and_the_root_is_ingested(env, damage):
    _two_runs(env.root)
    bad = env.root / "bad"
    if damage == "stream":
        rel = f"ranks/rank_0/steps-{BIG}.jsonl"
        (bad / rel).write_bytes((bad / "ranks/rank_0/steps-0.jsonl").read_bytes())
    elif damage == "rank":
        rel = f"ranks/rank_{BIG}"
        (bad / rel).mkdir()
    else:
        rel = f"nodes/node_{BIG}"
        (bad / rel).mkdir(parents=True)
        (bad / rel / "system.jsonl").write_text(HEADER % ("bad", "n") + "\n")
    done = _once(env)
    assert done.returncode == 0, done.stderr
    assert "ingested 10 record(s)" in done.stdout and "refused 1 file(s)" in done.stdout
    assert _steps(env.index, "good") == _steps(env.index, "bad") == [1, 2, 3, 4, 5]
    errors = _errors(env.index, "bad")
    assert [e.path for e in errors] == [rel] and "64-bit" in errors[0].message
    assert _errors(env.index, "good") == []
    again = _once(env)  # nothing new: no second row, still counted as refused
    assert again.returncode == 0 and "ingested 0 record(s)" in again.stdout and "refused 1 file(s)" in again.stdout
    assert len(_errors(env.index, "bad")) == 1


# --- R1b, R1c, R1d: side files whose numbers are out of bounds


MANIFESTS = {
    "started_at-1e20": '{"run_name":"bad","started_at":1e20}',
    "ended_at-1e20": '{"run_name":"bad","status":"completed","ended_at":1e20}',
    "started_at-negative": '{"run_name":"bad","started_at":-5.0}',
    "world_size-2^63": '{"run_name":"bad","topology":{"world_size":9223372036854775808}}',
    "exit_code-2^64": '{"run_name":"bad","status":"failed","exit_code":18446744073709551616}',
}


@pytest.mark.parametrize("text", MANIFESTS.values(), ids=MANIFESTS.keys())
def test_manifest_out_of_bounds_is_one_error_row(env, text):
    _two_runs(env.root)
    (env.root / "bad" / "manifest.json").write_text(text)
    done = _once(env)
    assert done.returncode == 0, done.stderr
    assert "ingested 10 record(s)" in done.stdout and "refused 1 file(s)" in done.stdout
    assert _steps(env.index, "bad") == [1, 2, 3, 4, 5]  # the run keeps its other facts
    errors = _errors(env.index, "bad")
    assert len(errors) == 1 and errors[0].path == "manifest.json" and "not a valid manifest" in errors[0].message
    assert "manifest.json" in done.stderr  # said once on the log too
    with Reader(env.index) as r:
        bad = r.find_run("bad")
        assert bad.manifest_status is None and bad.started_at is None  # no half of a manifest


def test_max_attempts_beyond_64_bits_is_the_default(env):
    """``hygiene`` is free-form: a declared max_attempts nobody can store is not declared (the default applies)."""
    _two_runs(env.root)
    (env.root / "bad" / "manifest.json").write_text(
        '{"run_name":"bad","status":"completed","hygiene":{"validation":{"max_attempts":9223372036854775808}}}')
    done = _once(env)
    assert done.returncode == 0 and "ingested 10 record(s)" in done.stdout and "refused" not in done.stdout
    with Reader(env.index) as r:
        assert r.find_run("bad").manifest_status == "completed"
    assert index_rows(env.index, "SELECT max_attempts FROM runs WHERE name = 'bad'") == [(None,)]


@pytest.mark.parametrize("key", ["\u00b2", "--1", BIG, "1 "], ids=["superscript-two", "double-minus", "2^66", "space"])
def test_summary_exit_code_key_not_an_integer_is_one_error_row(env, key):
    _two_runs(env.root)
    (env.root / "bad" / "final_summary.json").write_text(json.dumps({"failure": {"exit_codes": {key: 1}}}))
    done = _once(env)
    assert done.returncode == 0, done.stderr
    assert "ingested 10 record(s)" in done.stdout and "refused 1 file(s)" in done.stdout
    errors = _errors(env.index, "bad")
    assert len(errors) == 1 and errors[0].path == "final_summary.json"
    assert _steps(env.index, "good") == [1, 2, 3, 4, 5]


def test_live_daemon_says_a_bad_side_file_once_per_version(env, traceml_cmd, cli_env):
    """R1b live: no busy loop over a failing file — one log line per version, and the runs are listed."""
    _two_runs(env.root)
    manifest = env.root / "bad" / "manifest.json"
    manifest.write_text('{"run_name":"bad","started_at":1e20}')
    proc = subprocess.Popen([*traceml_cmd, "daemon", str(env.root), "--no-inotify", "--index", str(env.index),
                             "--poll-interval", "0.05", "--rescan-interval", "0.1"],
                            env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # both runs listed, with their steps
            if env.index.exists() and len(_steps_or_none(env.index, "good")) == 5 \
                    and len(_steps_or_none(env.index, "bad")) == 5:
                break
            time.sleep(0.1)
        time.sleep(1.0)  # ten rescans at least
        manifest.write_text('{"run_name":"bad","started_at":-1.0}')  # a new version: one more line
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_errors(env.index, "bad")) < 2:
            time.sleep(0.1)
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    said = [line for line in err.splitlines() if "manifest.json" in line]
    assert len(said) == 2, err
    assert len(err.splitlines()) <= 4, err  # "watching", the two lines, nothing repeated
    assert len(_errors(env.index, "bad")) == 2


def _steps_or_none(index: Path, run: str) -> list[int]:
    with Reader(index) as r:
        found = r.find_run(run)
    return _steps(index, run) if found is not None else []


# --- R2, R3: the block fast path stores exactly what line-by-line decoding stores


def _fz_step(s: int) -> str:
    return '{"kind":"step","v":1,"run":"fz","rank":0,"attempt":0,"step":%d,"ts":1.0,"cpu_ms":{"step":1.0}}' % s


def test_torn_and_merged_lines_around_a_valid_line(env):
    """R2: the valid step 8 is stored; the torn line, its continuation and the merged line are 3 error rows."""
    path = env.root / "fz" / "ranks" / "rank_0" / "steps-0.jsonl"
    path.parent.mkdir(parents=True)
    lines = ['{"kind":"header","v":1,"run":"fz","rank":0,"attempt":0,"uuid":"u","ts":1.0}',
             '{"kind":"step","v":1,"run":"fz","rank":0,"attempt":0,"step":7,"ts":1.0,"junk":[0',  # torn
             _fz_step(8),  # valid
             "0]}",  # the torn line's continuation
             _fz_step(9) + "," + _fz_step(10) + "," + _fz_step(11)]  # merged
    path.write_text("\n".join(lines) + "\n")
    starts = [sum(len(x) + 1 for x in lines[:i]) for i in range(len(lines))]
    assert env.ingest() == 1
    assert _steps(env.index, "fz") == [8]
    assert [e.offset for e in _errors(env.index, "fz")] == [starts[1], starts[3], starts[4]]


R3_HEADER = '{"kind":"header","v":1,"run":"%s","rank":0,"attempt":0,"uuid":"u","ts":1.0}'
R3_LINES = {
    "v-beyond-2^64": ('{"kind":"step","v":19223372036854775807,"run":"%s","rank":0,"attempt":0,"step":1,"ts":1.0,'
                      '"mem":{"cuda_peak_allocated":18446744073709551615}}', "`v`"),
    "cuda-peak-2^64": ('{"kind":"step","v":1,"run":"%s","rank":0,"attempt":0,"step":1,"ts":1.0,'
                       '"mem":{"cuda_peak_allocated":18446744073709551615}}', "`mem.cuda_peak_allocated`"),
}


@pytest.mark.parametrize("line,field", R3_LINES.values(), ids=R3_LINES.keys())
def test_a_line_is_refused_the_same_whatever_its_neighbours(env, line, field):
    """R3: alone in its block (fast path) or beside a bad line (line by line), one error row naming the field."""
    for run, tail in (("a", ""), ("b", "not json\n")):
        path = env.root / run / "ranks" / "rank_0" / "steps-0.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text(R3_HEADER % run + "\n" + line % run + "\n" + tail)
    env.ingest()
    for run in ("a", "b"):
        assert _steps(env.index, run) == []
        messages = [e.message for e in _errors(env.index, run)]
        assert messages[0] == f"invalid record: {field} is outside the 64-bit integer range the index stores"
    assert len(_errors(env.index, "b")) == 2


# --- R7: status --json is valid JSON whatever the figures


def test_status_json_has_no_infinity(env):
    path = env.root / "fz" / "ranks" / "rank_0" / "steps-0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(R3_HEADER % "fz" + "\n" + "".join(
        '{"kind":"step","v":1,"run":"fz","rank":0,"attempt":0,"step":%d,"ts":%d.0,'
        '"cpu_ms":{"step":1e308,"input_wait":1e308}}\n' % (s, s) for s in (1, 2)))
    assert _once(env).returncode == 0
    out = env.cli("status", str(env.root), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
    (run,) = doc["runs"]
    assert run["ranks"][0]["median_step_ms"] is None  # inf (1e308 + 1e308) is unknown, not Infinity
    assert run["ranks"][0]["last_step"] == 2


# --- names that are not UTF-8 (found while fuzzing the names: they stopped the root as R1a did)


def test_names_not_utf8_are_refused_and_the_root_is_ingested(env):
    """A run folder or a backlog file whose name's bytes are not UTF-8 cannot be stored as text: the file
    (one error row) or the run (one log line: there is no run row to hold an error) is refused; the rest
    is read."""
    import os

    _two_runs(env.root)
    os.rename(env.root / "bad", os.path.join(os.fsencode(env.root), b"bad\xff"))
    requests = env.root / "good" / "validation" / "requests"
    requests.mkdir(parents=True)
    (requests / "ck-1.json").write_text('{"checkpoint":"ck-1","step":1}')
    with open(os.path.join(os.fsencode(requests), b"ck\xfe.json"), "wb") as f:
        f.write(b'{"checkpoint":"ck-2","step":2}')
    done = _once(env)
    assert done.returncode == 0, done.stderr
    assert "ingested 5 record(s)" in done.stdout and "refused 2 file(s)" in done.stdout
    assert "bad\\xff: the name is not valid UTF-8" in done.stderr
    assert _steps(env.index, "good") == [1, 2, 3, 4, 5]
    assert [e.path for e in _errors(env.index, "good")] == ["validation/requests/ck\\xfe.json"]
    assert index_rows(env.index, "SELECT path FROM side_files") == [("validation/requests/ck-1.json",)]
    assert index_rows(env.index, "SELECT count(*) FROM runs") == [(1,)]


# --- a side file whose ingestion raises anyway (a bug no bound caught): undone on its own, never a failed scan


def test_side_file_whose_ingestion_raises_is_refused_alone(env, monkeypatch, caplog):
    """Fault injection: storing the facts of one manifest raises (as a bug would). That file's writes are
    undone (savepoint), it is one error row and one log line, it is not read again until it changes, and
    every other file and run is ingested."""
    import logging

    from daemon import aggregates

    _two_runs(env.root)
    for run in ("good", "bad"):
        (env.root / run / "manifest.json").write_text(json.dumps({"run_name": run, "status": "completed"}))
    real = aggregates.write_manifest_facts
    calls = []

    def write(conn, run_id, facts, folder):
        calls.append(folder)
        real(conn, run_id, facts, folder)  # the row is written, then the "bug" strikes: it must be undone
        if folder == "bad":
            raise RuntimeError("injected")

    monkeypatch.setattr(aggregates, "write_manifest_facts", write)
    caplog.set_level(logging.WARNING, logger="traceml.daemon")
    assert env.ingest() == 10
    with Reader(env.index) as r:
        assert r.find_run("good").manifest_status == "completed"
        assert r.find_run("bad").manifest_status is None  # undone with the file, not half applied
    errors = _errors(env.index, "bad")
    assert len(errors) == 1 and errors[0].path == "manifest.json" and "RuntimeError: injected" in errors[0].message
    assert index_rows(env.index, "SELECT content, error IS NOT NULL FROM side_files WHERE path = 'manifest.json'"
                      " AND run_id = (SELECT run_id FROM runs WHERE name = 'bad')") == [(None, 1)]
    assert sum("injected" in r.getMessage() for r in caplog.records) == 1
    assert not [r for r in caplog.records if "pass failed" in r.getMessage()]
    calls.clear()
    assert env.ingest() == 0 and "bad" not in calls  # a restart does not read the unchanged file again
    time.sleep(0.01)
    (env.root / "bad" / "manifest.json").write_text(json.dumps({"run_name": "bad", "status": "failed"}))
    monkeypatch.setattr(aggregates, "write_manifest_facts", real)  # "fixed": the new version is read
    env.ingest()
    with Reader(env.index) as r:
        assert r.find_run("bad").manifest_status == "failed"
