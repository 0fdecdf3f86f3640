"""Early stopping over asynchronous receipts: order, resume, pending/failed evaluations, budget."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from traceml_tui.core.rundir import RunDir
from traceml_tui.hygiene import EarlyStopping, backlog
from traceml_tui.hygiene.checkpoints import publish_checkpoint

DIGEST = "sha256:es"
POLICY = dict(metric="val_loss", direction="min", min_delta=0.01, patience=2)
# checkpoint step -> validation loss; 0.795 is within min_delta of 0.8, so it is not an improvement.
SCHEDULE = [(10, 1.0), (20, 0.8), (30, 0.795), (40, 0.6), (50, 0.7), (60, 0.65), (70, 0.1)]


def _request(run_dir: Path, step: int) -> str:
    weights = run_dir / "w.bin"
    if not weights.exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        weights.write_bytes(b"w")
    return publish_checkpoint(run_dir, weights, step=step, config_digest=DIGEST)


def _complete(run_dir: Path, ckpt: str, value: float) -> None:
    backlog.write_receipt(run_dir, backlog.read_json(RunDir(run_dir).request(ckpt)), {"val_loss": value})


def _decisions(run_dir: Path, *, resume_each_time: bool) -> tuple[list[bool], dict]:
    """Publish and complete the schedule one checkpoint at a time, asking for a decision after each."""
    es = EarlyStopping(run_dir, **POLICY)
    out = []
    for step, value in SCHEDULE:
        ckpt = _request(run_dir, step)
        if resume_each_time:
            es = EarlyStopping(run_dir, **POLICY)  # a new process reading only the persisted state
        out.append(es.update(step))
        _complete(run_dir, ckpt, value)
        if resume_each_time:
            es = EarlyStopping(run_dir, **POLICY)
        out.append(es.update(step))
        out.append(es.update(step))  # asking twice must not consume the same evaluation twice
    return out, es.summary()


def _comparable(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "updated"}


def test_resumed_mid_patience_matches_an_uninterrupted_run(tmp_path):
    straight, final = _decisions(tmp_path / "a", resume_each_time=False)
    resumed, final_resumed = _decisions(tmp_path / "b", resume_each_time=True)
    assert straight == resumed
    assert _comparable(final) == _comparable(final_resumed)
    assert final["stopped"] and final["reason"] == "patience_exhausted"
    assert final["trigger_checkpoint"] == "step-00000060" and final["trigger_step"] == 60
    # The decision is frozen at the stop: the evaluation drained after it is recorded, not counted.
    assert final["best_checkpoint"] == "step-00000040" and final["best_metric"] == 0.6
    assert final["patience_counter"] == 2
    assert straight[straight.index(True) - 1] is False and straight.index(True) == 3 * 5 + 1
    persisted = json.loads((tmp_path / "b" / "early_stopping.json").read_text())
    assert persisted["consumed"][-1] == "step-00000070" and persisted["evaluations"] == 6
    assert persisted["after_stop"] == [{"checkpoint": "step-00000070", "step": 70, "value": 0.1}]


def test_patience_state_survives_a_restart_in_the_middle(tmp_path):
    run_dir = tmp_path / "run"
    for step, value in SCHEDULE[:3]:
        _complete(run_dir, _request(run_dir, step), value)
    first = EarlyStopping(run_dir, **POLICY)
    assert first.update(30) is False
    assert (first.state["patience_counter"], first.state["best_checkpoint"]) == (1, "step-00000020")
    again = EarlyStopping(run_dir, **POLICY)  # restarted process: patience not reset, nothing recounted
    assert again.update(30) is False and again.state["patience_counter"] == 1 and again.state["evaluations"] == 3


def test_failed_evaluation_between_two_improvements_does_not_stop(tmp_path):
    run_dir = tmp_path / "run"
    es = EarlyStopping(run_dir, metric="val_loss", direction="min", min_delta=0.0, patience=1)
    c1, c2, c3 = (_request(run_dir, s) for s in (10, 20, 30))
    _complete(run_dir, c1, 0.9)
    backlog.write_failure(run_dir, c2, "exit code 1: out of memory")
    _complete(run_dir, c3, 0.5)
    assert es.update(30) is False
    # Consumption waits at the failed checkpoint: it is neither counted nor skipped.
    assert es.state["last_consumed"] == c1 and c3 not in es.state["consumed"]
    assert es.state["patience_counter"] == 0
    _complete(run_dir, c2, 0.7)  # the retry succeeds
    assert es.update(30) is False
    assert es.state["consumed"] == [c1, c2, c3] and es.state["best_checkpoint"] == c3


def test_pending_evaluations_never_count_and_order_holds(tmp_path):
    run_dir = tmp_path / "run"
    es = EarlyStopping(run_dir, metric="acc", direction="max", min_delta=0.0, patience=1)
    c1, c2, c3 = (_request(run_dir, s) for s in (1, 2, 3))
    backlog.write_receipt(run_dir, backlog.read_json(RunDir(run_dir).request(c1)), {"acc": 0.5})
    backlog.write_receipt(run_dir, backlog.read_json(RunDir(run_dir).request(c3)), {"acc": 0.1})
    assert es.update(3) is False and es.state["consumed"] == [c1]
    backlog.write_receipt(run_dir, backlog.read_json(RunDir(run_dir).request(c2)), {"acc": 0.9})
    assert es.update(3) is True
    assert (es.state["best_checkpoint"], es.state["trigger_checkpoint"]) == (c2, c3)


def test_warmup_budget_and_disabled_policy(tmp_path):
    run_dir = tmp_path / "warm"
    es = EarlyStopping(run_dir, metric="val_loss", direction="min", min_delta=0.0, patience=1, warmup=25, max_budget=100)
    for step, value in [(10, 0.1), (20, 0.9), (30, 0.5)]:
        _complete(run_dir, _request(run_dir, step), value)
    assert es.update(30) is False  # 0.1 and 0.9 fell in the warm-up: not eligible, not the best
    assert (es.state["best_checkpoint"], es.state["evaluations"]) == ("step-00000030", 1)
    assert es.update(99) is False and es.update(100) is True
    assert es.state["reason"] == "max_budget" and es.state["trigger_step"] == 100

    hygiene = {"early_stopping": {"enabled": False, "reason": "fixed-duration reproduction"}}
    off = EarlyStopping.from_config(tmp_path / "off", hygiene)
    for step, value in [(10, 0.1), (20, 0.9), (30, 0.9)]:
        _complete(tmp_path / "off", _request(tmp_path / "off", step), value)
    assert off.update(30) is False
    assert json.loads((tmp_path / "off" / "early_stopping.json").read_text())["policy"]["reason"] == "fixed-duration reproduction"


def test_changed_policy_on_resume_is_refused(tmp_path):
    EarlyStopping(tmp_path, **POLICY).update(0)
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(tmp_path, **dict(POLICY, patience=5))


HYG1_POLICY = dict(metric="r2", direction="max", min_delta=0.002, patience=3)
HYG1_BEFORE = [(500, 0.70), (600, 0.75), (700, 0.749), (800, 0.74), (900, 0.745)]  # patience runs out at 900
HYG1_AFTER = [(1000, 0.74), (1100, 0.8022), (1200, 0.79), (1300, 0.78)]  # drained after the stop


def test_receipts_drained_after_a_patience_stop_do_not_change_the_decision(tmp_path):
    """QA's hyg1 run: patience runs out at step 900, then the checkpoints training published before it
    noticed (1000..1300, one of them better at 1100) are drained and consumed. The decision and its
    state stay those of the stop; the late receipts are recorded as after the stop."""
    run_dir = tmp_path / "run"
    policy, before, after = HYG1_POLICY, HYG1_BEFORE, HYG1_AFTER
    ckpts = {step: _request(run_dir, step) for step, _ in before + after}  # published before training noticed
    es = EarlyStopping(run_dir, **policy)
    for step, value in before:
        backlog.write_receipt(run_dir, backlog.read_json(RunDir(run_dir).request(ckpts[step])), {"r2": value})
    assert es.update(1300) is True
    at_stop = {k: es.state[k] for k in ("best_metric", "best_checkpoint", "best_step", "patience_counter",
                                        "evaluations", "stopped", "reason", "trigger_checkpoint", "trigger_step")}
    assert at_stop == dict(best_metric=0.75, best_checkpoint=ckpts[600], best_step=600, patience_counter=3,
                           evaluations=5, stopped=True, reason="patience_exhausted",
                           trigger_checkpoint=ckpts[900], trigger_step=900)
    for step, value in after:  # the backlog drained after the stop, one receipt at a time
        backlog.write_receipt(run_dir, backlog.read_json(RunDir(run_dir).request(ckpts[step])), {"r2": value})
        assert es.update(1300) is True
    again = EarlyStopping(run_dir, **policy)  # the launcher's final consume, a fresh process
    assert again.update() is True
    persisted = json.loads((run_dir / "early_stopping.json").read_text())
    assert {k: persisted[k] for k in at_stop} == at_stop
    assert persisted["consumed"] == [ckpts[s] for s, _ in before + after]  # none is consumed again
    assert persisted["after_stop"] == [{"checkpoint": ckpts[s], "step": s, "value": v} for s, v in after]


def test_receipts_drained_after_a_budget_stop_count_up_to_the_budget(tmp_path):
    """A budget stop is no verdict on evaluations: checkpoints up to the update it stopped at (its own update
    included) still count when drained later; only a checkpoint after it is recorded, not counted. No
    evaluation decided the stop, so it has no trigger checkpoint (QA #10: it named the last consumed one)."""
    run_dir = tmp_path / "run"
    es = EarlyStopping(run_dir, metric="val_loss", direction="min", min_delta=0.0, patience=1, max_budget=40)
    ckpts = {step: _request(run_dir, step) for step in (10, 20, 30, 40, 50)}
    _complete(run_dir, ckpts[10], 1.0)
    assert es.update(40) is True and es.state["reason"] == "max_budget" and es.state["trigger_step"] == 40
    assert es.state["trigger_checkpoint"] is None  # step-10 was consumed last, but it decided nothing
    for step, value in [(20, 0.5), (30, 0.6), (40, 0.45), (50, 0.1)]:
        _complete(run_dir, ckpts[step], value)
    assert es.update() is True
    state = es.state
    # 20 improves, 30 does not, 40 (the stop's own update) improves again; 50 is after the stop
    assert (state["best_checkpoint"], state["patience_counter"], state["evaluations"]) == (ckpts[40], 0, 4)
    assert (state["reason"], state["trigger_checkpoint"], state["trigger_step"]) == ("max_budget", None, 40)
    assert state["after_stop"] == [{"checkpoint": ckpts[50], "step": 50, "value": 0.1}]

    from traceml_tui.hygiene.report import report_lines, validation_report

    assert "  early stopping: stopped, max_budget at update 40; 1 evaluation after the stop not counted" in \
        report_lines(validation_report(run_dir))


def test_summary_and_panel_agree_with_the_stop_and_name_what_came_after(tmp_path):
    """QA's hyg1 order through the summary and the Run screen's panel: patience 3/3, the best as of the stop,
    the stop at 900, and one line saying the four later evaluations were recorded, not counted."""
    pytest.importorskip("textual")
    from types import SimpleNamespace

    from daemon.views import early_stopping  # the reader's rule; the panel's snapshot maps it
    from traceml_tui.hygiene.report import report_lines, validation_report
    from traceml_tui.tui.present import early_stopping_info as _early_stopping
    from traceml_tui.tui.widgets.early_stopping_panel import early_stopping_lines

    run_dir = tmp_path / "run"
    ckpts = {step: _request(run_dir, step) for step, _ in HYG1_BEFORE + HYG1_AFTER}
    es = EarlyStopping(run_dir, **HYG1_POLICY)
    for i, (step, value) in enumerate(HYG1_BEFORE + HYG1_AFTER):
        backlog.write_receipt(run_dir, backlog.read_json(RunDir(run_dir).request(ckpts[step])), {"r2": value})
        assert es.update(1300) is (i >= len(HYG1_BEFORE) - 1)
    section = validation_report(run_dir)
    assert [e["step"] for e in section["early_stopping"]["after_stop"]] == [1000, 1100, 1200, 1300]
    assert ("  early stopping: stopped, patience_exhausted at step-00000900 (update 900); "
            "4 evaluations after the stop not counted") in report_lines(section)
    info = _early_stopping(early_stopping(
        SimpleNamespace(early_stopping=section["early_stopping"], best=section["best"]), None, []))
    lines = [line[0] if isinstance(line, tuple) else line for line in early_stopping_lines(info)]
    assert lines == [
        "metric r2 (↑ higher is better) · patience 3/3 used, 0 left",
        "best: step-00000600 (step 600) r2=0.75",
        "stopped: patience exhausted at step-00000900 (step 900)",
        "after the stop: 4 evaluations (steps 1000–1300) recorded, not counted",
    ]


def test_a_blocked_checkpoint_is_skipped_with_its_reason_and_later_receipts_count(tmp_path):
    """QA #1: a blocked request (every allowed attempt failed; nobody retries it) froze early stopping for the
    rest of the run. It is now recorded as skipped with its reason; later receipts are consumed in order.
    The backlog comes from a real `traceml validate drain` whose worker fails on step 20."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    ckpts = {step: _request(run_dir, step) for step in (10, 20, 30, 40)}
    worker = ["sh", "-c", 'if [ "$1" = 20 ]; then echo "disk full" >&2; exit 1; fi; '
              'echo "{\\"val_loss\\": $(( 100 - $1 ))}"', "sh", "{step}", "{checkpoint}"]
    done = subprocess.run([sys.executable, "-m", "traceml_tui", "validate", "drain", str(run_dir), "--no-curve",
                           "--max-attempts", "1", "--", *worker], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "3 completed, 1 failed" in done.stdout, done.stderr
    es = EarlyStopping(run_dir, metric="val_loss", direction="min", min_delta=0.0, patience=2, max_attempts=1)
    assert es.update(40) is False
    state = es.state
    assert state["consumed"] == [ckpts[s] for s in (10, 20, 30, 40)]
    assert state["skipped"] == [{"checkpoint": ckpts[20], "step": 20,
                                 "reason": "blocked after 1 failed attempts (last: exit code 1: disk full)"}]
    assert (state["best_checkpoint"], state["evaluations"], state["patience_counter"]) == (ckpts[40], 3, 0)

    # with attempts left (the default 3) the failed request is waited for: never skipped, never counted
    other = tmp_path / "other"
    shutil.copytree(run_dir / "validation", other / "validation")
    waiting = EarlyStopping(other, metric="val_loss", direction="min", min_delta=0.0, patience=2)
    waiting.update(40)
    assert waiting.state["consumed"] == [ckpts[10]] and waiting.state["skipped"] == []

    from traceml_tui.hygiene.report import report_lines, validation_report

    lines = report_lines(validation_report(run_dir))
    assert ("  early stopping: skipped blocked step-00000020 (update 20): blocked after 1 failed attempts "
            "(last: exit code 1: disk full)") in lines


def test_a_metric_no_receipt_reports_is_flagged_in_the_summary_and_the_panel(tmp_path):
    """QA #9: early_stopping.metric missing from every receipt (R2 vs r2) silently disabled early stopping."""
    pytest.importorskip("textual")
    from types import SimpleNamespace

    from daemon.views import early_stopping  # the reader's rule; the panel's snapshot maps it
    from traceml_tui.core.state import BacklogState
    from traceml_tui.hygiene.report import report_lines, validation_report
    from traceml_tui.tui.present import early_stopping_info as _early_stopping
    from traceml_tui.tui.widgets.early_stopping_panel import early_stopping_lines

    run_dir = tmp_path / "run"
    ckpts = [_request(run_dir, step) for step in (10, 20)]
    for ckpt in ckpts:
        backlog.write_receipt(run_dir, backlog.read_json(RunDir(run_dir).request(ckpt)), {"r2": 0.5, "mse": 1.0})
    es = EarlyStopping(run_dir, metric="R2", direction="max", min_delta=0.0, patience=2)
    assert es.update(20) is False
    assert es.state["missing_metric"] == [{"checkpoint": c, "step": s, "metrics": ["mse", "r2"]}
                                          for c, s in zip(ckpts, (10, 20))]
    note = "2 completed evaluations without the monitored metric R2 (not counted; they report mse, r2)"
    section = validation_report(run_dir)
    assert f"  early stopping: {note}" in report_lines(section)

    def texts(info):
        return [line[0] if isinstance(line, tuple) else line for line in early_stopping_lines(info)]

    # at the end: from the summary's section
    info = _early_stopping(early_stopping(
        SimpleNamespace(early_stopping=section["early_stopping"], best=section["best"]), None, []))
    assert texts(info)[-1] == note
    # live: from the manifest's policy and the receipts so far (same words)
    manifest = SimpleNamespace(hygiene_block={"early_stopping": {"metric": "R2", "direction": "max", "patience": 2}})
    rows = [SimpleNamespace(state=BacklogState.COMPLETED, metrics=(("mse", 1.0), ("r2", 0.5)), checkpoint=c, step=s)
            for c, s in zip(ckpts, (10, 20))]
    assert texts(_early_stopping(early_stopping(None, manifest, rows)))[-1] == note


def test_the_curve_marks_a_budget_stop_at_its_update(tmp_path):
    """QA #10: the legend named the last consumed checkpoint ("at step-00000200") for a stop at update 600."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from traceml_tui.hygiene.curve import CurveData, _mark_early_stopping

    run_dir = tmp_path / "run"
    es = EarlyStopping(run_dir, metric="val_loss", direction="min", min_delta=0.0, patience=5, max_budget=600)
    _complete(run_dir, _request(run_dir, 200), 1.0)
    assert es.update(600) is True
    fig, ax = plt.subplots()
    _mark_early_stopping(ax, CurveData(run="r", attempts=[], evals=[], unfinished=[], early_stopping=es.state))
    stop = [line for line in ax.get_lines() if str(line.get_label()).startswith("early stop")]
    assert [str(line.get_label()) for line in stop] == ["early stop (max_budget) at update 600"]
    assert list(stop[0].get_xdata()) == [600, 600]
    plt.close(fig)


def test_a_decision_reads_only_the_requests_not_yet_consumed(tmp_path, monkeypatch):
    # Called every update: reading every request each time made a long run's early stopping cost grow with the
    # checkpoints it published (1.1 ms per update after 13 checkpoints of the hygiene example, on rank 0, which
    # every rank then waits for). The decisions are the same as a fresh reader's (the other tests).
    run_dir = tmp_path / "run"
    es = EarlyStopping(run_dir, **POLICY)
    for step, value in SCHEDULE[:4]:
        _complete(run_dir, _request(run_dir, step), value)
    pending = _request(run_dir, 50)
    read: list[str] = []
    real = backlog.read_backlog_file

    def counting(path, folder, *args, **kwargs):
        if folder == "requests":
            read.append(path.stem)
        return real(path, folder, *args, **kwargs)

    monkeypatch.setattr(backlog, "read_backlog_file", counting)
    assert es.update(50) is False
    assert sorted(read) == sorted(f"step-{s:08d}" for s, _ in SCHEDULE[:4]) + [pending]  # the first look: all
    assert es.summary()["last_consumed"] == "step-00000040"
    read.clear()
    for _ in range(3):
        es.update(50)
    assert read == [pending] * 3  # after it: the one still waiting, never a consumed one
    _complete(run_dir, pending, SCHEDULE[4][1])
    read.clear()
    assert es.update(50) is False
    assert read == [pending] and es.summary()["last_consumed"] == pending


def test_a_receipt_of_another_validation_config_is_skipped_not_waited_for(tmp_path):
    """A receipt bound to another config digest is not its request's result, and no drainer replaces it (receipts
    are never overwritten): early stopping waited for it forever, deciding nothing for the rest of the run."""
    run_dir = tmp_path / "run"
    ckpts = {step: _request(run_dir, step) for step in (10, 20, 30)}
    _complete(run_dir, ckpts[10], 1.0)
    foreign = dict(backlog.read_json(RunDir(run_dir).request(ckpts[20])), config_digest="sha256:other")
    backlog.write_receipt(run_dir, foreign, {"val_loss": 0.1})  # malformed input: made for another config
    _complete(run_dir, ckpts[30], 0.5)
    es = EarlyStopping(run_dir, metric="val_loss", direction="min", min_delta=0.0, patience=2)
    assert es.update(30) is False
    assert es.state["consumed"] == [ckpts[10], ckpts[20], ckpts[30]]
    assert es.state["skipped"] == [{"checkpoint": ckpts[20], "step": 20, "reason":
                                    "its receipt is bound to another validation config (sha256:other, the "
                                    f"request's {DIGEST})"}]
    # 0.1 of the other config never counted: the best is the request's own 0.5
    assert (es.state["best_checkpoint"], es.state["evaluations"]) == (ckpts[30], 2)
