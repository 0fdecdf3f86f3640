"""Bounded JSON nesting (core/jsonsafe.py) and every non-daemon reader of untrusted JSON using it.

A file or line holding ``{"x": [[[ … ]]]}`` thousands of levels deep made the
decoders raise ``RecursionError`` and abort whole operations (a summary, a
backlog status, a drainer, an export). Readers now refuse anything nested
deeper than 64 levels before decoding, as one plain ``ValueError``.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from traceml_tui.core import artifacts, records
from traceml_tui.core.jsonsafe import MAX_DEPTH, NestingError, decode_bounded, loads_bounded, nesting_depth
from traceml_tui.core.rundir import RunDir

FIXTURES = Path(__file__).parent / "fixtures" / "summaries"


def deep(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


def deep_object(depth: int) -> bytes:
    """``{"x": [[[…]]]}`` with ``depth`` levels in all."""
    return b'{"x": ' + deep(depth - 1) + b"}"


def reference_depth(text: str) -> int:
    """The obvious character loop, as the definition."""
    depth = top = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            top = max(top, depth)
        elif ch in "]}":
            depth -= 1
    return top


# --- the pre-scan -------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 63, 64, 65, 1_000, 100_000])
def test_nesting_depth_of_deep_documents(depth):
    for data in (deep(depth), deep_object(depth), deep_object(depth).decode()):
        got = nesting_depth(data, MAX_DEPTH)
        assert got == min(depth, MAX_DEPTH + 1)


def test_unclosed_and_hidden_nesting_still_counts():
    assert nesting_depth(b"[" * 100_000, 64) == 65  # unclosed: json.loads would still recurse
    # Brackets inside strings do not count, and cannot cancel real ones either.
    assert nesting_depth(b'["' + b"]" * 1000 + b'", ' + deep(100) + b"]", 64) == 65
    assert nesting_depth(b'{"a": "[[[[[[[[[[", "b": "\\"[[[[", "c": "\\\\"}', 3) == 1
    escaped = json.dumps({"k": "\\" * 3 + '"' + "[" * 200}).encode()
    assert nesting_depth(escaped, 64) == 1


def test_nesting_depth_agrees_with_the_definition_on_random_documents():
    rng = random.Random(7)
    strings = ['a"[{b\\', "]]]", "x\\\\", '\\\\"[[[', "\n[", "", '""', "plain"]

    def gen(level: int, top: int):
        kind = rng.random()
        if level >= top or kind < 0.3:
            return rng.choice([1, None, 2.5, *strings])
        width = rng.randint(0, 3) if level < 4 else rng.choice([0, 1, 1, 2])
        if kind < 0.65:
            return [gen(level + 1, top) for _ in range(width)]
        return {rng.choice(["k", "[", "}", '\\"{']) + str(i): gen(level + 1, top) for i in range(width)}

    for _ in range(600):
        text = json.dumps(gen(0, rng.choice([5, 20, 80])), ensure_ascii=rng.random() < 0.5)
        want = reference_depth(text)
        for limit in (3, 10, 64):
            got = nesting_depth(text, limit)
            assert (got > limit) == (want > limit), (limit, got, want, text[:200])
            assert got > limit or got >= want


def test_wide_documents_of_deep_runs_take_the_run_walk():
    for depth in (64, 65):
        block = deep(depth, b"0")
        data = b"[" + b",".join([block] * 3000) + b"]"  # ~400 KB of brackets
        assert nesting_depth(data, 64) == min(depth + 1, 65)
        assert nesting_depth(data, 200) == depth + 1


def test_typical_summary_is_checked_in_tens_of_microseconds():
    data = json.dumps(json.loads((FIXTURES / "ours" / "base_1.9.json").read_bytes()), separators=(",", ":")).encode()
    assert nesting_depth(data) <= 8
    rounds = 200
    start = time.perf_counter()
    for _ in range(rounds):
        nesting_depth(data)
    per_call = (time.perf_counter() - start) / rounds
    print(f"nesting_depth: {per_call * 1e6:.1f} us for a {len(data)}-byte summary")
    assert per_call < 2e-3  # ~20 us measured; the bound only catches a pathological regression


def test_bounded_loaders_raise_one_clear_value_error():
    for loader in (loads_bounded, decode_bounded):
        with pytest.raises(NestingError) as info:
            loader(deep_object(10_000))
        assert str(info.value) == "JSON nested deeper than 64 levels"
        assert isinstance(info.value, ValueError)
        assert loader(deep_object(64)) == {"x": json.loads(deep(63))}
    assert loads_bounded(b'{"a": [1]}', max_depth=2) == {"a": [1]}
    with pytest.raises(NestingError, match="deeper than 1 levels"):
        loads_bounded(b'{"a": [1]}', max_depth=1)
    with pytest.raises(ValueError):
        loads_bounded(b"{not json")


def test_importing_jsonsafe_imports_no_msgspec():
    code = "import sys, traceml_tui.core.jsonsafe, traceml_tui.compare.load; print('msgspec' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


# --- the readers ---------------------------------------------------------------------


def test_typed_artifacts_refuse_deep_documents():
    manifest = {"run_name": "r", "hygiene": {"x": json.loads(deep(100))}}
    assert artifacts.decode_manifest(json.dumps({"run_name": "r", "hygiene": {"x": [[1]]}}).encode()) is not None
    assert artifacts.decode_manifest(json.dumps(manifest).encode()) is None
    assert artifacts.decode_outcome(deep_object(100_000)) is None
    assert artifacts.decode_summary(deep_object(100_000).decode()) is None


def test_compare_refuses_a_summary_nested_deeper_than_64_levels(tmp_path, traceml_cmd, cli_env):
    summary = json.loads((FIXTURES / "ours" / "base_1.9.json").read_bytes())
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(summary))
    summary["meta"]["extra"] = json.loads(deep(100))  # well within the parser, beyond any summary
    bad = tmp_path / "deep.json"
    bad.write_text(json.dumps(summary))
    proc = subprocess.run([*traceml_cmd, "compare", str(ok), str(bad), "--max-step-time-regression-pct", "5"],
                          cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "nested deeper than 64 levels" in proc.stderr and "Traceback" not in proc.stderr


def test_backlog_status_skips_a_deep_side_file(tmp_path, traceml_cmd, cli_env):
    from traceml_tui.hygiene import backlog
    from traceml_tui.hygiene.checkpoints import publish_checkpoint

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "weights.bin").write_bytes(b"w")
    ckpt = publish_checkpoint(run_dir, run_dir / "weights.bin", step=10, config_digest="sha256:x")
    layout = RunDir(run_dir)
    layout.request("step-00000020").write_bytes(deep_object(100_000))
    layout.claim(ckpt).parent.mkdir(parents=True, exist_ok=True)
    layout.claim(ckpt).write_bytes(deep_object(100_000))
    layout.receipt("step-00000030").parent.mkdir(parents=True, exist_ok=True)
    layout.receipt("step-00000030").write_bytes(deep_object(100_000))
    assert backlog.read_backlog_file(layout.request("step-00000020"), "requests") is None
    status = backlog.backlog_status(run_dir)
    assert [row["checkpoint"] for row in status["requests"]] == [ckpt]
    assert len(status["errors"]) == 3 and all("nested deeper than 64 levels" in e for e in status["errors"])
    proc = subprocess.run([*traceml_cmd, "validate", "status", str(run_dir), "--json"], env=cli_env,
                          capture_output=True, text=True, timeout=60)
    # each deep file is one line and a non-zero exit; the good request is still reported (docs/hygiene.md)
    assert proc.returncode == 1, proc.stderr
    assert [row["checkpoint"] for row in json.loads(proc.stdout)["requests"]] == [ckpt]
    assert len(proc.stderr.strip().splitlines()) == 3 and "Traceback" not in proc.stderr


def test_a_drainer_survives_a_worker_printing_deep_json(tmp_path):
    from traceml_tui.hygiene.drain import parse_metrics

    with pytest.raises(ValueError, match="nested too deeply"):
        parse_metrics("log line\n" + deep_object(100_000).decode() + "\n")
    assert parse_metrics('{"loss": 1}\n') == {"loss": 1.0}


def test_outcome_reader_bounds_nesting(tmp_path):
    from traceml_tui.guard.outcome import read_outcome

    path = tmp_path / "guard_outcome.json"
    path.write_bytes(deep_object(5_000))
    assert read_outcome(path, expected={}) == ("invalid", None)


def test_export_readers_refuse_deep_files(tmp_path):
    from traceml_tui.export import cursor
    from traceml_tui.hygiene.backlog import read_early_stopping as read_state

    path = tmp_path / "cursor.json"
    path.write_bytes(deep_object(100_000))
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        cursor.load(path)
    errors: list[str] = []
    assert read_state(path, errors) is None  # early_stopping.json, which the export also reads
    assert len(errors) == 1 and "nested deeper than 64 levels" in errors[0]


def test_summary_loader_skips_a_deep_line(tmp_path):
    from traceml_tui.hygiene.batch_grid import list_grids
    from traceml_tui.summary.load import load_ranks

    layout = RunDir(tmp_path)
    stream = layout.steps_file(0, 0)
    stream.parent.mkdir(parents=True)
    good = [records.Header(v=1, run="r", rank=0, attempt=0, uuid="u", ts=1.0)]
    good += [records.Step(v=1, run="r", rank=0, attempt=0, step=s, ts=float(s)) for s in (1, 2)]
    stream.write_bytes(b"".join(records.encode(r) for r in good) + b'{"kind": "step", "x": ' + deep(50_000) + b"}\n")
    ranks = load_ranks(tmp_path)
    assert sorted(ranks[0].steps) == [1, 2]
    # Every other reader of step lines outside the daemon skips it too.
    from traceml_tui.compare.noise import read_step_times
    from traceml_tui.hygiene.curve import load_curve_data
    from traceml_tui.hygiene.field_qc import load_field_records
    from traceml_tui.sdk.session import last_recorded_step

    with open(stream, "ab") as handle:
        handle.write(b'{"kind": "field_stats", "step": 3, "x": ' + deep(50_000) + b"}\n")
    assert last_recorded_step(tmp_path, 0) == (0, 2)
    assert load_field_records(tmp_path) == []
    assert load_curve_data(tmp_path).attempts[0].steps == [1, 2]
    assert read_step_times(tmp_path, "cpu", (None, None)) == []
    grid = layout.batch_grid / "inputs" / "step-1.json"
    grid.parent.mkdir(parents=True)
    grid.write_bytes(deep_object(100_000))
    assert list_grids(tmp_path) == []

