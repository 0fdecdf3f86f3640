"""Failure forensics (core/forensics.py) and the culprit/victim rank rule (core/state.py), pure.

Stderr samples below are hand-written on purpose: varied and malformed input
(interleaved ranks, chained exceptions, cut tails, foreign text). The real
runs are checked in tests/test_failure_forensics.py.
"""

from __future__ import annotations

import pytest

from traceml_tui.core import artifacts, forensics
from traceml_tui.core.forensics import NodeLog, RankTrail, classify, diagnose, parse_stderr, scrub, section_lines
from traceml_tui.core.state import RankFacts, RankState, RunFacts, RunStatus, decide_run, first_failure

TORCHRUN_BLOCK = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/home/alice/proj/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_16:29:47
  host      : gpu-node-17.cluster.example.org
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 1961)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 1961
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_16:29:47
  host      : gpu-node-17.cluster.example.org
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 1960)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_rank_prefixed_tracebacks_are_attributed_and_the_last_line_is_the_exception() -> None:
    text = (
        "[rank1]: Traceback (most recent call last):\n"
        "[rank0]: Traceback (most recent call last):\n"  # interleaved with rank 1's
        "[rank1]:   File \"/home/alice/train.py\", line 74, in main\n"
        "[rank1]:     raise RuntimeError(\"CUDA out of memory (simulated)\")\n"
        "[rank0]:   File \"/home/alice/train.py\", line 75, in main\n"
        "[rank0]:            ^^^^^^^^^^^^\n"
        "[rank1]: RuntimeError: CUDA out of memory (simulated)\n"
        "[rank0]: RuntimeError: [/__w/pytorch/third_party/gloo/transport/tcp/pair.cc:553] Connection closed by "
        "peer [10.1.2.3]:49291. This is typically caused by a remote worker crashing.\n"
        "W1130 16:29:41.351000 1767 api.py:1028] Sending process 1805 closing signal SIGTERM\n"
    )
    reports = parse_stderr(text)
    assert reports[1].exceptions == ("RuntimeError: CUDA out of memory (simulated)",)
    assert classify(reports[1].exceptions) == "cuda-oom"
    assert classify(reports[0].exceptions) == "peer-lost"


def test_torchrun_report_gives_each_rank_its_exit_code_and_signal() -> None:
    reports = parse_stderr(TORCHRUN_BLOCK)
    assert (reports[3].exit_code, reports[3].signal) == (-9, "SIGKILL")
    assert (reports[2].exit_code, reports[2].signal) == (1, None)
    assert reports[3].exceptions == ()


def test_chained_exceptions_keep_every_line_and_the_raised_one_last() -> None:
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n\n"
            "The above exception was the direct cause of the following exception:\n\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
            "mylib.TrainingAborted: step 5 failed\n")
    (report,) = parse_stderr(text, single_rank=0).values()
    assert report.exceptions[-1] == "mylib.TrainingAborted: step 5 failed"
    assert classify(report.exceptions) == "cuda-oom"  # the cause is found in the chain


@pytest.mark.parametrize("lines,signal,cause", [
    (["torch.distributed.DistBackendError: [Rank 0] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out."], None, "comm-timeout"),
    (["RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms "
      "for recv operation to complete"], None, "comm-timeout"),
    (["RuntimeError: NCCL communicator was aborted on rank 1."], None, "peer-lost"),
    (["ValueError: bad shape"], None, "exception"),
    (["KeyboardInterrupt"], None, "exception"),
    ([], "SIGKILL", "killed"),
    ([], "SIGSEGV", "crash"),
    ([], "SIGTERM", "signal"),
    ([], None, "unknown"),
])
def test_classify(lines, signal, cause) -> None:
    assert cause in forensics.CAUSES
    assert classify(lines, signal) == cause


@pytest.mark.parametrize("text", ["", "\x00\x01garbage\n[rankX]: nope\n", "Traceback (most recent call last):\n",
                                  "[rank2]:   File \"cut-off", "rank : 1\nexitcode : nan\n"])
def test_malformed_stderr_yields_no_evidence_and_no_error(text) -> None:
    for report in parse_stderr(text).values():
        assert report.exceptions == () and report.signal is None


def test_scrub_removes_paths_addresses_and_host_names_and_caps() -> None:
    line = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/pair.cc:553] Connection closed by peer "
            "[127.0.0.1]:49291 on gpu-node-17 (C:\\Users\\bob\\x.py, [fe80::1], db.example.org:5432)")
    out = scrub(line, hosts=["gpu-node-17"])
    for gone in ("/__w", "127.0.0.1", "gpu-node-17", "Users", "fe80", "db.example.org"):
        assert gone not in out
    assert "pair.cc:553" in out and "x.py" in out
    long = scrub("E: " + "x" * 500)
    assert len(long) == forensics.MAX_LINE and long.endswith("…")


