"""Real run directories for tests: every one produced by the real SDK and the real `traceml run`.

Test fixtures must come from the real thing (a hand-written record the SDK never
writes once hid that every finished run was shown as failed). Each case below
launches real training through ``python -m traceml_tui run`` (2-rank gloo DDP
through ``torch.distributed.run``, or one process) with the scripts in
``tests/scripts/`` and keeps whatever files that leaves:

====================  ==========================================================================
``completed``         2-rank DDP, 8 steps, the script never calls ``traceml.finish()``
``completed_finish``  one process, 8 steps, the script calls ``traceml.finish()`` at the end
``rank_raises``       2-rank DDP; rank 1 raises ``RuntimeError("CUDA out of memory (simulated)")``
                      inside step 5 (rank 0 then fails in step 5's all-reduce)
``rank_sigkilled``    2-rank DDP; rank 1 SIGKILLs itself after step 4 (rank 0 fails in step 5's all-reduce)
``rank_exits``        2-rank DDP; rank 1 calls ``sys.exit(3)`` after step 4 (its ``rank_end`` says ``exited`` with
                      code 3, written by the bootstrap as the script raised ``SystemExit``; torchrun's report has
                      exit code 3, or SIGABRT when gloo aborts the leaving rank; rank 0 is stopped after it)
``all_exit``          2-rank DDP; every rank calls ``sys.exit(3)`` after step 4 (a check that fails everywhere)
``teardown_crash``    2-rank DDP, 4 steps; rank 1 trains to the end, then aborts (SIGABRT) at interpreter exit
                      (a crash in teardown: every rank's script returned, its ``rank_end`` says ``completed``)
``single_exits``      one process; it calls ``sys.exit(3)`` after step 4
``interrupted``       one process, slow steps; the launcher gets SIGINT once rank 0 wrote 5 steps
``hung``              2-rank DDP, slow steps; rank 1 SIGSTOPs itself after step 5, rank 0 blocks
                      in its next all-reduce; the run directory is *copied* 1.5 s later (the
                      fixture), then every process is killed
``hang``              2-rank DDP; every rank all-reduces its loss each step, and inside step 3 rank 1 sleeps
                      before it (it never arrives); both watchdogs write a ``hang`` record after
                      :data:`HANG_FLOOR_S`; the run directory is copied then (``live_copy``: it hangs), and
                      the launch runs on until rank 0's gloo timeout (:data:`HANG_TIMEOUT_S`) fails it
``straggler``         2 ranks under ``traceml run`` that train without a per-step collective (``--no-ddp``); every
                      step sleeps 40 ms, rank 1's 30 % longer: a real straggler the summary calls ``STRAGGLER``
``hygiene``           one process with a ``hygiene:`` block publishing 6 checkpoints, then real
                      ``traceml validate drain`` processes leave a backlog in every state
====================  ==========================================================================

Use :func:`build_case` for one case, :class:`RealRuns` for a lazy mapping
case name -> :class:`RealRun` that builds each case on first access (a case
that fails to build raises :class:`CaseBuildError` on every access and never
stops the others), and ``scripts/make_fixture_runs.py`` to write them all to
a folder. Every process a case starts is gone when its builder returns.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Optional

import psutil
import yaml

from traceml_tui.sdk.window import WINDOW_S

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
DDP_SCRIPT = SCRIPTS / "ddp_train.py"
HYGIENE_SCRIPT = SCRIPTS / "hygiene_train.py"
VALIDATOR_SCRIPT = SCRIPTS / "validator.py"
TRACEML = [sys.executable, "-m", "traceml_tui"]

CASES: tuple[str, ...] = (
    "completed",
    "completed_finish",
    "rank_raises",
    "rank_sigkilled",
    "rank_exits",
    "all_exit",
    "teardown_crash",
    "single_exits",
    "interrupted",
    "hung",
    "hang",
    "hygiene",
    "straggler",
)

#: Seconds one launch may take before the case is abandoned (its processes killed).
LAUNCH_TIMEOUT_S = 90.0
#: How long the hung case waits after rank 1 stopped before copying the run directory.
HUNG_SETTLE_S = 1.5
#: The hang case: the watchdogs' overrun floor (TRACEML_HANG_FLOOR_S) and the gloo collective timeout.
HANG_FLOOR_S = 1.0
HANG_TIMEOUT_S = 20.0


class CaseBuildError(RuntimeError):
    """A case could not be produced; the message names the case and shows the launcher's stderr tail."""


