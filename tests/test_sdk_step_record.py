"""Each figure of a step lands in its own field of the step record (sdk/session.py builds it positionally)."""

from __future__ import annotations

import json

from traceml_tui.core import records
from traceml_tui.sdk.session import Session


def test_every_step_figure_lands_in_its_own_field(tmp_path) -> None:
    session = Session(tmp_path / "run", "run", rank=3, world_size=4)
    session.prev_end = 100.0
    session.data_pending, session.data_source = 0.002, 1  # 2 ms in a loader's next() before the step
    state = session.begin(100.005)
    state.fwd_ms, state.bwd_ms, state.opt_ms, state.data_in_step = 1.5, 2.5, 0.75, 0.001
    state.values.update(loss=0.25, lr=0.125, grad_norm=3.5, batch_size=16, metrics={"acc": 0.5},
                        components={"mse": (0.2, 0.4)})
    session.end(state, 100.015, True)
    plain = session.begin(100.02)  # a step with nothing logged: the record's short form
    session.end(plain, 100.03, True)
    session.close("exited")
    lines = (tmp_path / "run" / "ranks" / "rank_3" / "steps-0.jsonl").read_bytes().splitlines()
    first, second = (json.loads(line) for line in lines if b'"kind":"step"' in line)
    assert (first["run"], first["rank"], first["attempt"], first["step"], first["v"]) == ("run", 3, 0, 1,
                                                                                          records.RECORD_VERSION)
    cpu = first["cpu_ms"]
    assert cpu["h2d"] is None
    for name, expected in (("step", 10.0), ("input_wait", 5.0), ("forward", 1.5), ("backward", 2.5),
                           ("optimizer", 0.75), ("data_wait", 2.0), ("data_in_step", 1.0)):
        assert abs(cpu[name] - expected) < 1e-6, name
    assert (first["loss"], first["lr"], first["grad_norm"], first["examples"]) == (0.25, 0.125, 3.5, 16)
    assert first["gpu_ms"] is None and first["metrics"] == {"acc": 0.5}
    assert first["components"]["mse"]["value"] == 0.2 and first["components"]["mse"]["target_ms"] == 0.4
    assert first["mem"]["rss"] > 0 and abs(first["ts"] - (100.015 + session._wall_offset)) < 1e-6
    assert second["step"] == 2 and second["examples"] == 16 and second["loss"] is None and second["lr"] is None
    assert abs(second["cpu_ms"]["step"] - 10.0) < 1e-6 and abs(second["cpu_ms"]["input_wait"] - 5.0) < 1e-6
    assert second["components"] is None and second["metrics"] is None and second["mem"] == first["mem"]