def _facts(*ranks: RankFacts, manifest: str | None = "failed") -> RunFacts:
    return RunFacts(ranks=ranks, now=1000.0, manifest_status=manifest, last_ingest=1000.0)


def test_the_rank_that_died_silently_is_the_culprit_and_its_peer_is_aborted() -> None:
    # rank 1 SIGKILLed after step 4 (no end record); rank 0 failed in the next all-reduce
    facts = _facts(RankFacts(0, last_ts=10.5, end_status="failed", end_exit_code=1, end_ts=10.5),
                   RankFacts(1, last_ts=10.0))
    verdict = decide_run(facts)
    assert verdict.status is RunStatus.FAILED
    assert verdict.ranks == (RankState.ABORTED, RankState.LOST)
    assert first_failure(facts.ranks, verdict.ranks) == 1


def test_the_first_end_record_names_the_culprit() -> None:
    facts = _facts(RankFacts(0, last_ts=9.0, end_status="failed", end_exit_code=1, end_ts=10.046),
                   RankFacts(1, last_ts=9.0, end_status="failed", end_exit_code=1, end_ts=10.0),
                   RankFacts(2, last_ts=9.0, end_status="exited", end_ts=10.2))
    assert decide_run(facts).ranks == (RankState.ABORTED, RankState.FAILED, RankState.COMPLETED)


def test_one_failed_rank_alone_is_failed_and_live_peers_keep_running() -> None:
    facts = _facts(RankFacts(0, last_ts=999.0), RankFacts(1, last_ts=998.0, end_status="failed", end_ts=998.0),
                   manifest=None)
    verdict = decide_run(facts)
    assert verdict.ranks == (RankState.RUNNING, RankState.FAILED) and verdict.status is RunStatus.FAILED


def test_diagnose_names_culprit_victims_cause_and_log() -> None:
    trails = [RankTrail(0, node=0, last_step=4, last_ts=10.5, end_status="failed", end_exit_code=1, end_ts=10.5),
              RankTrail(1, node=0, last_step=4, last_ts=10.0)]
    log = NodeLog(0, "nodes/node_0/training.stderr.log",
                  "[rank0]: RuntimeError: Connection reset by peer\n" + TORCHRUN_BLOCK.replace("rank      : 3",
                                                                                             "rank      : 1"))
    failure = diagnose(trails, [log], exit_code=1)
    assert (failure.rank, failure.node, failure.step, failure.state) == (1, 0, 5, "lost")
    assert (failure.cause, failure.signal, failure.victims) == ("killed", "SIGKILL", (0,))
    assert failure.log == "nodes/node_0/training.stderr.log"
    section = failure.to_dict()
    assert artifacts.decode_failure({"failure": section}).victims == [0]
    assert forensics.section_lines(section)[-1] == "r0 aborted after r1 · log: nodes/node_0/training.stderr.log"


def test_no_rank_records_the_log_still_says_why() -> None:
    log = NodeLog(0, "nodes/node_0/training.stderr.log",
                  "Traceback (most recent call last):\n  File \"/home/alice/t.py\", line 1\n"
                  "ModuleNotFoundError: No module named 'mylib'\n")
    failure = diagnose([], [log], exit_code=1)
    assert failure.rank is None and failure.cause == "exception"
    assert failure.exception == "ModuleNotFoundError: No module named 'mylib'"


def test_a_clean_run_has_no_failure() -> None:
    trails = [RankTrail(0, last_step=8, last_ts=5.0, end_status="exited", end_ts=5.0)]
    assert diagnose(trails, [NodeLog(0, "nodes/node_0/training.stderr.log", "warning: something\n")],
                    exit_code=0) is None


def test_decode_failure_reads_only_a_valid_section() -> None:
    assert artifacts.decode_failure(b'{"failure": null}') is None
    assert artifacts.decode_failure(b'{"failure": {"rank": "one"}}') is None
    assert artifacts.decode_failure(b"not json") is None
    assert artifacts.decode_failure(b'{"failure": {"cause": "cuda-oom", "rank": 1}}').rank == 1