@dataclass(frozen=True)
class RealRun:
    """One real run directory and the facts of how it was made.

    ``now_hint`` is a wall-clock time just after the run (for ``hung``: the
    moment its copy was taken) that tests can inject as "now". ``returncode``
    is the launcher's exit code (``None`` for ``hung``: it was killed).
    ``work_dir`` is the case's scratch folder: the launch directory, the
    launcher's own output (``<case>.launcher.out/.err``) and the ranks' pid
    files (``pids/rank_<r>.pid``).
    ``expected_backlog`` (``hygiene`` only) maps checkpoint id to the state the
    backlog is in, in the words ``pending``, ``claimed``, ``stale-claim``,
    ``completed``, ``failed``, ``blocked``.
    """

    case: str
    name: str
    run_dir: Path
    logs_dir: Path
    work_dir: Path
    now_hint: float
    returncode: Optional[int] = None
    captured_at: Optional[float] = None
    expected_backlog: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    build_s: float = 0.0
    live_copy: Optional[Path] = None  # ``hang``: a logs folder holding the run as it was while it hung

    def to_json(self) -> dict:
        return {
            "case": self.case,
            "name": self.name,
            "run_dir": str(self.run_dir),
            "logs_dir": str(self.logs_dir),
            "work_dir": str(self.work_dir),
            "now_hint": self.now_hint,
            "returncode": self.returncode,
            "captured_at": self.captured_at,
            "expected_backlog": dict(self.expected_backlog),
            "build_s": round(self.build_s, 2),
            "live_copy": None if self.live_copy is None else str(self.live_copy),
        }

    @classmethod
    def from_json(cls, data: Mapping) -> "RealRun":
        """The run :meth:`to_json` wrote (another process of the same test session built it)."""
        return cls(
            case=data["case"], name=data["name"], run_dir=Path(data["run_dir"]), logs_dir=Path(data["logs_dir"]),
            work_dir=Path(data["work_dir"]), now_hint=data["now_hint"], returncode=data["returncode"],
            captured_at=data["captured_at"], expected_backlog=MappingProxyType(dict(data["expected_backlog"])),
            build_s=data["build_s"], live_copy=None if data["live_copy"] is None else Path(data["live_copy"]),
        )


# --------------------------------------------------------------------------- environment & processes


def subprocess_env(state_dir: Path, **extra: str) -> dict[str, str]:
    """Environment for `traceml …` subprocesses (as tests/conftest.py's ``cli_env``).

    One BLAS thread, a private state dir, no inherited TRACEML_/torchrun
    variables, and this interpreter first on PATH (so a worker declared as
    ``python …`` runs with the same packages).
    """
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("TRACEML_", "TORCHELASTIC_", "PET_"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    env["XDG_STATE_HOME"] = str(state_dir)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def _tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (empty if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _pidfile_procs(pid_dir: Optional[Path], since: float) -> list[psutil.Process]:
    """Processes named by ``rank_<r>.pid`` files, if they still are the ones that wrote them."""
    procs = []
    if pid_dir is None or not pid_dir.is_dir():
        return procs
    for path in pid_dir.glob("*.pid"):
        try:
            proc = psutil.Process(int(path.read_text().strip()))
            # not a reused pid: started during this launch, with this pid dir on its command line
            if proc.create_time() >= since - 1.0 and str(pid_dir) in " ".join(proc.cmdline()):
                procs.append(proc)
        except (ValueError, OSError, psutil.Error):
            continue
    return procs


def _kill_all(procs: list[psutil.Process]) -> None:
    """SIGKILL every process given (stopped ones too) and wait until each is reaped or gone."""
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=15)


class _Launch:
    """One `traceml run` in its own session; stdout/stderr go to files (an unread pipe could block it)."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], log_prefix: Path,
                 pid_dir: Optional[Path] = None) -> None:
        self.started = time.time()
        self.pid_dir = pid_dir
        self.out_path = log_prefix.with_name(log_prefix.name + ".launcher.out")
        self.err_path = log_prefix.with_name(log_prefix.name + ".launcher.err")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([*TRACEML, "run", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=err, start_new_session=True)
        self.known: dict[int, psutil.Process] = {}

    def remember_tree(self) -> None:
        """Note the launcher's current descendants (torchrun's workers leave its process group)."""
        for proc in _tree(self.proc.pid) + _pidfile_procs(self.pid_dir, self.started):
            self.known.setdefault(proc.pid, proc)

    def wait(self, timeout: float = LAUNCH_TIMEOUT_S) -> int:
        deadline = time.monotonic() + timeout
        next_look = 0.0
        while self.proc.poll() is None:
            now = time.monotonic()
            if now > deadline:
                raise CaseBuildError(f"`traceml run` still running after {timeout:.0f} s\n{self.stderr_tail()}")
            if now >= next_look:  # a process-table scan costs CPU the 2-core runs need
                self.remember_tree()
                next_look = now + 1.0
            time.sleep(0.05)
        return self.proc.returncode

    def kill_everything(self) -> None:
        """SIGKILL the launcher and everything it started, wherever it was reparented."""
        self.remember_tree()
        _kill_all(list(self.known.values()))
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass

    def stderr_tail(self, chars: int = 3000) -> str:
        try:
            return self.err_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> "_Launch":
        return self

    def __exit__(self, *exc: object) -> None:
        # Normally everything has exited; after a failure nothing may be left running.
        self.kill_everything()


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str, launch: Optional[_Launch] = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if launch is not None:
            if launch.proc.poll() is not None:
                raise CaseBuildError(f"`traceml run` exited ({launch.proc.returncode}) before {what}\n"
                                     f"{launch.stderr_tail()}")
        if time.monotonic() > deadline:
            tail = launch.stderr_tail() if launch is not None else ""
            raise CaseBuildError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")
        time.sleep(0.05)


def count_steps(run_dir: Path, rank: int, attempt: int = 0) -> int:
    """Complete step records in one rank's step file (0 when it does not exist yet)."""
    path = run_dir / "ranks" / f"rank_{rank}" / f"steps-{attempt}.jsonl"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    return sum(1 for line in data.split(b"\n")[:-1] if b'"kind":"step"' in line)


