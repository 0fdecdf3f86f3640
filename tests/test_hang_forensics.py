"""Hang forensics (issue 24): a hang names the rank that never arrived, on every surface.

The pure rule (core/state.py ``hang_roles``) and the line (core/hang.py) are
tested on facts; the watchdog (sdk/watchdog.py) on a real session in this
process; the surfaces on the real ``hang`` case of tests/support/realruns.py: 2-rank
gloo DDP through ``traceml run`` where rank 1 sleeps before its all_reduce in
step 3 — once as copied while it hung, once after rank 0's gloo timeout.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traceml_tui.core import records
from traceml_tui.core.hang import current_hang, decode_hang, hang_report
from traceml_tui.core.state import (
    HangFact,
    RankFacts,
    RankState,
    RunFacts,
    RunStatus,
    decide_run,
    first_failure,
    hang_roles,
)

from support import realruns

#: The line of tests/scripts/ddp_train.py where the hang case's rank 1 sleeps.
SLEEP_LINE = next(i for i, line in enumerate(realruns.DDP_SCRIPT.read_text().splitlines(), 1)
                  if "time.sleep(args.hang_s)" in line)
#: Seconds of silence after which a rank is stalled in the surface tests (`--stall-after`).
STALL_AFTER = 2.0


# --------------------------------------------------------------------------- the rule (pure)


def _rank(rank: int, *, end: str | None = None, code: int | None = None, ts: float = 100.0,
          hang: HangFact | None = None) -> RankFacts:
    return RankFacts(rank=rank, last_ts=ts, end_status=end, end_exit_code=code, end_ts=ts + 10 if end else None,
                     hang=hang)


def test_while_it_hangs_the_rank_outside_the_collective_is_stalled_and_its_peer_waiting():
    ranks = (_rank(0, hang=HangFact("all_reduce", 11)), _rank(1, hang=HangFact(None, 10)))
    verdict = decide_run(RunFacts(ranks=ranks, now=200.0, stall_floor_s=5.0))
    assert verdict.status is RunStatus.STALLED
    assert verdict.ranks == (RankState.WAITING, RankState.STALLED)


def test_a_rank_behind_in_collective_count_is_the_culprit_even_inside_a_collective():
    # r1 is stuck in an earlier all_reduce (#10) its peers are past; DDP's own collectives: no name, a count
    ranks = (_rank(0, hang=HangFact(None, 11)), _rank(1, hang=HangFact("all_reduce", 10)),
             _rank(2, hang=HangFact(None, 11)))
    culprits, waiting = hang_roles(ranks, [RankState.STALLED] * 3)
    assert (culprits, waiting) == ({1}, {0, 2})


def test_a_silent_rank_without_a_hang_record_is_the_culprit_of_peers_waiting_for_it():
    ranks = (_rank(0, hang=HangFact("barrier", None)), _rank(1))  # r1 cannot run its watchdog (SIGSTOP)
    assert hang_roles(ranks, [RankState.STALLED] * 2) == ({1}, {0})


@pytest.mark.parametrize("facts", [
    (HangFact("all_reduce", 5), HangFact("all_reduce", 5)),  # both wait in the same one: the cause is elsewhere
    (HangFact(None, None), HangFact(None, None)),  # no rank in a collective: nothing to say
    (None, None),
])
def test_no_culprit_without_a_rank_that_waits_and_one_that_does_not(facts):
    ranks = tuple(_rank(i, hang=h) for i, h in enumerate(facts))
    assert hang_roles(ranks, [RankState.STALLED] * 2) == (frozenset(), frozenset())
    assert decide_run(RunFacts(ranks=ranks, now=200.0, stall_floor_s=5.0)).ranks == (RankState.STALLED,) * 2


def test_running_ranks_are_never_named():
    ranks = (_rank(0, ts=199.0, hang=HangFact("all_reduce", 3)), _rank(1, ts=199.0, hang=HangFact(None, 2)))
    assert decide_run(RunFacts(ranks=ranks, now=200.0, stall_floor_s=5.0)).ranks == (RankState.RUNNING,) * 2


def test_after_the_timeout_the_hung_rank_failed_first_and_its_waiting_peer_is_aborted():
    # r0's all_reduce timed out (failed, earlier); torchrun then stopped r1 (terminated, later)
    ranks = (RankFacts(rank=0, last_ts=100.0, end_status="failed", end_exit_code=1, end_ts=110.0,
                       hang=HangFact("all_reduce", 11)),
             RankFacts(rank=1, last_ts=100.0, end_status="terminated", end_exit_code=143, end_ts=111.0,
                       hang=HangFact(None, 10)))
    verdict = decide_run(RunFacts(ranks=ranks, now=300.0, manifest_status="failed"))
    assert verdict.status is RunStatus.FAILED
    assert verdict.ranks == (RankState.ABORTED, RankState.FAILED)
    assert first_failure(ranks, verdict.ranks) == 1
    without = tuple(RankFacts(**{**r.__dict__, "hang": None}) for r in ranks)  # today's rule, for contrast
    assert decide_run(RunFacts(ranks=without, now=300.0, manifest_status="failed")).ranks == (
        RankState.FAILED, RankState.ABORTED)


def _hang_record(rank: int, step: int, *, collective=None, seq=None, stack=(), attempt=0) -> records.Hang:
    return records.Hang(v=1, run="r", rank=rank, attempt=attempt, step=step, ts=1.0, collective=collective, seq=seq,
                        stack=[records.Frame(*f) for f in stack])


def test_the_line_names_the_culprit_frame_and_where_the_others_wait():
    hangs = {0: _hang_record(0, 2, collective="all_reduce", seq=57,
                             stack=[("torch/distributed/distributed_c10d.py", 3252, "all_reduce", "work.wait", False),
                                    ("train.py", 50, "main", "dist.all_reduce", True)]),
             1: _hang_record(1, 2, seq=56, stack=[("train.py", 42, "main", "time.sleep", True),
                                                   ("train.py", 60, "<module>", "main", True)])}
    ranks = tuple(_rank(r, hang=HangFact(h.collective, h.seq)) for r, h in sorted(hangs.items()))
    report = hang_report(ranks, [RankState.STALLED] * 2, hangs)
    assert report is not None and report.culprits == (1,) and report.waiting == (0,)
    assert report.text == "r1 in train.py:42 `time.sleep`, not in all_reduce #57 (at #56); r0 waiting in all_reduce #57"
    assert report.frame == {"rank": 1, "file": "train.py", "line": 42, "func": "main", "call": "time.sleep"}


def test_a_hang_record_speaks_only_for_the_silence_it_was_written_in():
    hang = _hang_record(0, 7, attempt=1)
    assert current_hang(hang, 1, 7)
    assert not current_hang(hang, 1, 8)  # a step completed after it: it was a slow step, not a hang
    assert not current_hang(hang, 2, 7)  # an older attempt's


@given(st.one_of(st.binary(max_size=300), st.text(max_size=300),
                 st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.integers(), st.text(max_size=8),
                                                                st.lists(st.integers(), max_size=3)), max_size=6)))
def test_decode_hang_takes_any_input_and_returns_a_record_or_none(data):
    found = decode_hang(data)
    assert found is None or isinstance(found, records.Hang)


@given(st.integers(0, 2**31), st.one_of(st.none(), st.integers(0, 2**40)), st.sampled_from([None, "all_reduce"]))
def test_decode_hang_reads_back_what_the_sdk_encodes(step, seq, collective):
    rec = _hang_record(3, step, collective=collective, seq=seq, stack=[("a.py", 1, "f", None, True)])
    assert decode_hang(records.encode(rec)) == rec
    assert decode_hang(json.loads(records.encode(rec))) == rec


# --------------------------------------------------------------------------- the watchdog (a real session)


def _session(tmp_path: Path):
    from traceml_tui.sdk.session import Session

    return Session(tmp_path / "run", "wd", rank=0, world_size=1)


def _hang_lines(session) -> list[dict]:
    return [json.loads(line) for line in session.path.read_bytes().splitlines() if b'"kind":"hang"' in line]


def _wait(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_watchdog_writes_once_per_overrun_where_the_main_thread_is(tmp_path):
    from traceml_tui.sdk.watchdog import Watchdog

    session = _session(tmp_path)
    dog = Watchdog(session, floor_s=0.3, factor=5.0)
    session.watchdog = dog.start()
    try:
        for _ in range(5):
            state = session.begin(time.perf_counter())
            session.end(state, time.perf_counter(), True)
        state = session.begin(time.perf_counter())
        _wait(lambda: dog.fired == 1)
        time.sleep(0.9)  # still overrunning: no second record for the same hang
        assert dog.fired == 1
        session.end(state, time.perf_counter(), True)
        state = session.begin(time.perf_counter())  # progress, then a new overrun: a new record
        _wait(lambda: dog.fired == 2)
        session.end(state, time.perf_counter(), True)
    finally:
        session.close("completed")
    first, second = _hang_lines(session)
    assert (first["step"], second["step"]) == (5, 6)
    assert first["waited_s"] >= first["limit_s"] >= 0.3 and first["collective"] is None and first["seq"] is None
    # the innermost frame of the waiting main thread is this test's _wait, called from this test
    frames = [(f["file"], f["func"]) for f in first["stack"]]
    assert frames[0][1] == "_wait" and ("test_hang_forensics.py", "test_the_watchdog_writes_once_per_overrun_"
                                        "where_the_main_thread_is") in frames
    assert first["stack"][0]["call"] == "time.sleep"
    assert not any(f["file"].startswith("/") for h in (first, second) for f in h["stack"])


def test_a_closed_session_ends_its_watchdog_and_nothing_is_written_after(tmp_path):
    from traceml_tui.sdk.watchdog import Watchdog

    session = _session(tmp_path)
    dog = Watchdog(session, floor_s=0.2, factor=1.0)
    session.watchdog = dog.start()
    state = session.begin(time.perf_counter())
    session.end(state, time.perf_counter(), True)
    session.close("completed")
    time.sleep(0.6)
    assert dog.fired == 0 and not _hang_lines(session)
    dog._thread.join(timeout=10)
    assert not dog._thread.is_alive()


# --------------------------------------------------------------------------- real runs, every surface


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_tui", *args], capture_output=True, text=True, env=env,
                          timeout=180, check=False)


def _index(logs: Path, tmp_path: Path, env: dict, name: str) -> Path:
    index = tmp_path / f"{name}.sqlite"
    proc = _cli(["daemon", str(logs), "--once", "--index", str(index), "--no-inotify"], env)
    assert proc.returncode == 0, proc.stderr
    return index


def _hangs_of(run_dir: Path) -> dict[int, dict]:
    out = {}
    for path in run_dir.glob("ranks/rank_*/steps-*.jsonl"):
        for line in path.read_bytes().splitlines():
            rec = json.loads(line)
            if rec["kind"] == "hang":
                out[rec["rank"]] = rec
    return out


def _last_step_ts(run_dir: Path, rank: int) -> float:
    lines = (run_dir / "ranks" / f"rank_{rank}" / "steps-0.jsonl").read_bytes().splitlines()
    return max(json.loads(line)["ts"] for line in lines if b'"kind":"step"' in line)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.realruns("hang")
def test_while_it_hangs_every_surface_names_the_rank_that_never_arrived(real_runs, tmp_path, cli_env):
    run = real_runs["hang"]
    live_dir = run.live_copy / run.name
    hangs = _hangs_of(live_dir)
    assert set(hangs) == {0, 1}
    # written on overrun, long before the status says stalled twice over (the watchdog floor is 1 s)
    for rank, rec in hangs.items():
        assert rec["ts"] - _last_step_ts(live_dir, rank) < 2 * STALL_AFTER, rec
    assert hangs[0]["collective"] == "all_reduce" and hangs[1]["collective"] is None
    assert hangs[1]["seq"] < hangs[0]["seq"]
    frame = hangs[1]["stack"][0]
    assert (frame["file"], frame["line"], frame["call"], frame["user"]) == ("ddp_train.py", SLEEP_LINE,
                                                                          "time.sleep", True)

    index = _index(run.live_copy, tmp_path, cli_env, "live")
    time.sleep(STALL_AFTER * 1.2)  # a just-ingested silence is not yet a stall
    want_text = (f"r1 in ddp_train.py:{SLEEP_LINE} `time.sleep`, not in all_reduce #{hangs[0]['seq']} "
                 f"(at #{hangs[1]['seq']}); r0 waiting in all_reduce #{hangs[0]['seq']}")
    stall = ["--index", str(index), "--stall-after", str(STALL_AFTER)]

    as_json = json.loads(_cli(["status", "--json", *stall], cli_env).stdout)["runs"][0]
    assert as_json["status"] == "stalled" and as_json["rank_states"] == {"0": "waiting", "1": "stalled"}
    assert as_json["hang"]["culprits"] == [1] and as_json["hang"]["waiting"] == [0]
    assert as_json["hang"]["text"] == want_text

    oneline = _cli(["status", "--oneline", *stall], cli_env).stdout
    assert oneline.startswith("traceml: 1 stalled") and f"hang r1 ddp_train.py:{SLEEP_LINE}" in oneline
    assert "silent r1" in oneline and "r0" not in oneline.split("silent", 1)[1].split("·")[0]

    table = _cli(["status", *stall], cli_env).stdout
    assert f"{'stalled r1':<10}" in table and "stalled r0" not in table
    assert f"hang {run.name}: {want_text}" in table

    from daemon.metrics import IndexCollector

    families = {f.name: f for f in IndexCollector(str(index), stall_floor_s=STALL_AFTER).collect()}
    states = {s.labels["rank"]: s.labels["state"] for s in families["traceml_rank_state"].samples}
    assert states == {"0": "waiting", "1": "stalled"}
    roles = {(s.labels["rank"], s.labels["role"], s.labels["where"]) for s in families["traceml_rank_hang"].samples}
    assert roles == {("1", "culprit", f"ddp_train.py:{SLEEP_LINE}"), ("0", "waiting", "")}

    from traceml_tui.tui.source import IndexSource
    from traceml_tui.tui.widgets.failure_panel import failure_text
    from traceml_tui.tui.widgets.rank_table import rank_cells

    source = IndexSource(index, stall_floor_s=STALL_AFTER)  # the Run screen's data: rank words and failure panel
    try:
        detail = source.run_detail(source.runs().rows[0].run_id)
    finally:
        source.close()
    assert [(r.rank, r.state) for r in detail.ranks] == [(0, "waiting"), (1, "stalled")]
    assert "waiting" in rank_cells(detail.ranks[0])[2].plain
    assert detail.failure.rank == 1 and detail.failure.cause == "hang" and detail.failure.state == "stalled"
    assert want_text in failure_text(detail.failure).plain


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.realruns("hang")
def test_after_the_collective_timeout_the_summary_and_status_blame_the_hung_rank(real_runs, tmp_path, cli_env):
    run = real_runs["hang"]
    summary = json.loads((run.run_dir / "final_summary.json").read_text())
    failure = summary["failure"]
    assert (failure["rank"], failure["cause"], failure["state"], failure["victims"]) == (1, "hang", "failed", [0])
    assert failure["hang"]["culprits"] == [1] and failure["hang"]["collective"] == "all_reduce"
    assert f"ddp_train.py:{SLEEP_LINE} `time.sleep`" in failure["hang"]["text"]
    text = (run.run_dir / "final_summary.txt").read_text()
    assert failure["hang"]["text"] in text and "rank 1" in text

    index = _index(run.logs_dir, tmp_path, cli_env, "final")
    as_json = json.loads(_cli(["status", "--json", "--index", str(index)], cli_env).stdout)["runs"][0]
    assert as_json["status"] == "failed" and as_json["rank_states"] == {"0": "aborted", "1": "failed"}
    assert as_json["failure"]["rank"] == 1 and as_json["failure"]["hang"]["text"] == failure["hang"]["text"]
    table = _cli(["status", "--index", str(index)], cli_env).stdout
    assert "failed r1" in table and failure["hang"]["text"] in table
    assert "hang r1" in _cli(["status", "--oneline", "--index", str(index)], cli_env).stdout

    from traceml_tui.tui.source import IndexSource
    from traceml_tui.tui.widgets.failure_panel import failure_text

    source = IndexSource(index)
    try:
        detail = source.run_detail(source.runs().rows[0].run_id)
    finally:
        source.close()
    assert detail.failure.rank == 1 and detail.failure.cause == "hang"
    assert failure["hang"]["text"] in failure_text(detail.failure).plain


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_hung_run_stopped_with_sigterm_keeps_the_hang_in_its_summary(tmp_path, cli_env):
    """The usual end of a hang is a stop from outside (a scheduler's cancel or time limit comes long before a
    collective's timeout): the run is `interrupted`, and its summary said only that, while `traceml status` and
    the metrics named the rank that never arrived (found trying the product). The hang is its failure."""
    import signal as signals

    env = dict(cli_env, TRACEML_HANG_FLOOR_S="1", OMP_NUM_THREADS="1")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "traceml_tui", "run", str(realruns.DDP_SCRIPT), "--nproc-per-node", "2",
         "--run-name", "hterm", "--logs-dir", str(tmp_path / "logs"), "--args", "--steps", "6", "--hang-at", "3",
         "--hang-s", "300", "--timeout", "600"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run_dir = tmp_path / "logs" / "hterm"
    try:
        deadline = time.monotonic() + 120
        while set(_hangs_of(run_dir)) != {0, 1} if run_dir.is_dir() else True:
            assert launcher.poll() is None and time.monotonic() < deadline, "no hang record of each rank"
            time.sleep(0.1)
        launcher.send_signal(signals.SIGTERM)
        assert launcher.wait(timeout=120) == 143
    finally:
        launcher.kill()
        launcher.wait()
    summary = json.loads((run_dir / "final_summary.json").read_text())
    assert summary["run_context"]["run"]["status"] == "interrupted"
    failure = summary["failure"]
    assert (failure["rank"], failure["cause"], failure["victims"]) == (1, "hang", [0])
    assert f"ddp_train.py:{SLEEP_LINE} `time.sleep`" in failure["hang"]["text"]
    assert failure["hang"]["text"] in (run_dir / "final_summary.txt").read_text()
    index = _index(tmp_path / "logs", tmp_path, cli_env, "term")
    as_json = json.loads(_cli(["status", "--json", "--index", str(index)], cli_env).stdout)["runs"][0]
    assert as_json["failure"]["hang"]["text"] == failure["hang"]["text"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_thousand_steps_without_a_hang_write_no_hang_record(tmp_path, cli_env):
    """Real 2-rank DDP, 1,000 tiny steps, the watchdog armed with a 2 s floor (the hang case fires at 1 s)."""
    env = dict(cli_env, TRACEML_HANG_FLOOR_S="2")
    proc = subprocess.run([sys.executable, "-m", "traceml_tui", "run", str(realruns.DDP_SCRIPT), "--run-name", "k",
                           "--logs-dir", str(tmp_path / "logs"), "--nproc-per-node", "2", "--args", "--steps", "1000",
                           "--batch-size", "2"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    streams = sorted((tmp_path / "logs" / "k" / "ranks").glob("rank_*/steps-*.jsonl"))
    assert len(streams) == 2
    for path in streams:
        kinds = [json.loads(line)["kind"] for line in path.read_bytes().splitlines()]
        assert kinds.count("step") == 1000 and "hang" not in kinds


# --------------------------------------------------------------------------- torch's flight recorder


@pytest.fixture
def fr_dumps(tmp_path_factory, cli_env) -> Path:
    """Real flight-recorder dumps of a 2-rank gloo run: r0 inside all_reduce #4, r1 never issued it."""
    env = dict(cli_env, TORCH_FR_BUFFER_SIZE="100")
    for _attempt in range(2):
        folder = tmp_path_factory.mktemp("fr")
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               str(realruns.SCRIPTS / "fr_dump.py"), str(folder / "fr_")], capture_output=True,
                              text=True, env=env, cwd=folder, timeout=300)
        # torch 2.13's gloo sometimes aborts a rank at interpreter exit ("terminate called without an active
        # exception", docs/trainers.md): not this test's subject, so such a run is made once more
        if proc.returncode == 0 or "terminate called without an active exception" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_flight_recorder_dumps_name_the_rank_that_never_issued_the_collective(fr_dumps, tmp_path):
    from traceml_tui.core import flight_recorder
    from traceml_tui.run.failure import rank_trail, with_flight_recorder
    from traceml_tui.sdk.session import Session

    hangs = {}
    for rank in (0, 1):
        dump = flight_recorder.read_dump_file(str(fr_dumps / f"fr_{rank}"))
        assert dump is not None and dump["entries"]
        hangs[rank] = flight_recorder.hang_from_dump(dump, run="r", rank=rank, attempt=0, step=3, ts=1.0)
    assert (hangs[0].collective, hangs[0].seq) == ("all_reduce", 4)
    assert (hangs[1].collective, hangs[1].seq, hangs[1].stack) == (None, 3, [])
    assert ("fr_dump.py", "main") in [(f.file, f.func) for f in hangs[0].stack]
    assert not any(f.file.startswith("/") for f in hangs[0].stack)
    ranks = tuple(_rank(r, hang=HangFact(h.collective, h.seq)) for r, h in sorted(hangs.items()))
    report = hang_report(ranks, [RankState.STALLED] * 2, hangs)
    assert report is not None and report.text == "r1, not in all_reduce #4 (at #3); r0 waiting in all_reduce #4"

    # the launcher's side: a rank without a hang record of its own gets its dump's, when the recorder is on
    # and the dump is newer than the attempt (an older one in a shared temp folder is another run's)
    env = {"TORCH_FR_BUFFER_SIZE": "100", "TORCH_FR_DUMP_TEMP_FILE": str(fr_dumps / "fr_")}
    for rank in (0, 1):
        os.utime(fr_dumps / f"fr_{rank}", (time.time() + 5, time.time() + 5))
        session = Session(tmp_path / "run", "r", rank=rank, world_size=2)
        session.close("failed", 1)
        trail = with_flight_recorder(rank_trail(session.path, rank), session.path, 0, env)
        assert trail.hang is not None and trail.hang.seq == hangs[rank].seq
        assert with_flight_recorder(rank_trail(session.path, rank), session.path, 0, {}).hang is None  # off
        os.utime(fr_dumps / f"fr_{rank}", (1.0, 1.0))
        assert with_flight_recorder(rank_trail(session.path, rank), session.path, 0, env).hang is None  # stale


