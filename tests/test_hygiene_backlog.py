"""Validation backlog: real drainer processes racing, crash recovery, failures, status."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from traceml_tui.core.atomic import atomic_write_json
from traceml_tui.core.rundir import RunDir
from traceml_tui.core.state import BacklogState
from traceml_tui.hygiene import backlog
from traceml_tui.hygiene.checkpoints import publish_checkpoint

from support.cli import run_main

DIGEST = "sha256:test"


def _publish(run_dir: Path, steps) -> list[str]:
    ckpt_file = run_dir / "weights.bin"
    if not ckpt_file.exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt_file.write_bytes(b"weights")
    return [publish_checkpoint(run_dir, ckpt_file, step=s, config_digest=DIGEST) for s in steps]


def _worker(log: Path, *, block: Path | None = None, exit_code: int = 0) -> list[str]:
    """A shell worker that appends `<checkpoint-path> <step>` to LOG and prints `{"loss": <step>}`."""
    script = 'echo "$1 $2" >> "$3"; '
    if block is not None:
        script += f'while [ -f "{block}" ]; do sleep 0.05; done; '
    script += f"printf '{{\"loss\": %s}}\\n' \"$2\"; exit {exit_code}"
    return ["sh", "-c", script, "sh", "{checkpoint}", "{step}", str(log)]


def _drain_cmd(traceml_cmd, run_dir: Path, worker: list[str], *extra: str) -> list[str]:
    return [*traceml_cmd, "validate", "drain", str(run_dir), "--no-curve", *extra, "--", *worker]


def _wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_two_drainers_race_over_50_requests_each_processed_exactly_once(tmp_path, traceml_cmd, cli_env):
    run_dir = tmp_path / "run"
    ckpts = _publish(run_dir, range(10, 510, 10))
    log = tmp_path / "processed.log"
    cmd = _drain_cmd(traceml_cmd, run_dir, _worker(log))
    procs = [subprocess.Popen(cmd, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    done = [int(out.split("drained: ")[1].split()[0]) for out, _ in outs]
    assert sum(done) == 50
    lines = log.read_text().splitlines()
    assert len(lines) == 50
    assert sorted(Path(line.split()[0]).name for line in lines) == sorted(f"{c}.bin" for c in ckpts)  # each its copy
    assert sorted(int(line.split()[1]) for line in lines) == list(range(10, 510, 10))
    receipts = backlog.list_receipts(run_dir)
    assert sorted(receipts) == sorted(ckpts)
    assert receipts["step-00000120"]["metrics"] == {"loss": 120.0}
    assert receipts["step-00000120"]["config_digest"] == DIGEST
    assert RunDir(run_dir).backlog_files("claims") == []
    status = backlog.backlog_status(run_dir)
    assert status["outstanding"] == [] and status["newest_completed"]["checkpoint"] == "step-00000500"


def test_a_single_drainer_takes_work_in_checkpoint_order(tmp_path, traceml_cmd, cli_env):
    run_dir = tmp_path / "run"
    _publish(run_dir, [30, 10, 20])
    log = tmp_path / "order.log"
    proc = subprocess.run(_drain_cmd(traceml_cmd, run_dir, _worker(log)), env=cli_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [int(line.split()[1]) for line in log.read_text().splitlines()] == [10, 20, 30]


def test_sigkilled_drainer_claim_is_recovered_only_after_its_owner_is_gone(tmp_path, traceml_cmd, cli_env):
    run_dir = tmp_path / "run"
    (ckpt,) = _publish(run_dir, [100])
    log = tmp_path / "processed.log"
    block = tmp_path / "block"
    block.touch()
    holder = subprocess.Popen(_drain_cmd(traceml_cmd, run_dir, _worker(log, block=block), "--lease", "1"),
                              env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert _wait_for(lambda: log.exists() and log.read_text().strip()), "first drainer never started its worker"
        claim = backlog.read_claim(run_dir, ckpt)
        assert claim["owner"]["pid"] == holder.pid
        # Its lease (1 s) lapses while the owner is alive and busy: the heartbeat keeps it fresh,
        # and on the same host a live owner is never robbed whatever the heartbeat says.
        time.sleep(1.5)
        second = subprocess.run(_drain_cmd(traceml_cmd, run_dir, _worker(log)), env=cli_env,
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        assert len(log.read_text().splitlines()) == 1
        assert backlog.read_receipt(run_dir, ckpt) is None
        assert backlog.read_claim(run_dir, ckpt)["owner"]["pid"] == holder.pid
        assert backlog.read_claim(run_dir, ckpt)["heartbeat"] > claim["heartbeat"]

        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        assert backlog.read_claim(run_dir, ckpt) is not None  # the dead owner's claim is still on disk
        status = backlog.backlog_status(run_dir)
        assert status["outstanding"][0]["state"] == "stale-claim"

        third = subprocess.run(_drain_cmd(traceml_cmd, run_dir, _worker(log)), env=cli_env,
                               capture_output=True, text=True, timeout=60)
        assert third.returncode == 0, third.stderr
    finally:
        block.unlink(missing_ok=True)  # lets the orphaned worker of the killed drainer exit
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    receipt = backlog.read_receipt(run_dir, ckpt)
    assert receipt is not None and receipt["metrics"] == {"loss": 100.0}
    assert len(RunDir(run_dir).backlog_files("receipts")) == 1
    assert backlog.read_claim(run_dir, ckpt) is None
    assert backlog.list_failures(run_dir) == {}


def _stubborn_worker(log: Path, *, ignore_term: bool) -> list[str]:
    """A worker that logs `start <pid>`; its first run then hangs (ignoring SIGTERM if asked), later runs finish."""
    first = log.with_name("first-run")
    trap = 'trap "" TERM; ' if ignore_term else ""
    # the trap is set before `start` is logged: the test kills the drainer as soon as it reads `start`, and a
    # SIGTERM landing before the trap would end the "stubborn" worker (a race seen under load)
    script = (
        f'if [ ! -f "{first}" ]; then {trap}: ; fi; echo "start $$" >> "$1"; '
        f'if [ ! -f "{first}" ]; then touch "{first}"; while true; do sleep 0.1; done; fi; '
        'echo "done $$" >> "$1"; printf \'{"loss": 1}\\n\''
    )
    return ["sh", "-c", script, "sh", str(log), "{checkpoint}"]


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.faults
@pytest.mark.parametrize("ignore_term", [False, True], ids=["worker-dies-with-drainer", "worker-ignores-sigterm"])
def test_a_sigkilled_drainers_worker_never_runs_beside_the_next_one(tmp_path, traceml_cmd, cli_env, ignore_term):
    """Item 14: a SIGKILLed drainer's worker never validates beside the next drainer's."""
    run_dir = tmp_path / "run"
    (ckpt,) = _publish(run_dir, [100])
    log = tmp_path / "invocations.log"
    worker = _stubborn_worker(log, ignore_term=ignore_term)
    holder = subprocess.Popen(_drain_cmd(traceml_cmd, run_dir, worker), env=cli_env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert _wait_for(lambda: log.exists() and "start" in log.read_text()), "the first worker never started"
        first_pid = int(log.read_text().split()[1])
        # the drainer names the worker in its claim once it started it: the worker may log first
        assert _wait_for(lambda: (backlog.read_claim(run_dir, ckpt) or {}).get("worker") is not None), \
            "the claim never named the worker"
        claim = backlog.read_claim(run_dir, ckpt)
        assert claim["worker"]["pgid"] == first_pid  # the claim names the worker's own process group
        assert os.getpgid(first_pid) == first_pid
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        if not ignore_term:  # the parent-death signal alone stops it
            assert _wait_for(lambda: _gone(first_pid), 10), "the dead drainer's worker kept running"
        else:
            time.sleep(0.5)
            assert not _gone(first_pid)  # it survived its SIGTERM: the next drainer must stop it
        second = subprocess.run(_drain_cmd(traceml_cmd, run_dir, worker), env=cli_env, capture_output=True,
                                text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        assert _gone(first_pid), "the recovered claim's old worker still runs"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        for line in log.read_text().splitlines() if log.exists() else []:
            pid = int(line.split()[1])
            if line.startswith("start") and not _gone(pid):  # never leave a worker behind, even on failure
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
    lines = log.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["start", "start", "done"], lines
    assert lines[2].split()[1] == lines[1].split()[1]  # only the second worker finished
    assert len(RunDir(run_dir).backlog_files("receipts")) == 1 and backlog.list_failures(run_dir) == {}
    assert backlog.read_receipt(run_dir, ckpt)["metrics"] == {"loss": 1.0}
    assert [p.name for p in RunDir(run_dir).backlog_dir("claims").iterdir()] == []  # no claim, no lock file left


def test_leftover_recovery_lock_files_are_cleaned(tmp_path, traceml_cmd, cli_env):
    run_dir = tmp_path / "run"
    ckpts = _publish(run_dir, [10, 20])
    layout = RunDir(run_dir)
    layout.backlog_dir("claims").mkdir(parents=True, exist_ok=True)
    for name in (*ckpts, "step-00000999"):
        layout.claim_lock(name).write_bytes(b"")
    (layout.backlog_dir("claims") / ".keep").write_bytes(b"")  # not a lock file: left alone
    proc = subprocess.run(_drain_cmd(traceml_cmd, run_dir, _worker(tmp_path / "log")), env=cli_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in layout.backlog_dir("claims").iterdir()) == [".keep"]
    # A lock someone holds is not removed under them.
    import fcntl

    held = layout.claim_lock(ckpts[0])
    fd = os.open(held, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert backlog.clean_locks(run_dir) == 0 and held.exists()
    finally:
        os.close(fd)
    assert backlog.clean_locks(run_dir) == 1 and not held.exists()


def test_claims_of_other_hosts_are_judged_by_heartbeat_age(tmp_path):
    run_dir = tmp_path / "run"
    fresh, old = _publish(run_dir, [1, 2])
    foreign = {"host": "not-" + socket.gethostname(), "pid": 1, "start_time": 0.0}
    now = time.time()
    layout = RunDir(run_dir)
    atomic_write_json(layout.claim(fresh), {"checkpoint": fresh, "owner": foreign, "claimed": now,
                                            "heartbeat": now, "lease_s": 60.0})
    atomic_write_json(layout.claim(old), {"checkpoint": old, "owner": foreign, "claimed": now - 600,
                                          "heartbeat": now - 120, "lease_s": 60.0})
    assert [r["state"] for r in backlog.backlog_status(run_dir)["requests"]] == ["claimed", "stale-claim"]
    me = backlog.current_owner()
    assert backlog.try_claim(run_dir, fresh, me, 60.0) is None
    taken = backlog.try_claim(run_dir, old, me, 60.0)
    assert taken is not None and backlog.read_claim(run_dir, old)["owner"] == me
    # A reused pid on this host (same pid, different start time) is not the owner.
    ghost = dict(me, start_time=me["start_time"] - 1000)
    atomic_write_json(layout.claim(fresh), {"checkpoint": fresh, "owner": ghost, "claimed": now,
                                            "heartbeat": now, "lease_s": 60.0})
    assert backlog.claim_is_stale(backlog.read_claim(run_dir, fresh))
    assert backlog.try_claim(run_dir, fresh, me, 60.0) is not None


def test_failures_stay_visible_and_retryable_never_a_result(tmp_path, traceml_cmd, cli_env):
    run_dir = tmp_path / "run"
    bad_exit, bad_output = _publish(run_dir, [10, 20])
    log = tmp_path / "log"
    crashing = _worker(log, exit_code=3)
    first = subprocess.run(_drain_cmd(traceml_cmd, run_dir, crashing), env=cli_env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0
    failures = backlog.list_failures(run_dir)
    assert set(failures) == {bad_exit, bad_output}
    assert failures[bad_exit][0]["attempt"] == 1 and failures[bad_exit][0]["error"].startswith("exit code 3")
    assert backlog.list_receipts(run_dir) == {}

    status = subprocess.run([*traceml_cmd, "validate", "status", str(run_dir), "--json"], env=cli_env,
                            capture_output=True, text=True, timeout=30)
    report = json.loads(status.stdout)
    assert report["newest_completed"] is None
    assert [(r["checkpoint"], r["state"]) for r in report["outstanding"]] == [(bad_exit, "failed"), (bad_output, "failed")]

    # Retry: one succeeds, the other prints no metrics JSON and fails a second time.
    receipt_worker = ["sh", "-c", 'if [ "$2" = 10 ]; then echo "{\\"r2\\": 0.5}"; else echo "done, no metrics"; fi',
                      "sh", "{checkpoint}", "{step}"]
    second = subprocess.run(_drain_cmd(traceml_cmd, run_dir, receipt_worker, "--retry-backoff", "0"), env=cli_env,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 0
    assert backlog.read_receipt(run_dir, bad_exit)["metrics"] == {"r2": 0.5}
    assert backlog.read_receipt(run_dir, bad_output) is None
    assert [f["attempt"] for f in backlog.list_failures(run_dir)[bad_output]] == [1, 2]
    assert "JSON" in backlog.list_failures(run_dir)[bad_output][1]["error"]

    text = subprocess.run([*traceml_cmd, "validate", "status", str(run_dir)], env=cli_env, capture_output=True,
                          text=True, timeout=30).stdout
    assert "newest completed: step-00000010" in text
    assert "outstanding: 1" in text and "step-00000020" in text and "2 failed" in text


def test_runtime_limit_leaves_unstarted_work_pending(tmp_path, traceml_cmd, cli_env):
    run_dir = tmp_path / "run"
    _publish(run_dir, [1, 2, 3, 4, 5, 6])
    slow = ["sh", "-c", 'sleep 0.7; echo "{\\"m\\": 1}"', "sh", "{checkpoint}"]
    proc = subprocess.run(_drain_cmd(traceml_cmd, run_dir, slow, "--max-runtime", "2"), env=cli_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "runtime_limit" in proc.stdout
    status = backlog.backlog_status(run_dir)
    assert 1 <= status["counts"]["completed"] < 6
    # unstarted work stays pending; one the limit cut off (a loaded machine) is a failed attempt
    cut = [row for row in status["outstanding"] if row["state"] != "pending"]
    assert len(cut) <= 1 and all(r["state"] == "failed" and "runtime limit" in r["last_error"] for r in cut)


def test_a_worker_cut_off_by_the_runtime_limit_is_a_failed_attempt_and_later_work_goes_first(
        tmp_path, traceml_cmd, cli_env):
    """QA #2: a worker that never returns, cut off by --max-runtime, left its request pending and taken first by
    every next drainer, forever. Now it is a failed attempt (its group killed); after that the next drainer
    takes the later requests while it backs off."""
    run_dir = tmp_path / "run"
    stuck, later = _publish(run_dir, [10, 20])
    marker = tmp_path / "hung.pid"
    hang = ["sh", "-c", f'if [ "$2" = 10 ]; then echo $$ > {marker}; sleep 600; fi; echo "{{\\"m\\": $2}}"',
            "sh", "{checkpoint}", "{step}"]
    first = subprocess.run(_drain_cmd(traceml_cmd, run_dir, hang, "--max-runtime", "2"), env=cli_env,
                           capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and "runtime_limit" in first.stdout, first.stderr
    assert [f["error"].split(" after")[0] for f in backlog.list_failures(run_dir)[stuck]] == [
        "cut off by the drainer's runtime limit"]
    assert _wait_for(lambda: _gone(int(marker.read_text())))  # its process group was killed
    second = subprocess.run(_drain_cmd(traceml_cmd, run_dir, hang, "--retry-backoff", "600"), env=cli_env,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "drained: 1 completed, 0 failed" in second.stdout, second.stderr
    assert backlog.read_receipt(run_dir, later)["metrics"] == {"m": 20.0}
    assert [f["attempt"] for f in backlog.list_failures(run_dir)[stuck]] == [1]  # backing off: not retried


def test_a_worker_past_its_timeout_is_killed_and_counted_as_failed(tmp_path, traceml_cmd, cli_env):
    run_dir = tmp_path / "run"
    stuck, later = _publish(run_dir, [10, 20])
    hang = ["sh", "-c", 'if [ "$2" = 10 ]; then sleep 600; fi; echo "{\\"m\\": $2}"', "sh", "{checkpoint}", "{step}"]
    done = subprocess.run(_drain_cmd(traceml_cmd, run_dir, hang, "--timeout", "1"), env=cli_env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "drained: 1 completed, 1 failed" in done.stdout, done.stderr
    assert backlog.list_failures(run_dir)[stuck][0]["error"] == "timed out after 1 s (hygiene.validation.timeout_s)"
    assert backlog.read_receipt(run_dir, later) is not None


def test_a_failed_request_backs_off_before_its_retry(tmp_path, traceml_cmd, cli_env):
    """QA #1: the dispatcher started a drainer every second and each retried a failed request at once, burning
    every attempt in seconds. A failed request now waits out a backoff; other work goes on meanwhile."""
    run_dir = tmp_path / "run"
    flaky, fine = _publish(run_dir, [10, 20])
    worker = ["sh", "-c", 'if [ "$2" = 10 ]; then echo "CUDA out of memory" >&2; exit 1; fi; echo "{\\"m\\": 1}"',
              "sh", "{checkpoint}", "{step}"]
    for _ in range(3):  # three drainers in a row, as a dispatcher would start them
        done = subprocess.run(_drain_cmd(traceml_cmd, run_dir, worker, "--retry-backoff", "600"), env=cli_env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert [f["attempt"] for f in backlog.list_failures(run_dir)[flaky]] == [1]  # one attempt, not three
    assert backlog.read_receipt(run_dir, fine) is not None
    from traceml_tui.hygiene.dispatch import has_unreceipted, next_retry_s

    assert not has_unreceipted(run_dir, 3, 600.0)  # nothing for a dispatcher to start a drainer for …
    assert next_retry_s(run_dir, 3, 600.0) > 0  # … until the backoff has passed
    row = backlog.backlog_status(run_dir)["outstanding"][0]
    assert row["state"] == "failed" and row["retry_at"] is not None  # the state word stays `failed`
    text = subprocess.run([*traceml_cmd, "validate", "status", str(run_dir)], env=cli_env, capture_output=True,
                          text=True, timeout=30).stdout
    assert "retry in" in text


def test_retry_backoff_doubles_per_failure_and_is_capped():
    from traceml_tui.core.state import RETRY_BACKOFF_CAP_S, retry_ready_at

    assert retry_ready_at(failures=0, last_failed=100.0, backoff_s=5) is None
    assert [retry_ready_at(failures=n, last_failed=100.0, backoff_s=5) for n in (1, 2, 3)] == [105.0, 110.0, 120.0]
    assert retry_ready_at(failures=40, last_failed=0.0, backoff_s=5) == RETRY_BACKOFF_CAP_S
    assert retry_ready_at(failures=2, last_failed=100.0, backoff_s=0) is None


@pytest.mark.parametrize(
    "args,needle",
    [
        (["drain", "{run}"], "needs a worker command"),
        (["drain", "{run}", "--", "python", "v.py"], "{checkpoint} placeholder"),
        (["drain", "{run}/missing", "--", "x", "{checkpoint}"], "does not exist"),
        (["drain", "{run}", "--lease", "-1", "--", "x", "{checkpoint}"], "--lease"),
        (["drain", "{run}", "--lease", "inf", "--", "x", "{checkpoint}"], "--lease"),
        (["status", "{run}/missing"], "does not exist"),
        # a folder that is not a run (a mistyped logs dir): refused, like `traceml curve` does (QA #12a)
        (["status", "{run}"], "is not a run directory"),
        (["drain", "{run}", "--", "x", "{checkpoint}"], "is not a run directory"),
        (["drain", "{run}", "--retry-backoff", "-1", "--", "x", "{checkpoint}"], "--retry-backoff"),
        (["drain", "{run}", "--timeout", "0", "--", "x", "{checkpoint}"], "--timeout"),
        (["frobnicate"], "unknown subcommand"),
        ([], "give a subcommand"),
        (["status", "{run}", "--max-attempts", "0"], "--max-attempts"),
        (["drain", "{run}", "--max-attempts", "0", "--", "x", "{checkpoint}"], "--max-attempts"),
    ],
)
def test_bad_usage_is_one_line_exit_2(tmp_path, args, needle):
    from traceml_tui import validate_cli

    # in-process (support/cli.py): what is checked is the argument handling; the drain tests run the entry point
    proc = run_main(["validate", *[a.replace("{run}", str(tmp_path)) for a in args]])
    assert proc.returncode == 2
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert validate_cli.USAGE


def test_publish_checkpoint_saves_state_immutably_and_requests_once(tmp_path):
    torch = pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    first = publish_checkpoint(run_dir, {"w": torch.ones(2)}, step=120, config_digest=DIGEST)
    again = publish_checkpoint(run_dir, {"w": torch.zeros(2)}, step=120, config_digest=DIGEST)
    assert (first, again) == ("step-00000120", "step-00000120-2")
    request = backlog.read_json(RunDir(run_dir).request(first))
    assert request["path"] == "checkpoints/step-00000120.pt" and request["step"] == 120
    assert set(request) == {"checkpoint", "step", "path", "config_digest", "created"}
    assert torch.load(run_dir / request["path"])["w"].tolist() == [1.0, 1.0]  # not overwritten by the second
    assert os.stat(run_dir / request["path"]).st_mode & 0o222 == 0  # read-only


def test_a_published_file_is_copied_once_read_only_under_checkpoints(tmp_path, monkeypatch):
    """docs/hygiene.md: a published checkpoint is immutable — a file the script names gets the home a state gets.

    The script's own file is copied: a relative path is the script's (its current folder, not the run
    directory), and overwriting it afterwards (the next save to the same name) changes nothing published.
    """
    run_dir = tmp_path / "logs" / "run"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    own = tmp_path / "ckpt" / "last.pt"
    own.write_bytes(b"step 10")
    first = publish_checkpoint(run_dir, "ckpt/last.pt", step=10, config_digest=DIGEST)
    own.write_bytes(b"step 20")  # the script saves its next checkpoint under the same name
    second = publish_checkpoint(run_dir, Path("ckpt/last.pt"), step=20, config_digest=DIGEST)
    layout = RunDir(run_dir)
    for ckpt, content in ((first, b"step 10"), (second, b"step 20")):
        request = backlog.read_json(layout.request(ckpt))
        assert request["path"] == f"checkpoints/{ckpt}.pt"  # relative to the run directory: no absolute path
        published = run_dir / request["path"]
        assert published.read_bytes() == content and published.stat().st_ino != own.stat().st_ino
        assert published.stat().st_mode & 0o222 == 0
    inside = run_dir / "mine.safetensors"
    inside.write_bytes(b"y")
    third = publish_checkpoint(run_dir, inside, step=30, config_digest=DIGEST)
    assert backlog.read_json(layout.request(third))["path"] == f"checkpoints/{third}.safetensors"


def test_publishing_a_missing_file_is_one_clear_error_and_writes_nothing(tmp_path, monkeypatch):
    run_dir = tmp_path / "logs" / "run"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        publish_checkpoint(run_dir, "ckpt/model_10.pt", step=10, config_digest=DIGEST)
    assert str(info.value) == ("publish_checkpoint: checkpoint file or folder not found: ckpt/model_10.pt "
                               "(a relative path is read from the folder the script runs in)")
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ValueError, match=r"^publish_checkpoint: the checkpoint folder has no files: ckpt$"):
        publish_checkpoint(run_dir, "ckpt", step=10, config_digest=DIGEST)
    assert not run_dir.exists()


def test_status_words_are_the_backlog_states_of_core(tmp_path):
    """Every request state comes from core.state.decide_backlog, in its words, in JSON and text alike."""
    from traceml_tui.validate_cli import format_status

    run_dir = tmp_path / "run"
    done, live, stale, failed, blocked, waiting = _publish(run_dir, [1, 2, 3, 4, 5, 6])
    backlog.write_receipt(run_dir, backlog.read_json(RunDir(run_dir).request(done)), {"loss": 1.0})
    me = backlog.current_owner()
    gone = dict(me, start_time=me["start_time"] - 1000)  # this host, a pid reused by another process
    now = time.time()
    for ckpt, owner in ((live, me), (stale, gone)):
        atomic_write_json(RunDir(run_dir).claim(ckpt), {"checkpoint": ckpt, "owner": owner, "claimed": now,
                                                        "heartbeat": now, "lease_s": 60.0})
    backlog.write_failure(run_dir, failed, "exit code 1")
    for _ in range(3):
        backlog.write_failure(run_dir, blocked, "exit code 2")
    status = backlog.backlog_status(run_dir)
    states = {r["checkpoint"]: r["state"] for r in status["requests"]}
    assert states == {done: "completed", live: "claimed", stale: "stale-claim", failed: "failed",
                      blocked: "blocked", waiting: "pending"}
    assert set(states.values()) == {s.value for s in BacklogState}
    assert list(status["counts"]) == ["stale-claim", "blocked", "failed", "claimed", "pending", "completed"]
    json.dumps(status)  # plain words, JSON-ready
    text = format_status(status)
    assert "requests: 1 stale-claim, 1 blocked, 1 failed, 1 claimed, 1 pending, 1 completed" in text
    assert f"{blocked:<20} step 5        blocked (3 failed: exit code 2)" in text
    # a run that declares more attempts is not blocked after three
    (run_dir / "manifest.json").write_text(json.dumps({"run_name": "run", "hygiene": {"validation": {"max_attempts": 5}}}))
    assert backlog.declared_max_attempts(run_dir) == 5
    assert {r["checkpoint"]: r["state"] for r in backlog.backlog_status(run_dir)["requests"]}[blocked] == "failed"
    assert backlog.backlog_status(run_dir, max_attempts=2)["counts"]["blocked"] == 1