# --------------------------------------------------------------------------- the cases


@dataclass
class _Ctx:
    case: str
    work_dir: Path
    logs_dir: Path
    name: str
    env: dict[str, str]

    @property
    def run_dir(self) -> Path:
        return self.logs_dir / self.name

    def run_args(self, script: Path, *, nproc: int = 2, logs_dir: Optional[Path] = None, script_args: tuple = ()) -> list[str]:
        args = [str(script), "--run-name", self.name, "--logs-dir", str(logs_dir or self.logs_dir)]
        if nproc > 1:
            args += ["--nproc-per-node", str(nproc)]
        return [*args, "--args", *map(str, script_args)]

    @property
    def pid_dir(self) -> Path:
        return self.work_dir / "pids"

    def launch(self, args: list[str], **extra_env: str) -> _Launch:
        env = dict(self.env, **extra_env)
        return _Launch(args, self.work_dir, env, self.work_dir / self.case, self.pid_dir)

    def result(self, returncode: Optional[int], **facts) -> RealRun:
        if not (self.run_dir / "manifest.json").is_file():
            raise CaseBuildError(f"{self.case}: no manifest.json in {self.run_dir}")
        now_hint = facts.pop("now_hint", None) or time.time()
        return RealRun(case=self.case, name=self.name, run_dir=self.run_dir, logs_dir=self.logs_dir,
                       work_dir=self.work_dir, now_hint=now_hint, returncode=returncode, **facts)


#: torchrun's --monitor-interval (read from $PET_MONITOR_INTERVAL) for the cases where one rank dies:
#: torchrun SIGTERMs the survivors as soon as it sees a worker gone (default: every 0.1 s), racing
#: rank 0's own error in its next collective (rank 0 writes ``rank_end`` ``failed`` only if it wins).
#: Checking every second lets rank 0 fail on its own every time, so the case is deterministic.
FAILURE_MONITOR_INTERVAL_S = "1.0"


def _finished_launch(ctx: _Ctx, *script_args: object, nproc: int = 2, **extra_env: str) -> RealRun:
    args = ctx.run_args(DDP_SCRIPT, nproc=nproc, script_args=(*script_args, "--pid-dir", ctx.pid_dir))
    with ctx.launch(args, **extra_env) as launch:
        code = launch.wait()
        stderr = launch.stderr_tail()
    run = ctx.result(code)
    if not (run.run_dir / "final_summary.json").is_file():
        raise CaseBuildError(f"{ctx.case}: the launcher wrote no final_summary.json\n{stderr}")
    return run