class _Foreign:
    pass


@given(st.binary(max_size=400))
def test_a_dump_is_any_bytes_and_loads_as_a_plain_dict_or_nothing(data):
    from traceml_tui.core import flight_recorder

    dump = flight_recorder.load_dump(data)
    assert dump is None or (isinstance(dump, dict) and isinstance(dump["entries"], list))
    if dump is not None:
        flight_recorder.hang_from_dump(dump, run="r", rank=0, attempt=0, step=0, ts=0.0)


@given(st.lists(st.dictionaries(st.sampled_from(["record_id", "collective_seq_id", "profiling_name", "state",
                                                 "retired", "frames", "process_group", "is_p2p"]),
                                st.one_of(st.none(), st.integers(-5, 2**70), st.text(max_size=12), st.booleans(),
                                          st.lists(st.dictionaries(st.text(max_size=8), st.integers()), max_size=2))),
                max_size=6))
def test_any_entries_give_a_hang_record_or_none_and_never_raise(entries):
    from traceml_tui.core import flight_recorder

    data = pickle.dumps({"version": "2.10", "entries": entries})
    hang = flight_recorder.hang_from_dump(flight_recorder.load_dump(data), run="r", rank=0, attempt=0, step=0,
                                          ts=0.0)
    assert hang is None or isinstance(hang, records.Hang)


