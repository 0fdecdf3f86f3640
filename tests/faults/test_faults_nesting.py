"""Item 1: a JSON file nested thousands of levels deep is that file's error; everything else is ingested."""

from __future__ import annotations

import pytest

from support.daemon_files import append_raw, write_steps

pytestmark = pytest.mark.faults


def _deep(depth: int) -> bytes:
    return b'{"x":' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("rel", ["manifest.json", "nodes/node_0/guard_outcome.json",
                                 "validation/requests/step-00000010.json"])
def test_deep_side_file_is_one_error_row_and_the_rest_is_ingested(env, rel, depth):
    write_steps(env.root / "deep", 0, range(1, 6))
    write_steps(env.root / "other", 0, range(1, 4))
    target = env.root / "deep" / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(_deep(depth))
    assert env.ingest() == 8
    run, steps, errors, _ = env.run("deep")
    assert steps == 5
    assert [e.path for e in errors] == [rel]
    assert "nested deeper than 64 levels" in errors[0].message
    assert env.run("other")[1] == 3


def test_deep_side_file_through_the_cli(env):
    write_steps(env.root / "deep", 0, range(1, 6))
    (env.root / "deep" / "manifest.json").write_bytes(_deep(100_000))
    out = env.cli("daemon", str(env.root), "--once", "--no-inotify")
    assert out.returncode == 0, out.stderr
    assert "ingested 5 record(s)" in out.stdout


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deep_step_line_is_one_error_row(env, depth):
    path = write_steps(env.root / "r", 0, range(1, 4))
    if depth * 2 + 10 > 1 << 20:
        depth = (1 << 19) - 16  # stays under the 1 MiB line limit
    append_raw(path, _deep(depth) + b"\n")
    write_steps(env.root / "r", 0, range(4, 7), header=False)
    write_steps(env.root / "other", 0, range(1, 4))
    assert env.ingest() == 9
    _, steps, errors, _ = env.run("r")
    assert steps == 6
    assert len(errors) == 1 and "nested too deeply" in errors[0].message
    assert env.ingest() == 0  # after a restart: nothing again, no second error row
    assert len(env.run("r")[2]) == 1