def _rank_exits(ctx: _Ctx) -> RealRun:
    run = _finished_launch(ctx, "--steps", 8, "--exit-after", 4, "--bad-rank", 1,
                           PET_MONITOR_INTERVAL=FAILURE_MONITOR_INTERVAL_S)
    _expect(run.returncode != 0, ctx, "the launcher exited 0 although rank 1 exited with code 3")
    return run


def _all_exit(ctx: _Ctx) -> RealRun:
    run = _finished_launch(ctx, "--steps", 8, "--exit-after", 4, "--bad-rank", "all",
                           PET_MONITOR_INTERVAL=FAILURE_MONITOR_INTERVAL_S)
    _expect(run.returncode != 0, ctx, "the launcher exited 0 although every rank exited with code 3")
    return run


def _teardown_crash(ctx: _Ctx) -> RealRun:
    run = _finished_launch(ctx, "--steps", 4, "--abort-at-exit", "--bad-rank", 1,
                           PET_MONITOR_INTERVAL=FAILURE_MONITOR_INTERVAL_S)
    _expect(run.returncode != 0, ctx, "the launcher exited 0 although rank 1 aborted at exit")
    return run


def _single_exits(ctx: _Ctx) -> RealRun:
    run = _finished_launch(ctx, "--steps", 8, "--exit-after", 4, "--bad-rank", 0, nproc=1)
    _expect(run.returncode == 3, ctx, f"launcher exit code {run.returncode}, expected the script's 3")
    return run


def _completed(ctx: _Ctx) -> RealRun:
    run = _finished_launch(ctx, "--steps", 8)
    _expect(run.returncode == 0, ctx, f"launcher exit code {run.returncode}, expected 0")
    return run


#: The straggler case: each step's sleep (ms) and how much longer rank 1's is (%).
STRAGGLER_WORK_MS = 40
STRAGGLER_SLOW_PCT = 30


def _straggler(ctx: _Ctx) -> RealRun:
    run = _finished_launch(ctx, "--steps", 80, "--no-ddp", "--work-ms", STRAGGLER_WORK_MS,
                           "--slow-pct", STRAGGLER_SLOW_PCT, "--bad-rank", 1)
    _expect(run.returncode == 0, ctx, f"launcher exit code {run.returncode}, expected 0")
    verdict = json.loads((run.run_dir / "final_summary.json").read_text())["primary_diagnosis"]
    _expect(verdict.get("status") == "STRAGGLER" and verdict.get("ranks") == [1], ctx,
            f"the summary's verdict is {verdict.get('status')} {verdict.get('ranks')}, expected STRAGGLER [1]")
    return run


def _completed_finish(ctx: _Ctx) -> RealRun:
    run = _finished_launch(ctx, "--steps", 8, "--finish", nproc=1)
    _expect(run.returncode == 0, ctx, f"launcher exit code {run.returncode}, expected 0")
    return run


def _rank_raises(ctx: _Ctx) -> RealRun:
    run = _finished_launch(ctx, "--steps", 8, "--raise-at", 5, "--bad-rank", 1,
                           PET_MONITOR_INTERVAL=FAILURE_MONITOR_INTERVAL_S)
    _expect(run.returncode != 0, ctx, "the launcher exited 0 although rank 1 raised")
    return run


#: The SIGKILL case's updates are longer than the SDK's write window, so each step is on disk when its update
#: ends (docs/run.md, "SDK"): a SIGKILL right after step 4 leaves steps 1–4. Shorter updates are written a few
#: at a time, and a SIGKILL loses those of the last window.
SIGKILL_WORK_MS = int(WINDOW_S * 1000) + 5


def _rank_sigkilled(ctx: _Ctx) -> RealRun:
    started = time.monotonic()
    run = _finished_launch(ctx, "--steps", 8, "--sigkill-after", 4, "--bad-rank", 1, "--work-ms", SIGKILL_WORK_MS,
                           PET_MONITOR_INTERVAL=FAILURE_MONITOR_INTERVAL_S)
    _expect(run.returncode != 0, ctx, "the launcher exited 0 although rank 1 was SIGKILLed")
    _expect(time.monotonic() - started < 60, ctx, "the launch took over 60 s (gloo waited on the dead rank)")
    return run


