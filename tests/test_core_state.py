"""The pure state rules of traceml_tui.core.state, case by case (the real-run proof is test_status_surfaces)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceml_tui.core import records
from traceml_tui.core.rundir import RunDir
from traceml_tui.core.state import (
    BacklogState,
    RankFacts,
    RankState,
    RunFacts,
    RunStatus,
    claim_is_stale,
    crashed_in_teardown,
    decide_backlog,
    decide_run,
    rank_end_state,
    stall_limit_s,
)

from support import fixture_runs as fr

NOW = 1_000_000.0


@pytest.mark.parametrize("status, code, want", [
    ("exited", None, RankState.COMPLETED),  # what the SDK writes after a normal return
    ("exited", 0, RankState.COMPLETED),
    ("completed", None, RankState.COMPLETED),  # traceml.finish()
    ("exited", 3, RankState.FAILED),
    ("failed", 1, RankState.FAILED),
    ("failed", None, RankState.FAILED),
    ("interrupted", 1, RankState.INTERRUPTED),
    ("something-new", None, RankState.FAILED),  # an unknown end is not a clean one
])
def test_rank_end_words(status, code, want):
    assert rank_end_state(status, code) is want


def _run(*ranks: RankFacts, **kw) -> RunFacts:
    kw.setdefault("median_interval_s", 0.1)
    kw.setdefault("last_ingest", NOW - 100)
    return RunFacts(ranks=tuple(ranks), now=kw.pop("now", NOW), **kw)


def ended(rank: int, status: str = "exited", code=None, at: float = NOW - 50) -> RankFacts:
    return RankFacts(rank, last_ts=at, end_status=status, end_exit_code=code, end_ts=at)


def live(rank: int, last: float, seen: float | None = None, **kw) -> RankFacts:
    return RankFacts(rank, last_ts=last, last_seen=seen, **kw)


def test_a_normal_finish_is_completed_with_or_without_a_manifest():
    assert decide_run(_run(ended(0), ended(1), manifest_status="completed")).status is RunStatus.COMPLETED
    assert decide_run(_run(ended(0), ended(1))).status is RunStatus.COMPLETED  # SDK-only run, no launcher


def test_the_launchers_final_word_is_kept_but_a_failed_rank_or_outcome_makes_a_completed_launch_failed():
    assert decide_run(_run(ended(0), manifest_status="interrupted")).status is RunStatus.INTERRUPTED
    assert decide_run(_run(ended(0), manifest_status="failed")).status is RunStatus.FAILED
    assert decide_run(_run(ended(0, "failed", 1), manifest_status="completed")).status is RunStatus.FAILED
    assert decide_run(_run(ended(0), manifest_status="completed",
                           guard_training_status="incomplete")).status is RunStatus.FAILED
    assert decide_run(_run(ended(0), summary_status="completed")).status is RunStatus.COMPLETED


def test_a_rank_without_an_end_is_lost_once_nothing_more_can_come():
    # the launcher finished
    verdict = decide_run(_run(ended(0, "failed", 1), live(1, NOW - 60), manifest_status="failed"))
    # rank 1 went silent (NOW - 60) before rank 0 failed (NOW - 50): rank 1 is the culprit, rank 0 aborted after it
    assert (verdict.status, verdict.ranks) == (RunStatus.FAILED, (RankState.ABORTED, RankState.LOST))
    verdict = decide_run(_run(ended(0, "failed", 1), live(1, NOW - 40), manifest_status="failed"))
    assert verdict.ranks == (RankState.FAILED, RankState.ABORTED)  # rank 0 failed first; rank 1 died after it
    # its node's outcome is written
    assert decide_ranks_of(live(0, NOW - 1, node_outcome_written=True))[0] is RankState.LOST
    # every other rank ended and it stayed silent a stall limit after: the run is lost, not running
    verdict = decide_run(_run(ended(0, at=NOW - 100), live(1, NOW - 101, seen=NOW - 100)))
    assert (verdict.status, verdict.ranks[1]) == (RunStatus.LOST, RankState.LOST)


def decide_ranks_of(*ranks: RankFacts) -> tuple[RankState, ...]:
    return decide_run(_run(*ranks)).ranks


def test_a_failed_rank_fails_a_live_run_at_once():
    verdict = decide_run(_run(ended(1, "failed", 1, at=NOW - 0.5), live(0, NOW - 0.5, seen=NOW - 0.4),
                              last_ingest=NOW - 0.4))
    assert (verdict.status, verdict.ranks) == (RunStatus.FAILED, (RankState.FAILED, RankState.RUNNING))


def test_stall_limit_is_one_rule_with_one_default():
    assert stall_limit_s(None) == 30.0
    assert stall_limit_s(0.05) == 30.0
    assert stall_limit_s(10.0) == 100.0  # a slow model is not called stalled
    assert stall_limit_s(0.05, floor_s=0.0) == pytest.approx(0.5)


def test_stalled_against_the_others_or_against_now_only_when_the_ingester_is_not_behind():
    # one rank fell behind the others by more than the limit
    ranks = decide_ranks_of(live(0, NOW - 1, seen=NOW - 1), live(1, NOW - 40, seen=NOW - 40))
    assert ranks == (RankState.RUNNING, RankState.STALLED)
    # every rank silent (a hung collective), the ingester idle too
    assert set(decide_ranks_of(live(0, NOW - 40), live(1, NOW - 40))) == {RankState.STALLED}
    # every rank silent by record time, but the ingester is busy (stored something of the run just now) and
    # stored these records soon after they were written: it may be behind, not a stall
    facts = _run(live(0, NOW - 40, seen=NOW - 39), live(1, NOW - 40, seen=NOW - 39), last_ingest=NOW - 1)
    assert set(decide_run(facts).ranks) == {RankState.RUNNING}
    # … unless it found them that silent when it read their files to the end (an old hung run, fresh index)
    facts = _run(live(0, NOW - 400, seen=NOW - 1), live(1, NOW - 400, seen=NOW - 1), last_ingest=NOW - 1)
    assert decide_run(facts).status is RunStatus.STALLED


def test_missing_wins():
    assert decide_run(_run(ended(0), manifest_status="completed", missing=True)).status is RunStatus.MISSING


@pytest.mark.parametrize("kw, want", [
    (dict(has_receipt=True, has_claim=True, claim_stale=False, failures=5), BacklogState.COMPLETED),
    (dict(has_receipt=False, has_claim=True, claim_stale=False, failures=0), BacklogState.CLAIMED),
    (dict(has_receipt=False, has_claim=True, claim_stale=True, failures=0), BacklogState.STALE_CLAIM),
    (dict(has_receipt=False, has_claim=False, claim_stale=False, failures=1), BacklogState.FAILED),
    (dict(has_receipt=False, has_claim=False, claim_stale=False, failures=3), BacklogState.BLOCKED),
    (dict(has_receipt=False, has_claim=False, claim_stale=False, failures=3, max_attempts=5), BacklogState.FAILED),
    (dict(has_receipt=False, has_claim=False, claim_stale=False, failures=0), BacklogState.PENDING),
])
def test_backlog_words(kw, want):
    assert decide_backlog(**kw) is want


def test_a_claim_is_stale_by_its_owner_here_and_by_its_heartbeat_elsewhere():
    assert claim_is_stale(heartbeat=NOW, lease_s=30, now=NOW, owner_alive=False)
    assert not claim_is_stale(heartbeat=NOW - 999, lease_s=30, now=NOW, owner_alive=True)
    assert not claim_is_stale(heartbeat=NOW - 10, lease_s=30, now=NOW, owner_alive=None)
    assert claim_is_stale(heartbeat=NOW - 31, lease_s=30, now=NOW, owner_alive=None)
    assert claim_is_stale(heartbeat=None, lease_s=30, now=NOW, owner_alive=None)


def _shape(path: Path) -> list[tuple]:
    """Each line's kind and keys (and a rank_end's status): what the SDK writes, without the values."""
    out = []
    for line in path.read_bytes().splitlines():
        body = json.loads(line)
        out.append((body["kind"], tuple(sorted(body)), body.get("status") if body["kind"] == "rank_end" else None))
    return out


@pytest.mark.slow
def test_committed_fixture_runs_still_read_as_the_sdk_writes_today(real_runs):
    """The snapshot fixtures are real runs; if the SDK's records change shape, regenerate them (see their README)."""
    fresh = RunDir(real_runs["completed"].run_dir)
    committed = RunDir(fr.FIXTURE_RUNS / fr.name_of("completed"))
    for stream in committed.step_files():
        assert _shape(stream.path) == _shape(fresh.steps_file(stream.rank, stream.attempt)), stream.path
    assert set(json.loads(committed.manifest.read_text())) == set(json.loads(fresh.manifest.read_text()))
    for stream in committed.step_files():
        for line in stream.path.read_bytes().splitlines():
            records.decode(line)  # every committed line is a valid record of today's schema