def test_sigterm_is_stopped_from_outside_and_after_a_failure_it_is_aborted() -> None:
    # rank 1 raised; torchrun then SIGTERMed rank 0, whose SDK wrote rank_end "terminated"
    facts = _facts(RankFacts(0, last_ts=9.0, end_status="terminated", end_exit_code=143, end_ts=10.2),
                   RankFacts(1, last_ts=9.0, end_status="failed", end_exit_code=1, end_ts=10.0))
    assert decide_run(facts).ranks == (RankState.ABORTED, RankState.FAILED)
    # alone (a scheduler's SIGTERM), a terminated rank is interrupted, not failed
    alone = _facts(RankFacts(0, last_ts=9.0, end_status="terminated", end_exit_code=143, end_ts=10.2),
                   manifest="interrupted")
    assert decide_run(alone).ranks == (RankState.INTERRUPTED,)


def test_a_run_whose_launcher_died_is_lost_after_the_stall_limit() -> None:
    ranks = (RankFacts(0, last_ts=100.0, end_status="terminated", end_exit_code=143, end_ts=100.5),
             RankFacts(1, last_ts=100.0, end_status="terminated", end_exit_code=143, end_ts=100.6))

    def verdict(now: float, **kw):
        return decide_run(RunFacts(ranks=ranks, now=now, last_ingest=100.6, median_interval_s=0.05, **kw))

    assert verdict(110.0).status is RunStatus.INTERRUPTED  # within the stall limit the launcher may still finalize
    assert verdict(140.0).status is RunStatus.LOST  # 30 s after the last end and no final word: the launcher died
    assert verdict(140.0, manifest_status="interrupted").status is RunStatus.INTERRUPTED  # it did finalize
    clean = tuple(RankFacts(r.rank, last_ts=100.0, end_status="exited", end_ts=100.5) for r in ranks)
    # ranks that ended on their own: the launcher may be draining validation; no SIGTERM, no verdict of lost
    assert decide_run(RunFacts(ranks=clean, now=1000.0, last_ingest=100.6)).status is RunStatus.COMPLETED


def _exit_block(rank: int, code: int) -> str:
    """A torchrun ChildFailedError entry for one rank (the shape of TORCHRUN_BLOCK's)."""
    return f"Root Cause (first observed failure):\n[0]:\n  rank      : {rank} (local_rank: {rank})\n" \
           f"  exitcode  : {code} (pid: 1)\n"


def _exited(rank: int, ts: float) -> RankTrail:
    return RankTrail(rank=rank, node=0, last_step=4, last_ts=ts, end_status="exited", end_ts=ts)


def test_sys_exit_code_from_torchrun_makes_the_rank_the_failure():
    """rank 1 called sys.exit(3) (rank_end `exited`, no code); torchrun then stopped rank 0 (terminated)."""
    trails = [RankTrail(rank=0, node=0, last_step=4, last_ts=11.0, end_status="terminated", end_exit_code=143,
                        end_ts=11.0), _exited(1, 10.0)]
    log = NodeLog(0, "nodes/node_0/training.stderr.log", _exit_block(1, 3) + _exit_block(0, -15))
    failure = diagnose(trails, [log], exit_code=1)
    assert (failure.rank, failure.exit_code, failure.cause, failure.victims) == (1, 3, "exit-code", (0,))


@pytest.mark.parametrize("code", [-6, -11, 134])
def test_a_crash_in_the_teardown_after_sys_exit_makes_the_rank_the_failure(code):
    """rank 1 called sys.exit(3) mid-training and gloo aborted it on the way out (torchrun: exitcode -6,
    SIGABRT); rank 0 then raised 'Connection closed by peer' 30 ms later. Rank 1 left first: it is the
    failure, not the peer whose exception came after (seen on a loaded CI machine)."""
    trails = [RankTrail(rank=0, node=0, last_step=4, last_ts=10.0, end_status="failed", end_exit_code=1,
                        end_ts=10.03), _exited(1, 10.0)]
    log = NodeLog(0, "nodes/node_0/training.stderr.log", _exit_block(0, 1) + _exit_block(1, code))
    failure = diagnose(trails, [log], exit_code=1)
    assert (failure.rank, failure.state, failure.cause, failure.victims) == (1, "failed", "crash", (0,))