def _interrupted(ctx: _Ctx) -> RealRun:
    # One process: with 2 ranks torchrun forwards SIGINT to both, and a rank caught inside an
    # all-reduce may end `failed` (its peer left) instead of `interrupted`: not deterministic.
    args = ctx.run_args(DDP_SCRIPT, nproc=1, script_args=("--steps", 100000, "--sleep", 0.05, "--pid-dir", ctx.pid_dir))
    with ctx.launch(args) as launch:
        _wait_for(lambda: count_steps(ctx.run_dir, 0) >= 5, LAUNCH_TIMEOUT_S, "5 steps on rank 0", launch)
        launch.remember_tree()
        launch.proc.send_signal(signal.SIGINT)
        code = launch.wait(timeout=60)
    run = ctx.result(code)
    _expect(code != 0, ctx, "the launcher exited 0 after SIGINT")
    return run


def _hung(ctx: _Ctx) -> RealRun:
    live_logs = ctx.work_dir / "live-logs"
    pid_dir = ctx.pid_dir
    live_run = live_logs / ctx.name
    args = ctx.run_args(DDP_SCRIPT, logs_dir=live_logs,
                        script_args=("--steps", 100000, "--sleep", 0.05, "--sigstop-after", 5, "--bad-rank", 1,
                                     "--pid-dir", pid_dir))
    with ctx.launch(args) as launch:
        def rank1_stopped() -> bool:
            try:
                pid = int((pid_dir / "rank_1.pid").read_text())
                return psutil.Process(pid).status() == psutil.STATUS_STOPPED
            except (OSError, ValueError, psutil.Error):
                return False

        _wait_for(rank1_stopped, LAUNCH_TIMEOUT_S, "rank 1 to stop itself", launch)
        time.sleep(HUNG_SETTLE_S)
        launch.remember_tree()
        _expect(launch.proc.poll() is None, ctx, "the launcher exited while rank 1 was stopped")
        for _ in range(5):  # a copy racing the sampler's append could end in half a line: take it again
            if ctx.run_dir.exists():
                shutil.rmtree(ctx.run_dir)
            shutil.copytree(live_run, ctx.run_dir)
            captured_at = time.time()
            if all(p.read_bytes().endswith(b"\n") for p in ctx.run_dir.rglob("*.jsonl") if p.stat().st_size):
                break
        else:
            raise CaseBuildError(f"{ctx.case}: every copy of the live run ended in a partial line")
        launch.kill_everything()
    return ctx.result(None, now_hint=captured_at, captured_at=captured_at)


def _hang_records(run_dir: Path) -> set[int]:
    """Ranks whose stream holds a ``hang`` record (complete lines only)."""
    found = set()
    for path in run_dir.glob("ranks/rank_*/steps-*.jsonl"):
        data = path.read_bytes()
        if b'"kind":"hang"' in data[: data.rfind(b"\n") + 1]:
            found.add(int(path.parent.name.split("_")[1]))
    return found


def _hang(ctx: _Ctx) -> RealRun:
    args = ctx.run_args(DDP_SCRIPT, script_args=("--steps", 6, "--hang-at", 3, "--hang-s", 300, "--timeout",
                                                 HANG_TIMEOUT_S, "--pid-dir", ctx.pid_dir))
    live = ctx.work_dir / "live-copy"
    with ctx.launch(args, TRACEML_HANG_FLOOR_S=str(HANG_FLOOR_S), PET_MONITOR_INTERVAL=FAILURE_MONITOR_INTERVAL_S
                    ) as launch:
        _wait_for(lambda: _hang_records(ctx.run_dir) == {0, 1}, LAUNCH_TIMEOUT_S, "a hang record of each rank", launch)
        _expect(launch.proc.poll() is None, ctx, "the launcher exited before the collective timed out")
        for _ in range(5):  # a copy racing the sampler's append could end in half a line: take it again
            if live.exists():
                shutil.rmtree(live)
            shutil.copytree(ctx.run_dir, live / ctx.name)
            captured_at = time.time()
            if all(p.read_bytes().endswith(b"\n") for p in live.rglob("*.jsonl") if p.stat().st_size):
                break
        else:
            raise CaseBuildError(f"{ctx.case}: every copy of the live run ended in a partial line")
        _expect(not (live / ctx.name / "final_summary.json").exists(), ctx, "the run ended before its copy")
        code = launch.wait()
        stderr = launch.stderr_tail()
    run = ctx.result(code, captured_at=captured_at, live_copy=live)
    _expect(code != 0, ctx, "the launcher exited 0 although rank 0's all_reduce timed out")
    if not (run.run_dir / "final_summary.json").is_file():
        raise CaseBuildError(f"{ctx.case}: the launcher wrote no final_summary.json\n{stderr}")
    return run