@pytest.mark.parametrize("ends, want", [
    # (status, code) per rank, codes as core.state.with_exit_codes leaves them (the launcher's stood in)
    ((("completed", -6), ("completed", None)), True),  # rank 0's script returned, then gloo aborted it at exit
    ((("completed", 134), ("exited", None)), True),  # a shell's 128+6; a peer ended by the exit hook alone
    ((("completed", -11), ("completed", -6)), True),  # both crashed after training
    ((("exited", -6), ("completed", None)), False),  # `exited` also follows sys.exit(3): not known to be clean
    ((("completed", -6), ("failed", 1)), False),  # a peer failed in training
    ((("completed", -6), ("terminated", 143)), False),  # a peer stopped before its script returned
    ((("completed", -6), (None, None)), False),  # a peer never ended
    ((("completed", 3), ("completed", None)), False),  # a code, not a crash signal
    ((("completed", -15), ("completed", None)), False),  # a stop signal from outside, not a crash
    ((("completed", None), ("completed", None)), False),  # nothing crashed
])
def test_a_crash_after_every_script_returned_is_a_teardown_crash(ends, want):
    ranks = [RankFacts(i, last_ts=NOW, end_status=status, end_exit_code=code, end_ts=NOW if status else None)
             for i, (status, code) in enumerate(ends)]
    assert crashed_in_teardown(ranks) is want
