"""Item 5: an integer SQLite cannot store (64-bit) is one error row for its line; the file's other lines go in."""

from __future__ import annotations

import pytest

from support.daemon_files import append_raw, header_line, step_line, write_steps

pytestmark = pytest.mark.faults

BIG = [("examples", b'"examples":160', b'"examples":18446744073709551616'),
       ("step", b'"step":5', b'"step":9223372036854775808'),
       ("step", b'"step":5', b'"step":-9223372036854775809'),
       ("rank", b'"rank":0', b'"rank":9223372036854775808')]


@pytest.mark.parametrize("field,good,bad", BIG, ids=["examples-2^64", "step-2^63", "step-below", "rank-2^63"])
def test_out_of_range_integer_is_one_error_row(env, field, good, bad):
    path = write_steps(env.root / "r", 0, range(1, 5))
    line = step_line("r", 0, 5)
    assert good in line
    append_raw(path, line.replace(good, bad))
    write_steps(env.root / "r", 0, range(6, 9), header=False)
    write_steps(env.root / "other", 0, range(1, 4))
    assert env.ingest() == 10
    _, steps, errors, _ = env.run("r")
    assert steps == 7
    assert len(errors) == 1 and field in errors[0].message and "64-bit" in errors[0].message
    assert env.ingest() == 0  # a restart reads nothing again and adds no error row
    assert len(env.run("r")[2]) == 1
    assert env.run("other")[1] == 3


def test_out_of_range_integer_in_an_event_and_a_big_block(env):
    path = env.root / "r" / "ranks" / "rank_0" / "steps-0.jsonl"
    path.parent.mkdir(parents=True)
    lines = [header_line("r", 0)] + [step_line("r", 0, s) for s in range(1, 3001)]
    lines.insert(1500, b'{"kind":"rank_end","v":1,"run":"r","rank":0,"attempt":0,"step":3,"ts":1.0,'
                       b'"status":"exited","exit_code":99999999999999999999}\n')
    path.write_bytes(b"".join(lines))
    assert env.ingest() == 3000
    _, steps, errors, events = env.run("r")
    assert steps == 3000 and len(errors) == 1 and "exit_code" in errors[0].message and events == ()