def test_a_stop_signal_after_the_ranks_own_failed_end_is_not_how_it_ended():
    """rank 1 raised (rank_end failed, code 1) and was still tearing down when torchrun, having seen rank 0's
    exit first, SIGTERMed it (report: -15; seen on a loaded CI machine): its own end says how it ended."""
    trails = [RankTrail(rank=0, node=0, last_step=4, last_ts=10.0, end_status="failed", end_exit_code=1,
                        end_ts=10.05),
              RankTrail(rank=1, node=0, last_step=4, last_ts=10.0, end_status="failed", end_exit_code=1,
                        end_ts=10.01)]
    text = "[rank1]: Traceback (most recent call last):\n[rank1]: RuntimeError: CUDA out of memory (simulated)\n"
    log = NodeLog(0, "nodes/node_0/training.stderr.log", text + _exit_block(0, 1) + _exit_block(1, -15))
    failure = diagnose(trails, [log], exit_code=1)
    assert (failure.rank, failure.cause, failure.exit_code, failure.signal) == (1, "cuda-oom", 1, None)


def test_a_resumed_run_that_ends_cleanly_ignores_the_crashed_attempts_report():
    """--resume appends to the node's stderr log: the crashed attempt's report is still in the tail."""
    log = NodeLog(0, "nodes/node_0/training.stderr.log", _exit_block(1, 3) + _exit_block(0, -15))
    assert diagnose([_exited(0, 20.0), _exited(1, 20.0)], [log], exit_code=0) is None


def test_the_newest_report_in_an_appended_log_wins():
    reports = parse_stderr(_exit_block(1, 3) + "later attempt\n" + _exit_block(1, 7))
    assert reports[1].exit_code == 7


def test_a_one_process_run_with_stderr_noise_still_gets_its_exit_code():
    log = NodeLog(0, "nodes/node_0/training.stderr.log", "train.py:3: UserWarning: something odd\n")
    failure = diagnose([_exited(0, 10.0)], [log], exit_code=3)
    assert (failure.rank, failure.state, failure.exit_code, failure.cause) == (0, "failed", 3, "exit-code")


def test_a_rank_stopped_by_a_signal_after_its_clean_end_is_not_the_culprit():
    """Rank 0 ended (`exited`) but was still tearing down when rank 1 raised; torchrun's SIGTERM (-15) to it
    must not make it the first failure."""
    trails = [_exited(0, 10.0), RankTrail(rank=1, node=0, last_step=5, last_ts=12.0, end_status="failed",
                                          end_exit_code=1, end_ts=12.0)]
    log = NodeLog(0, "nodes/node_0/training.stderr.log", _exit_block(1, 1) + _exit_block(0, -15))
    failure = diagnose(trails, [log], exit_code=1)
    assert failure.rank == 1


def _returned(rank: int, ts: float) -> RankTrail:
    """A rank whose script returned under the bootstrap (rank_end ``completed``, no code) after step 4."""
    return RankTrail(rank=rank, node=0, last_step=4, last_ts=ts, end_status="completed", end_ts=ts)


def test_a_crash_after_every_script_returned_reads_as_training_completed():
    """Both ranks' scripts returned after step 4; then gloo aborted rank 1 at interpreter exit and torchrun
    stopped rank 0 (already ended): a crash in teardown, after the last step — not a failure "in step 5"."""
    log = NodeLog(0, "nodes/node_0/training.stderr.log", _exit_block(1, -6) + _exit_block(0, -15))
    failure = diagnose([_returned(0, 10.0), _returned(1, 10.0)], [log], exit_code=1)
    assert (failure.rank, failure.state, failure.cause, failure.signal) == (1, "failed", "teardown-crash", "SIGABRT")
    assert (failure.step, failure.last_step, failure.victims) == (None, 4, ())
    first, *rest = section_lines(failure.to_dict())
    assert first == ("rank 1 on node 0, after its last step (4) — teardown-crash (training completed: every "
                     "rank's script returned, then the process crashed while shutting down)")
    assert rest[0] == "SIGABRT"


def test_a_crash_at_exit_after_sys_exit_stays_a_crash_in_the_step_after():
    """The same abort after an ``exited`` end (the exit hook's word, which also follows sys.exit(3)) or while a
    peer failed in training is not known to come after training: the cause stays ``crash``."""
    log = NodeLog(0, "nodes/node_0/training.stderr.log", _exit_block(1, -6))
    failure = diagnose([_returned(0, 10.0), _exited(1, 10.0)], [log], exit_code=1)
    assert (failure.rank, failure.cause, failure.step) == (1, "crash", 5)
    peer_failed = RankTrail(rank=0, node=0, last_step=4, last_ts=10.2, end_status="failed", end_exit_code=1,
                            end_ts=10.2)
    log = NodeLog(0, "nodes/node_0/training.stderr.log", _exit_block(1, -6) + _exit_block(0, 1))
    failure = diagnose([peer_failed, _returned(1, 10.0)], [log], exit_code=1)
    assert (failure.rank, failure.cause, failure.step, failure.victims) == (1, "crash", 5, (0,))