# -- hygiene ------------------------------------------------------------------------------------

HYGIENE_STEPS = 10
HYGIENE_CADENCE = 2
#: Checkpoint id -> the state the drainers leave it in (ids are step-<8 digits>).
HYGIENE_EXPECTED = {
    "step-00000000": "completed",
    "step-00000002": "completed",
    "step-00000004": "failed",       # one failure file, attempts left
    "step-00000006": "blocked",      # 3 failures = the default max_attempts
    "step-00000008": "stale-claim",  # its drainer was SIGKILLed while its validator ran
    "step-00000010": "pending",      # no drainer ever touched it
}


def hygiene_config() -> dict:
    """The traceml.yaml of the hygiene case (worker: tests/scripts/validator.py, copied next to it)."""
    return {
        "mode": "summary",
        "history_enabled": True,
        "hygiene": {
            "history": {"schema": 1, "output": "ranks"},
            "curve": {"cadence": HYGIENE_CADENCE},
            "validation": {
                "recipe": "realruns-fixture-v1",
                "cadence": HYGIENE_CADENCE,
                "first_evaluation": 0,
                "worker": ["python", "validator.py", "--checkpoint", "{checkpoint}", "--step", "{step}"],
                "lease_s": 30,
                # no retry backoff: each drainer session of the case (and of tests on a copy) is a deliberate
                # next attempt, and its failed request must be retryable at once
                "retry_backoff_s": 0,
                "dispatcher": "external",  # the harness drives the drainers itself, after training
            },
            "early_stopping": {"enabled": False, "reason": "fixture run: a fixed 10 updates"},
            "qc": {"cadence": HYGIENE_CADENCE},
        },
    }