def test_a_dump_that_names_a_class_or_a_function_is_refused():
    from traceml_tui.core import flight_recorder

    assert flight_recorder.load_dump(pickle.dumps({"entries": [_Foreign()]})) is None
    assert flight_recorder.load_dump(pickle.dumps({"entries": [os.getcwd]})) is None
    assert flight_recorder.load_dump(pickle.dumps({"entries": []})) == {"entries": []}


def _trail(rank: int, end: str | None, code: int | None, end_ts: float | None, hang: records.Hang | None):
    from traceml_tui.core.forensics import RankTrail

    return RankTrail(rank=rank, node=0, last_step=2, last_ts=100.0, end_status=end, end_exit_code=code,
                     end_ts=end_ts, hang=hang)


def test_the_failure_section_blames_the_culprit_and_keeps_a_cause_of_its_own():
    from traceml_tui.core.forensics import NodeLog, diagnose

    waiting = _hang_record(0, 2, collective="all_reduce", seq=11)
    timeout = NodeLog(0, "nodes/node_0/training.stderr.log",
                      "[rank0]: Traceback (most recent call last):\n[rank0]: RuntimeError: gloo Timed out waiting\n")
    # torchrun stopped the sleeping rank after its peer's timeout: the cause is the hang
    stopped = diagnose([_trail(0, "failed", 1, 110.0, waiting), _trail(1, "terminated", 143, 111.0,
                                                                       _hang_record(1, 2, seq=10))], [timeout],
                       exit_code=1)
    assert (stopped.rank, stopped.cause, stopped.victims) == (1, "hang", (0,))
    assert stopped.hang["text"].startswith("r1, not in all_reduce #11 (at #10); r0 waiting")
    # a rank SIGKILLed (no end record, no hang record) while its peer waited: blamed, and its cause stays
    killed = diagnose([_trail(0, "failed", 1, 110.0, waiting), _trail(1, None, None, None, None)], [timeout],
                      exit_code=1)
    assert (killed.rank, killed.cause, killed.victims) == (1, "killed", (0,))
    assert killed.hang["text"] == "r1 silent, no hang record, not in all_reduce #11; r0 waiting in all_reduce #11"
