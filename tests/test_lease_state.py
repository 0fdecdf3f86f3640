"""The launcher-lease rules of traceml_tui.core.state, case by case (the real-run proof is test_run_lease.py).

Each case is a situation a real launch reaches (issue 24): a launcher killed before any rank wrote, a
launcher killed mid-run (its ranks then end `terminated`), one node of two lost, a launcher still at work
after its ranks ended. A run without lease files keeps the rules it had before leases.
"""

from __future__ import annotations

import pytest

from traceml_tui.core.state import (
    LAUNCHERS_DONE,
    LAUNCHERS_GONE,
    LAUNCHERS_LIVE,
    LeaseFacts,
    RankFacts,
    RankState,
    RunFacts,
    RunStatus,
    decide_run,
    describe,
    launchers,
    lost_nodes,
)

NOW = 1_000_000.0
L = 30.0


def live(node: int = 0) -> LeaseFacts:
    """Seen changing at the last look."""
    return LeaseFacts(node=node, done=False, changed_at=NOW - 1, checked_at=NOW - 1, lease_s=L)


def expired(node: int = 0) -> LeaseFacts:
    """Looked at again and again, unchanged for longer than its lease."""
    return LeaseFacts(node=node, done=False, changed_at=NOW - L - 5, checked_at=NOW - 1, lease_s=L)


def done(node: int = 0) -> LeaseFacts:
    return LeaseFacts(node=node, done=True, changed_at=NOW - 1000, checked_at=NOW - 1, lease_s=L)


def terminated(rank: int, t: float, node: int = 0) -> RankFacts:
    return RankFacts(rank=rank, last_ts=t - 0.05, end_status="terminated", end_exit_code=143, end_ts=t, node=node)


def running(rank: int, t: float = NOW - 1, node: int = 0) -> RankFacts:
    return RankFacts(rank=rank, last_ts=t, node=node, last_seen=t)


def facts(ranks=(), leases=(), **kw) -> RunFacts:
    kw.setdefault("manifest_status", "running")
    kw.setdefault("last_ingest", NOW - 1)
    return RunFacts(ranks=tuple(ranks), now=NOW, median_interval_s=0.1, leases=tuple(leases), **kw)


def test_expiry_is_judged_on_the_readers_own_two_looks_and_done_never_expires() -> None:
    assert not live().expired and expired().expired and not done().expired
    # exactly the lease is not past it
    assert not LeaseFacts(0, False, changed_at=100.0, checked_at=100.0 + L, lease_s=L).expired
    # a reader that stopped looking (checked_at stays) never makes a lease expire, however late it is now
    stale_look = LeaseFacts(0, False, changed_at=NOW - 5000, checked_at=NOW - 4990, lease_s=L)
    assert not stale_look.expired
    assert launchers([]) is None
    assert launchers([live(0), expired(1)]) == LAUNCHERS_LIVE
    assert launchers([done(0), expired(1)]) == LAUNCHERS_GONE
    assert launchers([expired(0), expired(1)]) == LAUNCHERS_GONE
    assert launchers([done(0), done(1)]) == LAUNCHERS_DONE


def test_a_launcher_killed_before_any_rank_wrote_is_lost_once_its_lease_expired() -> None:
    assert decide_run(facts(leases=[live()])).status is RunStatus.RUNNING
    assert decide_run(facts(leases=[expired()])).status is RunStatus.LOST
    # before leases such a run stayed running forever: nothing else could ever change
    assert decide_run(facts()).status is RunStatus.RUNNING


def test_a_launcher_killed_mid_run_is_running_until_lost_never_interrupted() -> None:
    ranks = [terminated(0, NOW - 3), terminated(1, NOW - 2.9)]  # the dying launcher's SIGTERM
    verdict = decide_run(facts(ranks, [live()]))
    assert verdict.status is RunStatus.RUNNING
    assert verdict.ranks == (RankState.INTERRUPTED, RankState.INTERRUPTED)  # the ranks' own words stay
    assert decide_run(facts(ranks, [expired()])).status is RunStatus.LOST
    # without a lease: today's rule, `interrupted` until the stall limit, then lost
    assert decide_run(facts(ranks)).status is RunStatus.INTERRUPTED


