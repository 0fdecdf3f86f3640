"""One read model (issue 25 item 1): a backlog entry, eval freshness and the early-stopping state are decided once,
in ``core``, and the file side and the index side show the same figures.

Everything runs on the committed real runs (``tests/fixtures/runs``, written by the real SDK and ``traceml run``;
the ``hygiene`` run has two receipts, a failed, a blocked, a stale-claimed and a pending request), indexed by
the real ingester. The early-stopping state is made by the real policy over that run's own receipts
(``fixture_runs.stop_hygiene_early``). Hand-written bytes appear only as damaged files.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.reader import Reader
from traceml_tui.core import backlog as core_backlog
from traceml_tui.core import freshness, hygiene_files, stopping
from traceml_tui.core.state import BacklogState
from traceml_tui.hygiene import backlog as file_backlog
from traceml_tui.summary.build import training_section
from traceml_tui.summary.load import load_ranks

from support import fixture_runs as fr

HYGIENE = fr.FIXTURE_RUNS / fr.name_of("hygiene")
EXPECTED = fr.FACTS["hygiene"]["expected_backlog"]
NOW = fr.SHOWN_AT


def _files(run_dir: Path) -> list[core_backlog.BacklogFile]:
    return list(file_backlog.backlog_files(run_dir))


def _run_id(reader: Reader, case: str) -> int:
    return next(r.run_id for r in reader.list_runs(now=NOW) if r.name == fr.name_of(case))


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """The committed runs copied and indexed; the hygiene run stopped early by the real policy."""
    root, index = fr.build_real_index(tmp_path_factory.mktemp("read-model"), prepare=fr.stop_hygiene_early)
    return root, index


# --------------------------------------------------------------------------- the backlog entry


def test_the_entries_decide_the_real_runs_states():
    entries = core_backlog.backlog_entries(_files(HYGIENE), NOW)
    assert {e.checkpoint: e.state.value for e in entries} == EXPECTED
    assert [e.checkpoint for e in entries] == sorted(EXPECTED)  # checkpoint order: by step
    assert [e.checkpoint for e in core_backlog.outstanding(entries)] == [
        c for c, word in sorted(EXPECTED.items()) if word != "completed"]
    assert core_backlog.newest_completed(entries).checkpoint == "step-00000002"
    blocked = next(e for e in entries if e.state is BacklogState.BLOCKED)
    assert blocked.failures == 3 and [a for a, _, _ in blocked.attempts] == [1, 2, 3]


def test_file_side_and_index_side_assemble_the_same_entries(indexed):
    root, index = indexed
    run_dir = root / fr.name_of("hygiene")
    with Reader(index) as reader:
        from_index = reader.backlog.entries(_run_id(reader, "hygiene"), now=NOW)
    from_files = file_backlog.backlog_entries(run_dir, now=NOW)
    assert from_index == from_files and len(from_files) == len(EXPECTED)
    status = file_backlog.backlog_status(run_dir, now=NOW)  # what `traceml validate status` prints
    assert [(r["checkpoint"], r["state"]) for r in status["requests"]] == [(e.checkpoint, e.state.value)
                                                                           for e in from_index]
    assert [r["checkpoint"] for r in status["outstanding"]] == [e.checkpoint for e in from_index if e.outstanding]


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.permutations(_files(HYGIENE)))
def test_the_order_files_are_listed_in_changes_nothing(files):
    assert core_backlog.backlog_entries(files, NOW) == core_backlog.backlog_entries(_files(HYGIENE), NOW)


def test_a_receipt_decides_without_asking_about_the_claims_owner():
    files = {(f, n): d for f, n, d in _files(HYGIENE)}
    request = hygiene_files.decode_named("requests", "step-00000000.json", files["requests", "step-00000000.json"])
    receipt = hygiene_files.decode_named("receipts", "step-00000000.json", files["receipts", "step-00000000.json"])
    claim = hygiene_files.decode_named("claims", "step-00000008.json", files["claims", "step-00000008.json"])
    claim = hygiene_files.Claim(checkpoint="step-00000000", owner=claim.owner, claimed=claim.claimed,
                                heartbeat=claim.heartbeat, lease_s=claim.lease_s)

    def probe(owner):
        raise AssertionError("a completed request's claim is not probed")

    entry = core_backlog.assemble_entry(request, claim, receipt, (), NOW, probe=probe)
    assert entry.state is BacklogState.COMPLETED and not entry.outstanding and entry.metrics
    live = core_backlog.assemble_entry(request, claim, None, (), NOW, probe=lambda owner: True)
    dead = core_backlog.assemble_entry(request, claim, None, (), NOW, probe=lambda owner: False)
    assert (live.state, dead.state) == (BacklogState.CLAIMED, BacklogState.STALE_CLAIM)
    assert live.outstanding and dead.outstanding


def test_a_damaged_failure_still_counts_and_a_damaged_receipt_is_no_result():
    files = []
    errors: list[str] = []
    for folder, name, data in _files(HYGIENE):
        if (folder, name) == ("failures", "step-00000004-1.json"):
            data = b'{"checkpoint": "step-00000004", '  # cut short
        if (folder, name) == ("receipts", "step-00000002.json"):
            data = data.replace(b'"metrics"', b'"metrics": null, "x"', 1)
        files.append((folder, name, data))
    entries = {e.checkpoint: e for e in core_backlog.backlog_entries(files, NOW, errors=errors)}
    assert sorted(line.split(":")[0] for line in errors) == ["validation/failures/step-00000004-1.json",
                                                              "validation/receipts/step-00000002.json"]
    assert entries["step-00000004"].failures == 1 and entries["step-00000004"].state is BacklogState.FAILED
    assert entries["step-00000004"].last_error == core_backlog.DAMAGED_FAILURE
    assert entries["step-00000002"].outstanding and entries["step-00000002"].receipt is None


def _damage(root: Path) -> None:
    fr.stop_hygiene_early(root)
    validation = root / fr.name_of("hygiene") / "validation"
    (validation / "receipts" / "step-00000002.json").write_text(
        '{"checkpoint":"step-00000002","step":2,"metrics":null,"completed":1.0}')
    (validation / "requests" / "step-00000010.json").write_text('{"checkpoint": "step-00000010", "step": "ten"}')


@pytest.mark.parametrize("prepare", [fr.stop_hygiene_early, _damage], ids=["clean", "damaged"])
def test_the_outstanding_count_fast_path_equals_the_entries(tmp_path, prepare):
    """``Reader.backlog_outstanding`` (one query for every run) counts what the entries call outstanding."""
    root, index = fr.build_real_index(tmp_path, prepare=prepare)
    with Reader(index) as reader:
        fast = reader.backlog.outstanding()
        slow = {r.run_id: sum(e.outstanding for e in reader.backlog.entries(r.run_id, now=NOW))
                for r in reader.list_runs()}
    assert {k: v for k, v in slow.items() if v} == fast
    hygiene = file_backlog.backlog_status(root / fr.name_of("hygiene"), now=NOW)
    assert sorted(fast.values()) == [len(hygiene["outstanding"])]
    # damaged: the receipt of step 2 is no result, the request of step 10 no request
    steps = {0, 2, 4, 6, 8} - {0} if prepare is _damage else {4, 6, 8, 10}
    assert {r["step"] for r in hygiene["outstanding"]} == steps


# --------------------------------------------------------------------------- eval freshness


@given(st.one_of(st.none(), st.integers(-10, 10**6)), st.lists(st.integers(0, 10**6), max_size=8))
def test_the_lag_is_never_negative_and_names_the_newest(train, steps):
    fresh = freshness.eval_freshness(train, [freshness.Evaluated(s, f"c{s}") for s in steps])
    if not steps or train is None:
        assert fresh.lag_steps is None
    else:
        assert fresh.newest_step == max(steps) and fresh.newest_checkpoint == f"c{max(steps)}"
        assert fresh.lag_steps == max(0, train - max(steps)) >= 0


def test_the_summary_and_the_index_show_the_same_eval_freshness(indexed):
    root, index = indexed
    run_dir = root / fr.name_of("hygiene")
    section = training_section(load_ranks(run_dir), run_dir)["eval"]
    with Reader(index) as reader:
        run_id = _run_id(reader, "hygiene")
        fresh = reader.backlog.eval_freshness(run_id)
        assert reader.backlog.newest_evaluated_step(run_id) == fresh.newest_step == 2  # the newest receipt
    assert (section["newest_step"], section["newest_checkpoint"], section["lag_steps"]) == (
        fresh.newest_step, fresh.newest_checkpoint, fresh.lag_steps)
    assert section["backlog"] == 4 and fresh.lag_steps == fresh.train_step - 2


def test_the_runs_table_and_the_backlog_screen_show_the_readers_lag(indexed):
    from traceml_tui.tui.source import IndexSource

    _, index = indexed
    src = IndexSource(index, clock=lambda: NOW)
    try:
        row = next(r for r in src.runs().rows if r.name == fr.name_of("hygiene"))
        backlog = src.backlog(row.run_id)
    finally:
        src.close()
    with Reader(index) as reader:
        fresh = reader.backlog.eval_freshness(row.run_id)
    assert (row.eval_step, row.eval_lag) == (fresh.newest_step, fresh.lag_steps)
    assert backlog.eval_lag == fresh.lag_steps and backlog.newest_completed[2] == fresh.newest_step
    assert row.backlog == 4


# --------------------------------------------------------------------------- early stopping, indexed


def test_the_reader_shows_the_policys_own_state(indexed):
    root, index = indexed
    state_file = root / fr.name_of("hygiene") / "early_stopping.json"
    with Reader(index) as reader:
        view = reader.backlog.early_stopping(_run_id(reader, "hygiene"))
        assert reader.backlog.early_stopping(_run_id(reader, "completed")) is None
        section = reader.files.validation(_run_id(reader, "hygiene"))  # the summary's, written at the end
    # the summary and the index show the same state and the same best
    assert section.early_stopping["state"] == view.state and section.early_stopping["reason"] == view.reason
    assert (section.best["checkpoint"], section.best["step"], section.best["value"]) == (
        view.best_checkpoint, view.best_step, view.best_value)
    assert section.early_stopping["patience_counter"] == view.patience_used
    assert view == stopping.stopping_view(hygiene_files.decode_early_stopping(state_file.read_bytes()))
    # fixture_runs.stop_hygiene_early: r2, lower is better, patience 1: 0.5 at step 0, then 0.75 at step 2
    assert (view.metric, view.direction, view.min_delta, view.warmup, view.patience) == ("r2", "min", 0.0, 0, 1)
    assert (view.best_checkpoint, view.best_step, view.best_value) == ("step-00000000", 0, 0.5)
    assert (view.patience_used, view.patience_left, view.evaluations) == (1, 0, 2)
    assert view.stopped and view.state == "stopped" and view.reason == "patience_exhausted"
    assert (view.trigger_checkpoint, view.trigger_step) == ("step-00000002", 2)


def test_the_state_word_has_one_rule():
    words = {(rec, stop, on): stopping.state_word(recorded=rec, stopped=stop, enabled=on)
             for rec in (False, True) for stop in (False, True) for on in (False, True)}
    assert words == {(False, False, False): "disabled", (False, False, True): "not-recorded",
                     (False, True, False): "stopped", (False, True, True): "stopped",
                     (True, False, False): "disabled", (True, False, True): "not-stopped",
                     (True, True, False): "stopped", (True, True, True): "stopped"}


def _live_policy(root: Path) -> None:
    """A live run: the real policy (r2 higher is better, min_delta 0.3) has consumed the receipts, no summary yet."""
    from traceml_tui.hygiene.early_stopping import EarlyStopping

    run_dir = root / fr.name_of("hygiene")
    EarlyStopping(run_dir, metric="r2", direction="max", min_delta=0.3, patience=3).update(step=10)
    (run_dir / "final_summary.json").unlink()
    (run_dir / "final_summary.txt").unlink()


def test_a_live_runs_panel_shows_the_policys_best_not_a_rule_of_its_own(tmp_path):
    """r2 0.5 then 0.75 with min_delta 0.3: the policy keeps 0.5 as its best (0.75 is no improvement by 0.3);
    the best receipt by value alone would be 0.75."""
    from traceml_tui.tui.source import IndexSource
    from traceml_tui.tui.widgets.early_stopping_panel import early_stopping_lines

    _, index = fr.build_real_index(tmp_path, prepare=_live_policy)
    src = IndexSource(index, clock=lambda: NOW)
    try:
        row = next(r for r in src.runs().rows if r.name == fr.name_of("hygiene"))
        info = src.run_detail(row.run_id).early_stopping
    finally:
        src.close()
    assert info.source == "policy" and info.state == "not-stopped"
    assert (info.best_checkpoint, info.best_step, info.best_value) == ("step-00000000", 0, 0.5)
    assert (info.patience, info.patience_used, info.min_delta) == (3, 1, 0.3)
    text = "\n".join(line if isinstance(line, str) else line[0] for line in early_stopping_lines(info))
    assert "patience 1/3 used, 2 left" in text and "min Δ 0.3" in text and "best: step-00000000" in text


def test_a_damaged_state_file_is_one_error_row_and_no_state(tmp_path):
    def damage(root: Path) -> None:
        fr.stop_hygiene_early(root)
        path = root / fr.name_of("hygiene") / "early_stopping.json"
        state = json.loads(path.read_text())
        path.write_text(json.dumps({**state, "patience_counter": -1}))

    _, index = fr.build_real_index(tmp_path, prepare=damage)
    with Reader(index) as reader:
        run_id = _run_id(reader, "hygiene")
        assert reader.backlog.early_stopping(run_id) is None
        errors = [e for e in reader.events.errors(run_id) if e.path.endswith("early_stopping.json")]
    assert len(errors) == 1 and "patience_counter" in errors[0].message
    with sqlite3.connect(index) as conn:
        kinds = {k for (k,) in conn.execute("SELECT kind FROM side_files")}
    assert "early_stopping" in kinds


def test_an_index_that_had_no_state_picks_it_up_on_the_next_pass(tmp_path):
    """An index written before the state file existed (or before it was indexed) gains it without a rebuild."""
    from daemon.service import Ingester

    root, index = fr.build_real_index(tmp_path)
    with Reader(index) as reader:
        assert reader.backlog.early_stopping(_run_id(reader, "hygiene")) is None
    fr.stop_hygiene_early(root)
    ingester = Ingester(index, [str(root)], poll_interval=0.1, use_inotify=False, mode="test",
                        clock=lambda: fr.INGESTED_AT)
    try:
        ingester.run_once()
    finally:
        ingester.close()
    with Reader(index) as reader:
        view = reader.backlog.early_stopping(_run_id(reader, "hygiene"))
    assert view is not None and view.stopped and view.best_checkpoint == "step-00000000"


# --------------------------------------------------------------------------- the manifest's blocks, typed

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=8)
_VALIDATION_KEYS = st.sampled_from(["recipe", "cadence", "max_attempts", "lease_s", "retry_backoff_s", "timeout_s",
                                    "worker", "other"])


@given(st.dictionaries(_VALIDATION_KEYS, _JSON | st.integers(min_value=-(10**30), max_value=10**30), max_size=6),
       _JSON)
def test_a_block_is_read_field_by_field_and_never_raises(validation, early):
    """Whatever an edited manifest holds, each field is what was written (when within bounds) or absent."""
    from traceml_tui.core.artifacts import HygieneSettings, ValidationBlock, decode_lenient

    settings = decode_lenient({"validation": validation, "early_stopping": early}, HygieneSettings)
    block = settings.validation
    assert isinstance(block, ValidationBlock)
    for name in ("recipe", "cadence", "max_attempts", "lease_s", "retry_backoff_s", "timeout_s"):
        got = getattr(block, name)
        assert got is None or got == validation.get(name)
    if block.max_attempts is not None:
        assert type(validation["max_attempts"]) is int and 1 <= block.max_attempts < 1 << 63
    if block.lease_s is not None:
        assert 0 < block.lease_s <= hygiene_files.MAX_SECONDS
    assert settings.early_stopping is None or isinstance(early, dict)


def test_an_edited_manifests_bad_field_leaves_the_others_declared(tmp_path):
    from traceml_tui.core.state import DEFAULT_LEASE_S

    run = tmp_path / "hygiene"
    shutil.copytree(HYGIENE, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["hygiene"]["validation"].update(lease_s=10**400, max_attempts=5, retry_backoff_s=0)
    (run / "manifest.json").write_text(json.dumps(manifest))
    declared = file_backlog.declared_validation(run)
    assert (declared["lease_s"], declared["max_attempts"], declared["retry_backoff_s"]) == (DEFAULT_LEASE_S, 5, 0.0)
    entries = file_backlog.backlog_entries(run, now=NOW)
    # five attempts allowed now: the request with three failures has retries left
    assert next(e for e in entries if e.checkpoint == "step-00000006").state is BacklogState.FAILED