def _hygiene(ctx: _Ctx) -> RealRun:
    from traceml_tui.hygiene import backlog

    shutil.copy(VALIDATOR_SCRIPT, ctx.work_dir / "validator.py")
    (ctx.work_dir / "traceml.yaml").write_text(yaml.safe_dump(hygiene_config(), sort_keys=False))
    with ctx.launch(ctx.run_args(HYGIENE_SCRIPT, nproc=1, script_args=("--steps", HYGIENE_STEPS))) as launch:
        code = launch.wait()
        stderr = launch.stderr_tail()
    _expect(code == 0, ctx, f"training exited {code}\n{stderr}")
    run_dir = ctx.run_dir
    requests = sorted(backlog_files(run_dir))  # ids sort by step: step-<8 digits>
    _expect(requests == list(HYGIENE_EXPECTED), ctx, f"published {requests}, expected {list(HYGIENE_EXPECTED)}")
    worker = json.loads((run_dir / "manifest.json").read_text())["hygiene"]["validation"]["worker"]
    c0, c2, c4, c6, c8, c10 = requests

    plan = ctx.work_dir / "validation-plan.json"
    env = dict(ctx.env, REALRUNS_VALIDATION_PLAN=str(plan))
    drain = [*TRACEML, "validate", "drain", str(run_dir), "--lease", "30", "--", *worker]
    gates: dict[str, dict] = {}
    me = backlog.current_owner()

    def gate(*ckpts: str) -> None:
        """Hold claims (as a live owner on this host) so a drainer session passes these checkpoints by."""
        for ckpt in set(gates) - set(ckpts):
            backlog.release_claim(run_dir, gates.pop(ckpt))
        for ckpt in set(ckpts) - set(gates):
            claim = backlog.try_claim(run_dir, ckpt, me, 600.0)
            _expect(claim is not None, ctx, f"could not hold {ckpt}")
            gates[ckpt] = claim

    def session(actions: dict[str, str], expect: str) -> None:
        plan.write_text(json.dumps(actions))
        done = subprocess.run(drain, cwd=ctx.work_dir, env=env, capture_output=True, text=True, timeout=120)
        _expect(done.returncode == 0 and expect in done.stdout, ctx,
                f"drainer: exit {done.returncode}, stdout {done.stdout!r}, expected {expect!r}\n{done.stderr[-2000:]}")

    try:
        gate(c8, c10)
        session({c0: "ok", c2: "ok", c4: "fail", c6: "fail"}, "2 completed, 2 failed")
        gate(c4, c8, c10)
        session({c6: "fail"}, "0 completed, 1 failed")  # a new drainer retries it...
        session({c6: "fail"}, "0 completed, 1 failed")  # ...until its 3 attempts are spent
        gate(c4, c10)
        plan.write_text(json.dumps({c8: "hang"}))
        started = Path(f"{plan}.{c8}.started")
        with open(ctx.work_dir / "drainer-killed.log", "wb") as log:
            holder = subprocess.Popen(drain, cwd=ctx.work_dir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=log, start_new_session=True)
        try:
            _wait_for(lambda: started.exists() and started.read_text().strip() != "", 60,
                      f"the drainer to start validating {c8}")
            claim = json.loads((run_dir / "validation" / "claims" / f"{c8}.json").read_text())
            _expect(claim["owner"]["pid"] == holder.pid, ctx, f"{c8} is not claimed by the drainer")
        finally:
            procs = _tree(holder.pid)  # the drainer and its validator (one process group)
            try:
                os.killpg(holder.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _kill_all(procs)
            holder.wait(timeout=15)
    finally:
        gate()  # release every claim this process held: those checkpoints stay untouched

    _check_backlog(ctx, run_dir)
    return ctx.result(code, expected_backlog=MappingProxyType(dict(HYGIENE_EXPECTED)))


def backlog_files(run_dir: Path) -> dict[str, dict[str, list[Path]]]:
    """The backlog's files as on disk: checkpoint id -> {"requests"|"claims"|"receipts"|"failures": [paths]}.

    Read from the documented layout (``validation/<kind>/<id>.json``, failures
    ``<id>-<n>.json``), not through any library, so a check built on it holds
    whatever words the status rules use.
    """
    found: dict[str, dict[str, list[Path]]] = {}
    for kind in ("requests", "claims", "receipts", "failures"):
        for path in sorted((Path(run_dir) / "validation" / kind).glob("*.json")):
            if path.name.startswith("."):
                continue
            ckpt = json.loads(path.read_text())["checkpoint"]
            found.setdefault(ckpt, {k: [] for k in ("requests", "claims", "receipts", "failures")})[kind].append(path)
    return found


def _check_backlog(ctx: _Ctx, run_dir: Path) -> None:
    """Check the raw backlog files match HYGIENE_EXPECTED (no status rule involved)."""
    wanted_counts = {  # (receipts, failures, claims)
        "completed": (1, 0, 0), "failed": (0, 1, 0), "blocked": (0, 3, 0), "stale-claim": (0, 0, 1), "pending": (0, 0, 0),
    }
    files = backlog_files(run_dir)
    _expect(sorted(files) == sorted(HYGIENE_EXPECTED), ctx, f"backlog holds {sorted(files)}")
    for ckpt, state in HYGIENE_EXPECTED.items():
        kinds = files[ckpt]
        counts = (len(kinds["receipts"]), len(kinds["failures"]), len(kinds["claims"]))
        _expect(counts == wanted_counts[state], ctx,
                f"{ckpt}: (receipts, failures, claims) = {counts}, expected {wanted_counts[state]} for {state}")
        for claim_path in kinds["claims"]:
            owner = json.loads(claim_path.read_text())["owner"]["pid"]
            _expect(not psutil.pid_exists(owner), ctx, f"{ckpt}: the claim owner {owner} is still alive")


def _expect(condition: bool, ctx: _Ctx, message: str) -> None:
    if not condition:
        raise CaseBuildError(f"{ctx.case}: {message}")


BUILDERS: dict[str, Callable[[_Ctx], RealRun]] = {
    "completed": _completed,
    "completed_finish": _completed_finish,
    "rank_raises": _rank_raises,
    "rank_sigkilled": _rank_sigkilled,
    "rank_exits": _rank_exits,
    "all_exit": _all_exit,
    "teardown_crash": _teardown_crash,
    "single_exits": _single_exits,
    "interrupted": _interrupted,
    "hung": _hung,
    "hang": _hang,
    "hygiene": _hygiene,
    "straggler": _straggler,
}
assert tuple(BUILDERS) == CASES


def build_case(
    case: str,
    work_dir: Path,
    *,
    logs_dir: Optional[Path] = None,
    run_name: Optional[str] = None,
    env: Optional[dict[str, str]] = None,
) -> RealRun:
    """Produce one case: launch in ``work_dir`` (scratch: launcher logs, pid files), run in ``logs_dir``.

    ``logs_dir`` defaults to ``work_dir/logs``; ``run_name`` to the case name
    with ``-`` for ``_``. Raises :class:`CaseBuildError` when the real run did
    not turn out as the case needs.
    """
    if case not in BUILDERS:
        raise KeyError(f"unknown case {case!r} (one of {', '.join(CASES)})")
    work_dir = Path(work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    logs_dir = Path(logs_dir).resolve() if logs_dir is not None else work_dir / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    ctx = _Ctx(case=case, work_dir=work_dir, logs_dir=logs_dir, name=run_name or case.replace("_", "-"),
               env=env if env is not None else subprocess_env(work_dir / "state"))
    started = time.monotonic()
    run = BUILDERS[case](ctx)
    return _with_build_time(run, time.monotonic() - started)


def start_ddp(work_dir: Path, name: str, *script_args: object, nproc: int = 2,
              env: Optional[dict[str, str]] = None) -> tuple["_Launch", Path]:
    """Start ``tests/scripts/ddp_train.py`` under `traceml run` without waiting (a live run for a test to watch
    or signal): the launch — a context manager that kills everything it started on exit — and the run folder.
    The ranks write ``work_dir/pids/rank_<r>.pid``."""
    work_dir = Path(work_dir).resolve()
    logs_dir = work_dir / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    ctx = _Ctx(case=name, work_dir=work_dir, logs_dir=logs_dir, name=name,
               env=env if env is not None else subprocess_env(work_dir / "state"))
    args = ctx.run_args(DDP_SCRIPT, nproc=nproc, script_args=(*script_args, "--pid-dir", ctx.pid_dir))
    return ctx.launch(args), ctx.run_dir


def _with_build_time(run: RealRun, seconds: float) -> RealRun:
    from dataclasses import replace

    return replace(run, build_s=seconds)


class RealRuns(Mapping):
    """Lazy mapping case name -> :class:`RealRun`, each case built under ``root/<case>`` on first access.

    A case that fails raises its build error (usually :class:`CaseBuildError`)
    on every access, built once; the other cases are unaffected. Iteration
    lists all case names without building anything. :meth:`prefetch` starts
    building cases in the background (``workers`` at a time) so that tests
    needing several cases wait for them together; :meth:`close` cancels what
    has not started and waits for what has.
    """

    def __init__(self, root: Path, *, env_factory: Optional[Callable[[Path], dict[str, str]]] = None,
                 workers: int = 2) -> None:
        self.root = Path(root)
        self._env_factory = env_factory
        self._workers = workers
        self._lock = threading.Lock()
        self._futures: dict[str, Future] = {}
        self._executor: Optional[ThreadPoolExecutor] = None

    def _build(self, case: str) -> RealRun:
        work = self.root / case
        env = self._env_factory(work) if self._env_factory is not None else None
        return build_case(case, work, env=env)

    def __getitem__(self, case: str) -> RealRun:
        if case not in BUILDERS:
            raise KeyError(case)
        with self._lock:
            future = self._futures.get(case)
            mine = future is None
            if mine:
                future = self._futures[case] = Future()
                future.set_running_or_notify_cancel()
        if mine:
            try:
                future.set_result(self._build(case))
            except Exception as exc:  # noqa: BLE001 - kept and raised on every access
                future.set_exception(exc)
        return future.result()

    def prefetch(self, cases: Iterable[str]) -> None:
        """Start building these cases in the background (in this order); unknown names are ignored."""
        with self._lock:
            todo = [c for c in dict.fromkeys(cases) if c in BUILDERS and c not in self._futures]
            if not todo:
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="realruns")
            for case in todo:
                self._futures[case] = self._executor.submit(self._build, case)

    def close(self) -> None:
        """Cancel background builds not yet started; wait for the running ones (they clean up after themselves)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def __iter__(self) -> Iterator[str]:
        return iter(CASES)

    def __len__(self) -> int:
        return len(CASES)

    def built(self) -> dict[str, RealRun]:
        """The cases built successfully so far (never waits, never builds)."""
        return {case: f.result() for case, f in list(self._futures.items())
                if f.done() and not f.cancelled() and f.exception() is None}