def test_failures_after_a_stop_from_outside_wait_for_the_launcher() -> None:
    """Rank 0 got the dying launcher's SIGTERM first; rank 1 then failed in its all-reduce."""
    ranks = [terminated(0, NOW - 3), RankFacts(1, NOW - 3.1, "failed", 1, NOW - 2.9, node=0)]
    assert decide_run(facts(ranks, [live()])).status is RunStatus.RUNNING
    assert decide_run(facts(ranks, [expired()])).status is RunStatus.LOST
    assert decide_run(facts(ranks, [live()], manifest_status="interrupted")).status is RunStatus.INTERRUPTED


def test_a_ranks_own_failure_is_failed_at_once_while_the_launcher_lives() -> None:
    ranks = [RankFacts(0, NOW - 3, "failed", 1, NOW - 3, node=0), running(1)]
    assert decide_run(facts(ranks, [live()])).status is RunStatus.FAILED


def test_clean_ends_wait_for_the_launchers_word_while_it_is_at_work() -> None:
    """Ranks all completed; the launcher is draining validation / writing the summary."""
    ranks = [RankFacts(r, NOW - 5, "exited", None, NOW - 5, node=0) for r in (0, 1)]
    assert decide_run(facts(ranks, [live()])).status is RunStatus.RUNNING
    assert decide_run(facts(ranks, [done()], manifest_status="completed")).status is RunStatus.COMPLETED
    # every launcher done but no final word readable (the manifest write failed): the ranks' own words, as before
    assert decide_run(facts(ranks, [done()])).status is RunStatus.COMPLETED


def test_a_silent_rank_whose_peers_ended_is_stalled_not_lost_while_the_launcher_lives() -> None:
    ranks = [RankFacts(0, NOW - 100, "exited", None, NOW - 100, node=0), running(1, NOW - 100)]
    verdict = decide_run(facts(ranks, [live()], last_ingest=NOW - 100))
    assert verdict.ranks[1] is RankState.STALLED and verdict.status is RunStatus.STALLED
    assert decide_run(facts(ranks, last_ingest=NOW - 100)).ranks[1] is RankState.LOST  # no lease: the old "peers ended" rule


def test_one_node_of_two_lost_is_named_and_its_silent_ranks_are_lost() -> None:
    ranks = [running(0, node=0), running(1, NOW - 40, node=1)]
    run = facts(ranks, [live(0), expired(1)])
    verdict = decide_run(run)
    assert verdict.ranks == (RankState.RUNNING, RankState.LOST)
    assert verdict.status is RunStatus.STALLED  # node 0 lives: not over, but it cannot go on
    assert lost_nodes(run.leases) == (1,)
    # node 0 then fails in the collective and writes the final word
    ranks = [RankFacts(0, NOW - 2, "failed", 1, NOW - 2, node=0), RankFacts(1, NOW - 40, node=1)]
    final = facts(ranks, [done(0), expired(1)], manifest_status="failed")
    assert decide_run(final).status is RunStatus.FAILED
    assert lost_nodes(final.leases) == (1,)
    assert describe("failed", (1,), lost_nodes(final.leases)) == "failed r1 · lost node 1"


def test_lost_nodes_names_none_when_every_lease_expired() -> None:
    assert lost_nodes([expired(0)]) == ()
    assert lost_nodes([expired(0), expired(1)]) == ()
    assert lost_nodes([live(0), expired(1), expired(2)]) == (1, 2)
    assert describe("running", (), (1, 2)) == "running · lost nodes 1,2"
    assert describe("stalled", (0, 3)) == "stalled r0,r3"


@pytest.mark.parametrize("manifest", ["completed", "failed", "interrupted"])
def test_a_final_word_is_kept_whatever_the_leases_say(manifest: str) -> None:
    ranks = [RankFacts(0, NOW - 5, "exited", None, NOW - 5, node=0)]
    status = decide_run(facts(ranks, [expired()], manifest_status=manifest)).status
    assert status is RunStatus(manifest)
