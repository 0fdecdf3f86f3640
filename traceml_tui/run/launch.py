"""The launcher of one node: manifest, spawn, tee, sample, outcomes, finalize.

Order of events (seed 000 "Saved artifacts and completion checks"):

1. node 0 writes ``manifest.json`` (exclusively: an existing run is never
   touched) and prints the "Measurement contract captured" confirmation; a
   fresh run also gets its reproduction bundle (``run/provenance.py``); every
   node's launcher beats its lease ``nodes/node_<k>/launcher.lease``
   (``run/lease.py``) from then until its final word (node 0: right after the
   manifest), so that a dead launcher or node is seen (docs/run.md);
2. the training command starts — the script itself for one process, else
   ``torch.distributed.run`` — with the run directory in its environment and
   a parent-death signal (``core/lifeline.py``: SIGTERM when the launcher dies);
   its stdout/stderr go to the terminal as written and to ``nodes/node_<k>/training.*.log``, where
   every line of a rank carries its ``[rank<N>]:`` prefix (``run/rank_logs.py``);
3. a sampler appends ``nodes/node_<k>/system.jsonl`` at ~1 Hz;
4. after training exits, a guarded launcher writes its node outcome; node 0
   collects all outcomes (bounded by the finalization timeout), records
   ``guard.training`` in the manifest and writes ``final_summary.json``/``.txt``;
5. the launcher exits with the training command's exit code. Collection or
   summary problems warn; they never replace that exit code.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import msgspec

from traceml_tui.core import artifacts, atomic, coverage, lifeline
from traceml_tui.core.rundir import MAX_RUN_NAME_CHARS, RunDir
from traceml_tui.core.signals import shielded
from traceml_tui.run.curve_refresh import CurveRefresher
from traceml_tui.run.curve_refresh import render as render_curve
from traceml_tui.run.lease import LeaseKeeper, still_beating
from traceml_tui.run.options import LaunchError, LaunchOptions
from traceml_tui.run.rank_logs import NodeLog, PipeTee, RankLogs
from traceml_tui.sdk import env as sdk_env

#: The module each rank starts through unless --no-auto-attach (docs/trainers.md); never imported here.
BOOTSTRAP = "traceml_tui.integrations.bootstrap"


_FINALIZE_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _dispositions() -> dict[int, Any]:
    """SIGINT's and SIGTERM's handlers now (none where this is not the main thread: nothing is changed there)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in _FINALIZE_SIGNALS}


def _restore_dispositions(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        if handler is not None:  # (None: a handler not installed from Python; left as it is)
            signal.signal(sig, handler)


def _warn(message: str) -> None:
    print(f"traceml run: warning: {message}", file=sys.stderr, flush=True)


class Launcher:
    """Launch and supervise the training command of one node."""

    def __init__(self, options: LaunchOptions, config: Any, hygiene: Optional[dict] = None) -> None:
        self.options = options
        self.config = config
        self.hygiene = hygiene
        self._blocked_warned: set[str] = set()  # blocked validation requests already warned about
        self._qc_dispatcher: Any = None  # the QC backlog's dispatcher (docs/qc.md), beside validation's
        self.run_dir = options.run_dir
        self.layout = RunDir(self.run_dir)
        self.node_dir = self.layout.node_dir(options.node_rank)
        self.guarded = config.guard is not None
        self.digest: Optional[str] = None
        self.manifest: Optional[artifacts.Manifest] = None  # node 0 only, once prepared
        self.interrupted = False
        self.stop_signal: Optional[int] = None  # the first SIGINT/SIGTERM this launcher forwarded to training
        self.child: Optional[subprocess.Popen] = None
        self.lease: Optional[LeaseKeeper] = None  # beats from the end of prepare() until the final word

    def _start_lease(self) -> None:
        """Start beating this node's launcher lease (run/lease.py); the run folder is ours from here on."""
        if self.lease is None:
            self.lease = LeaseKeeper(self.layout.lease(self.options.node_rank), self.options.node_rank,
                                     self.options.lease_s).start()

    # -- before anything starts -------------------------------------------------------------
    def prepare(self) -> None:
        """Create the run directory and (node 0) write the manifest; refuse without side effects."""
        if self.options.node_rank == 0 and not self.options.resume:
            if self.options.default_name:
                self._claim_default_name()
            else:
                self._refuse_used_run_dir()
        opts = self.options
        manifest_path = self.layout.manifest
        if opts.resume and opts.node_rank == 0 and not manifest_path.exists():
            raise LaunchError(f"--resume: no run {opts.run_name!r} to resume in {opts.logs_dir}")
        if opts.node_rank != 0:
            self._refuse_finished_run(manifest_path)
            if opts.resume:
                try:  # node 0 may not have resumed it yet; the hygiene block it recorded does not change
                    recorded = artifacts.read_manifest(manifest_path)
                except OSError:
                    recorded = None
                if recorded is not None:
                    self._keep_recorded_hygiene(recorded)
        try:
            self.node_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LaunchError(f"logs dir {opts.logs_dir} is not writable: {exc.strerror}") from None
        if not os.access(self.node_dir, os.W_OK | os.X_OK):
            raise LaunchError(f"logs dir {opts.logs_dir} is not writable")
        if self.guarded:
            from traceml_tui.guard.contract import contract_digest

            self.digest = contract_digest(self.config.guard)
        if opts.node_rank != 0:
            self._start_lease()
            return
        if opts.resume:
            try:
                previous = artifacts.read_manifest(manifest_path)
            except OSError as exc:
                raise LaunchError(f"--resume: cannot read {manifest_path}: {exc}") from None
            if previous is None:
                raise LaunchError(f"--resume: cannot read {manifest_path}: not a traceml manifest")
            if previous.guarded:
                raise LaunchError(
                    f"--resume: run {opts.run_name!r} is guarded; a guarded run is never resumed (choose a fresh --run-name)"
                )
            if still_beating(self.layout.lease(0), lambda line: print(f"[traceml] --resume: {line}", flush=True)):
                # Two launchers would train into the same rank folders (docs/run.md "Resume").
                raise LaunchError(f"--resume: run {opts.run_name!r} is still running (its launcher's lease "
                                  "beats); resume it once that launch has ended")
            topology = previous.topology
            recorded = (topology.nnodes, topology.nproc_per_node, topology.world_size)
            if recorded != (None, None, None) and recorded != (opts.nnodes, opts.nproc_per_node, opts.world_size):
                raise LaunchError(
                    f"--resume: run {opts.run_name!r} ran with {topology.nnodes} node(s) x "
                    f"{topology.nproc_per_node} process(es); resume it with the same topology"
                )
            self._keep_recorded_hygiene(previous)
            self.manifest = msgspec.structs.replace(previous, attempts=previous.attempts + 1, status="running")
            atomic.atomic_write_json(manifest_path, artifacts.to_builtins(self.manifest))
            self._start_lease()
            return
        self.manifest = self._initial_manifest()
        try:
            atomic.atomic_write_json(manifest_path, artifacts.to_builtins(self.manifest), exclusive=True)
        except FileExistsError:
            raise LaunchError(
                f"run {opts.run_name!r} already exists ({manifest_path}); choose a fresh --run-name"
            ) from None
        except OSError as exc:
            raise LaunchError(f"cannot write {manifest_path}: {exc.strerror}") from None
        self._start_lease()  # at once: a launcher killed from here on leaves a lease that expires
        if self.guarded:
            contract = self.config.guard
            measurement = contract["measurement"]
            end = measurement["start_step"] + measurement["completed_steps"] - 1
            source = self.config.path.name if self.config.path is not None else "traceml.yaml"
            print(
                f"[traceml] Measurement contract captured from {source}: "
                f"workload={contract['workload']['name']}, steps={measurement['start_step']}-{end} "
                f"-> {manifest_path}",
                file=sys.stderr,
                flush=True,
            )
        from traceml_tui.run.provenance import write_bundle

        write_bundle(self.layout, opts, self.config, self.hygiene)  # fresh run only; never raises

    def _keep_recorded_hygiene(self, previous: artifacts.Manifest) -> None:
        """A resumed run keeps the hygiene policy it recorded; an edited ``hygiene:`` block is refused.

        docs/hygiene.md: "A changed policy on resume is refused". The recorded
        block is then the one config of this launcher (the digest passed to the
        ranks, its drainer, the final early-stopping pass), the same one the
        script and manual drainers read from the manifest, so they never disagree.
        """
        from traceml_tui.hygiene.config import changed_item

        recorded = previous.hygiene if isinstance(previous.hygiene, dict) else None
        changed = changed_item(recorded, self.hygiene)
        if changed is not None:
            raise LaunchError(
                f"--resume: traceml.yaml changed the run's recorded hygiene policy ({changed}); "
                "restore it or choose a fresh --run-name"
            )
        self.hygiene = recorded

    def _refuse_used_run_dir(self) -> None:
        """A fresh run starts in an absent or empty folder: the one rule for "this run already exists".

        Anything there (even step files of an unmanaged ``traceml.init()``
        process, without a manifest) would be taken over: new attempts written
        beside it and its steps counted in the summary. The one exception is
        what other nodes of this multi-node run may have made before node 0
        started: ``nodes/node_<k>`` for ``k`` in ``1..nnodes-1``.
        """
        opts = self.options
        manifest_path = self.layout.manifest
        if os.path.lexists(manifest_path):
            raise LaunchError(f"run {opts.run_name!r} already exists ({manifest_path}); choose a fresh --run-name")
        if not os.path.lexists(self.run_dir):
            return  # (a logs dir that is no folder is refused below, as not writable)
        try:
            entries = sorted(os.listdir(self.run_dir)) if os.path.isdir(self.run_dir) else [""]
        except OSError as exc:
            raise LaunchError(f"cannot read {self.run_dir}: {exc.strerror}") from None
        peers = {f"node_{k}" for k in range(1, opts.nnodes)}
        for entry in entries:
            if entry == "nodes" and opts.nnodes > 1:
                try:
                    if set(os.listdir(self.run_dir / "nodes")) <= peers:
                        continue
                except OSError:
                    pass
            shown = entry if entry.isprintable() else ascii(entry)  # the refusal stays one line
            held = f" holds {shown}" if entry else " is not a folder"
            raise LaunchError(
                f"run {opts.run_name!r} already exists ({self.run_dir}{held}); choose a fresh --run-name"
            )

    def _claim_default_name(self) -> None:
        """Take the first free ``<name>``, ``<name>-2``, … by creating its folder (atomic: two launchers never share one).

        Default names have one-second resolution, so two launches in the same
        second would otherwise collide, and the user never chose the name.
        Multi-node runs always have a chosen name (every node must agree on it).
        """
        opts = self.options
        try:
            opts.logs_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LaunchError(f"logs dir {opts.logs_dir} is not writable: {exc.strerror}") from None
        base = opts.run_name
        for number in range(1, 1000):
            suffix = "" if number == 1 else f"-{number}"
            name = base[: MAX_RUN_NAME_CHARS - len(suffix)] + suffix
            try:
                (opts.logs_dir / name).mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                raise LaunchError(f"logs dir {opts.logs_dir} is not writable: {exc.strerror}") from None
            break
        else:
            raise LaunchError(f"no free run name {base}-N in {opts.logs_dir}; choose a --run-name")
        if name != base:
            print(f"[traceml] run {base!r} already exists; this run is {name!r}", file=sys.stderr, flush=True)
        self.options = dataclasses.replace(opts, run_name=name)
        self.run_dir = self.options.run_dir
        self.layout = RunDir(self.run_dir)
        self.node_dir = self.layout.node_dir(opts.node_rank)

    def _refuse_finished_run(self, manifest_path: Path) -> None:
        """A node k > 0 never writes into a run that already finished or already holds its outcome."""
        if self.layout.outcome(self.options.node_rank).exists():
            raise LaunchError(
                f"run {self.options.run_name!r} already holds an outcome of node {self.options.node_rank}; "
                "choose a fresh --run-name"
            )
        try:
            manifest = artifacts.read_manifest(manifest_path)
        except OSError:
            return  # node 0 has not written it yet: the normal multi-node start
        if manifest is None:
            return  # not (yet) a readable manifest: nothing says the run finished
        status = manifest.status
        if status in ("completed", "failed", "interrupted") and not self.options.resume:
            raise LaunchError(f"run {self.options.run_name!r} already finished ({status}); choose a fresh --run-name")

    def _initial_manifest(self) -> artifacts.Manifest:
        opts = self.options
        return artifacts.Manifest(
            run_name=opts.run_name,
            status="running",
            started_at=time.time(),
            ended_at=None,
            exit_code=None,
            mode=self.config.mode,
            history_enabled=self.config.history_enabled,
            history_retention_s=self.config.history_retention,
            topology=artifacts.Topology(
                nnodes=opts.nnodes, nproc_per_node=opts.nproc_per_node, world_size=opts.world_size
            ),
            launch=artifacts.Launch(kind="process" if opts.world_size == 1 else "torch.distributed.run"),
            trace_max_steps=opts.trace_max_steps,
            attempts=1,
            guard=artifacts.Guard(contract=self.config.guard, contract_digest=self.digest) if self.guarded else msgspec.UNSET,
            hygiene=self.hygiene if self.hygiene is not None else msgspec.UNSET,
        )

    # -- training ---------------------------------------------------------------------------
    def command(self, rank_logs: Optional[Any] = None) -> list[str]:
        """The training command; ``rank_logs`` (a :class:`~traceml_tui.run.rank_logs.RankLogs`) adds
        torchrun's per-rank redirects."""
        opts = self.options
        script = [str(opts.script), *opts.script_args]
        if opts.auto_attach:  # each rank starts through the bootstrap that attaches trainer callbacks
            script = ["-m", BOOTSTRAP, *script]
        if opts.world_size == 1:
            return [sys.executable, "-u", *script]
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={opts.nproc_per_node}"]
        if opts.nnodes == 1 and opts.master_port is None:
            cmd.append("--standalone")
        else:
            cmd += [
                f"--nnodes={opts.nnodes}",
                f"--node-rank={opts.node_rank}",
                f"--master-addr={opts.master_addr}",
                f"--master-port={opts.master_port}",
            ]
        if rank_logs is not None:
            cmd += rank_logs.torchrun_args()
        return cmd + script

    def child_env(self) -> dict[str, str]:
        opts = self.options
        child = dict(os.environ)
        child[sdk_env.RUN_DIR] = str(self.run_dir.resolve())
        child[sdk_env.RUN_NAME] = opts.run_name
        child[sdk_env.NODE_RANK] = str(opts.node_rank)
        child[sdk_env.NNODES] = str(opts.nnodes)
        child[sdk_env.NPROC_PER_NODE] = str(opts.nproc_per_node)
        if opts.trace_max_steps is not None:
            child[sdk_env.TRACE_MAX_STEPS] = str(opts.trace_max_steps)
        if self.hygiene is not None:
            from traceml_tui.hygiene.config import validation_config_digest

            child[sdk_env.VALIDATION_DIGEST] = validation_config_digest(self.hygiene)
        child["PYTHONUNBUFFERED"] = "1"
        return child

    def _forward_signal(self, signum: int, _frame: Any) -> None:
        child = self.child
        if self.interrupted and child is not None:  # second signal: stop waiting politely
            self._signal_group(child, signal.SIGKILL)
            return
        self.interrupted = True
        self.stop_signal = signum
        if child is not None:
            self._signal_group(child, signum)
            # torchrun can sit in a rendezvous retry loop that ignores SIGINT: escalate if it lingers
            for delay, escalation in ((10.0, signal.SIGTERM), (20.0, signal.SIGKILL)):
                timer = threading.Timer(delay, self._escalate, args=(child, escalation))
                timer.daemon = True
                with shielded():  # (core/signals.py: a signal sent to the launcher goes to the main thread)
                    timer.start()

    def _escalate(self, child: subprocess.Popen, signum: int) -> None:
        if child.poll() is None:
            _warn(f"training still running; sending {signal.Signals(signum).name}")
            self._signal_group(child, signum)

    @staticmethod
    def _signal_group(child: subprocess.Popen, signum: int) -> None:
        try:
            os.killpg(child.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def run(self) -> int:
        """Run training to completion, then finalize; return the training exit code."""
        from traceml_tui.run.sampler import SystemSampler

        opts = self.options
        sampler = SystemSampler(self.layout.system(opts.node_rank), opts.run_name, opts.node_rank)
        sampler.start()
        curve = self._start_curve_refresher()
        validation = self._start_validation_drainer()
        previous = {sig: signal.signal(sig, self._forward_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            logs = {"stdout": NodeLog(self.layout.stdout_log(opts.node_rank)),
                    "stderr": NodeLog(self.layout.stderr_log(opts.node_rank))}
            # Each rank's own output goes through files of its own, so every line in the logs has its rank.
            ranks = RankLogs(self.node_dir, opts.node_rank, opts.nproc_per_node, logs) if opts.world_size > 1 else None
            try:
                # The training command gets SIGTERM if this launcher dies (even by SIGKILL); torchrun
                # then stops its ranks, and the ranks also watch torchrun itself (sdk init()).
                self.child = subprocess.Popen(
                    lifeline.wrap(self.command(ranks)),
                    env=self.child_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            except OSError as exc:
                print(f"traceml run: cannot start training: {exc.strerror}", file=sys.stderr)
                exit_code = 127
                if ranks is not None:
                    ranks.finish()
                for log in logs.values():
                    log.close()
            else:
                tees = [
                    PipeTee(self.child.stdout, sys.stdout.buffer, logs["stdout"]),
                    PipeTee(self.child.stderr, sys.stderr.buffer, logs["stderr"]),
                ]
                with shielded():
                    for tee in tees:
                        tee.start()
                    if ranks is not None:
                        ranks.start()
                returncode = self.child.wait()
                # A grandchild may still hold the pipes; give the copies one short shared deadline.
                deadline = time.monotonic() + 2.0
                for tee in tees:
                    tee.join(timeout=max(0.0, deadline - time.monotonic()))
                if ranks is not None:
                    ranks.finish()
                for log in logs.values():
                    log.close()
                exit_code = returncode if returncode >= 0 else 128 - returncode
                if self.stop_signal is not None and exit_code != 0:
                    # Stopped by a signal: 128 + its number, as a shell and a scheduler expect (docs/run.md).
                    # torchrun, unlike one process, turns the SIGTERM it gets into its own exit code 1.
                    exit_code = 128 + self.stop_signal
        finally:
            sampler.stop()
            if curve is not None:
                curve.stop()  # a render in flight is killed: the final one (finalize) supersedes it
        try:
            if validation is not None:
                self._drain_after_training(*validation)
            self.finalize(exit_code)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.lease is not None:  # the final word is written (or never will be by us): stop beating
                self.lease.finish()
        return exit_code

    # -- after training ---------------------------------------------------------------------
    def status_for(self, exit_code: int) -> str:
        if exit_code == 0:
            return "completed"
        return "interrupted" if self.interrupted else "failed"

    def finalize(self, exit_code: int) -> None:
        """Outcomes, manifest, summary, curve. Never raises; problems are warnings.

        The signal dispositions it changes on the way (Ctrl-C ends the wait for other nodes; then both
        signals are ignored for the last writes) are put back when it returns: a process that goes on after
        it (``run_cli.main`` called in a test process) would otherwise ignore SIGTERM for good, and every
        process it starts after would inherit that (an ignored signal survives ``exec``).

        The launcher lease stops beating when it returns: the final word is written. Left beating, its
        thread outlived a launcher finalized in a process that went on, and went on writing the lease's
        relative path under whatever folder that process had moved to since."""
        previous = _dispositions()
        try:
            self._finalize(exit_code)
        finally:
            _restore_dispositions(previous)
            if self.lease is not None:
                self.lease.finish()

    def _finalize(self, exit_code: int) -> None:
        opts = self.options
        if self.guarded:
            try:
                from traceml_tui.guard.outcome import build_outcome, write_outcome

                outcome = build_outcome(
                    run_name=opts.run_name,
                    node_rank=opts.node_rank,
                    nnodes=opts.nnodes,
                    nproc_per_node=opts.nproc_per_node,
                    contract_digest=self.digest,
                    exit_code=exit_code,
                    completed_at=time.time(),
                )
                write_outcome(self.run_dir, opts.node_rank, outcome)
            except Exception as exc:  # noqa: BLE001 - outcome problems never change the exit code
                _warn(f"could not write the node outcome: {exc}")
        if opts.node_rank != 0:
            return
        training = None
        if self.guarded:
            from traceml_tui.guard.outcome import collect_outcomes

            def collect(timeout_s: float) -> dict:
                return collect_outcomes(
                    self.run_dir,
                    run_name=opts.run_name,
                    nnodes=opts.nnodes,
                    nproc_per_node=opts.nproc_per_node,
                    contract_digest=self.digest,
                    timeout_s=timeout_s,
                )

            # Ctrl-C while waiting for other nodes ends the wait, not the finalization.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                training = collect(opts.finalize_timeout)
            except KeyboardInterrupt:
                _warn("outcome collection interrupted; recording what has arrived")
                self.interrupted = True
                training = collect(0.0)
            except Exception as exc:  # noqa: BLE001
                _warn(f"node outcome collection failed: {exc}")
                training = {
                    "status": "incomplete",
                    "nodes_expected": opts.nnodes,
                    "nodes_observed": 0,
                    "reasons": ["node_outcome_collection_failed"],
                    "nodes": [],
                }
            if training.get("status") != "completed":
                _warn(f"launcher completion incomplete: {', '.join(training.get('reasons', [])) or 'unknown'}")
        # the last writes are short; a further Ctrl-C must not leave the run marked running
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._finish_manifest(exit_code, training)
        if self.hygiene is not None:
            self._render_curve()  # before the summary, which names the curve it finds
        self._write_summary()

    def _finish_manifest(self, exit_code: int, training: Optional[dict]) -> None:
        try:
            current = self.manifest if self.manifest is not None else self._initial_manifest()
            manifest = msgspec.structs.replace(
                current, status=self.status_for(exit_code), exit_code=exit_code, ended_at=time.time()
            )
            if training is not None:
                guard = manifest.guard if isinstance(manifest.guard, artifacts.Guard) else artifacts.Guard()
                manifest.guard = msgspec.structs.replace(
                    guard, training=msgspec.convert(training, artifacts.GuardTraining)
                )
            telemetry = self._telemetry(manifest)
            if telemetry is not None:
                manifest.telemetry = telemetry
            atomic.atomic_write_json(self.layout.manifest, artifacts.to_builtins(manifest))
            self.manifest = manifest
        except (OSError, msgspec.ValidationError) as exc:
            _warn(f"could not update the manifest: {exc}")

    def _telemetry(self, manifest: artifacts.Manifest) -> Optional[artifacts.Telemetry]:
        """What the ranks delivered (run/telemetry.py), with its warnings; None when it cannot be told."""
        try:
            from traceml_tui.run.telemetry import telemetry_section, telemetry_warnings

            contract = manifest.guard.contract if isinstance(manifest.guard, artifacts.Guard) else None
            measurement = contract.get("measurement") if isinstance(contract, dict) else None
            window = None
            if isinstance(measurement, dict):
                window = (measurement["start_step"], measurement["start_step"] + measurement["completed_steps"] - 1)
            retention = manifest.history_retention_s
            section = telemetry_section(self.run_dir, expected_ranks=self.options.world_size, window=window,
                                        retention_s=retention)
            for line in telemetry_warnings(section, retention):
                _warn(line)
            return msgspec.convert(section, artifacts.Telemetry)
        except Exception as exc:  # noqa: BLE001 - telemetry problems never change the exit code
            _warn(f"could not count the delivered telemetry: {type(exc).__name__}: {exc}")
            return None

    def _write_summary(self) -> None:
        try:
            from traceml_tui.summary.build import build_summary
            from traceml_tui.summary.store import write_summary

            manifest = artifacts.to_builtins(self.manifest) if self.manifest is not None else None
            summary = build_summary(self.run_dir, manifest)
            summary["failure"] = self._failure_section()
            write_summary(self.run_dir, summary)
        except Exception as exc:  # noqa: BLE001 - a summary problem must not change the exit code
            _warn(f"could not write final_summary.json: {type(exc).__name__}: {exc}")
            return
        print(summary["text"], file=sys.stderr, flush=True)
        print(f"[traceml] summary: {self.layout.summary_json}", file=sys.stderr, flush=True)
        validation = summary.get("validation") or {}
        if validation.get("status") == "missing":
            _warn(f"validation missing: {validation.get('missing')}")
        if validation:
            from traceml_tui.hygiene.report import early_stopping_notes

            # What early stopping could not use (a blocked checkpoint, a metric no receipt reports)
            # changes what the run selected: said out loud, in the summary's words.
            for note in early_stopping_notes(validation.get("early_stopping")):
                _warn(f"early stopping: {note}")
        for line in summary.get("hygiene_warnings") or []:  # worded once: hygiene/warnings.py
            _warn(line)
        if (summary.get("integration") or {}).get("steps_traced") is False:
            # the summary decided it (summary/build.py integration_section); the words are core/coverage.py's
            print(f"traceml run: {coverage.NO_STEP_LINE}", file=sys.stderr, flush=True)

    def _failure_section(self) -> Optional[dict]:
        """Who failed first, where and why (run/failure.py); None for a clean run or when it cannot be told.

        A run stopped from outside (``interrupted``: Ctrl-C, SIGTERM) did not fail by itself, with one
        exception: it was hung when it was stopped (the usual end of a hang: a scheduler's cancel or time limit
        comes long before a collective's timeout). Then the hang is its failure, with the line every other
        surface shows (docs/run.md "Hang forensics"); without it the summary said only `interrupted`.
        """
        if self.manifest is None:
            return None
        try:
            from traceml_tui.run.failure import failure_section

            failure = failure_section(self.run_dir, self.manifest.exit_code,
                                      only_hang=self.manifest.status == "interrupted")
        except Exception as exc:  # noqa: BLE001 - forensics must never cost the run its summary
            _warn(f"could not analyse the failure: {type(exc).__name__}: {exc}")
            return None
        if self.manifest.status == "interrupted" and (failure is None or failure.get("cause") != "hang"):
            return None
        return failure

    # -- learning curve (hygiene) -------------------------------------------------------------
    def _curve_cmd(self) -> list[str]:
        return [sys.executable, "-m", "traceml_tui", "curve", str(self.run_dir)]

    def _render_curve(self) -> None:
        render_curve(self._curve_cmd(), _warn)  # ended by SIGTERM past its time: it removes its temp file

    def _start_curve_refresher(self) -> Optional[CurveRefresher]:
        """Refresh learning_curve.png every ``hygiene.curve.cadence`` updates while training runs (node 0)."""
        if self.hygiene is None or self.options.node_rank != 0:
            return None
        cadence = int((self.hygiene.get("curve") or {}).get("cadence") or 0)
        if cadence < 1:
            return None
        from traceml_tui.sdk.session import last_recorded_step

        return CurveRefresher(self._curve_cmd(), cadence, lambda: last_recorded_step(self.run_dir, 0)[1],
                              _warn).start()

    # -- validation backlog (hygiene) -------------------------------------------------------------
    def _start_validation_drainer(self) -> Optional[tuple[Any, threading.Event, threading.Thread]]:
        """Node 0 drains the declared validation backlog while training runs (docs/hygiene.md).

        When the run declares ``hygiene.validation`` with the default
        ``dispatcher: launcher``, a thread starts the declared worker as a
        ``traceml validate drain`` process whenever requests wait and none of
        ours runs (:class:`traceml_tui.hygiene.dispatch.Dispatcher`; claims keep
        it apart from any other drainer). The worker runs from the folder of
        ``traceml.yaml``, where its relative paths were written.
        """
        validation = (self.hygiene or {}).get("validation")
        if self.options.node_rank != 0 or not isinstance(validation, dict):
            return None
        from traceml_tui.hygiene.config import DISPATCH_LAUNCHER
        from traceml_tui.hygiene.dispatch import Dispatcher

        if validation.get("dispatcher", DISPATCH_LAUNCHER) != DISPATCH_LAUNCHER:
            return None
        cwd = self.config.path.parent if getattr(self.config, "path", None) is not None else Path.cwd()
        dispatcher = Dispatcher.from_config(self.run_dir, self.hygiene, cwd=cwd)
        # Heavy QC (docs/qc.md): the QC backlog is drained beside validation, by the same drainer.
        self._qc_dispatcher = Dispatcher.for_qc(self.run_dir, self.hygiene, cwd=cwd)
        stop = threading.Event()

        warned = self._blocked_warned

        def loop() -> None:
            while not stop.wait(1.0):
                for one in (dispatcher, self._qc_dispatcher):
                    try:
                        if one is not None:
                            one.poke()
                    except OSError as exc:  # a drainer that cannot start now is retried at the next poke
                        _warn(f"could not start a {one.kind} drainer: {exc}")
                try:
                    self._warn_blocked(dispatcher.max_attempts, warned)
                except OSError:
                    pass  # said at the next pass

        thread = threading.Thread(target=loop, name="traceml-validation-dispatch", daemon=True)
        with shielded():
            thread.start()
        return dispatcher, stop, thread

    def _warn_blocked(self, max_attempts: int, warned: set[str]) -> None:
        """One line as soon as a request is blocked: no drainer retries it and early stopping skips it."""
        from traceml_tui.hygiene import backlog

        for request in backlog.open_requests(self.run_dir, skip=warned):
            ckpt = request["checkpoint"]
            if ckpt in warned or backlog.retry_wait(self.run_dir, ckpt, max_attempts=max_attempts) is not None:
                continue
            records = backlog.failures_of(self.run_dir, ckpt)
            if not records or backlog.read_receipt(self.run_dir, ckpt) is not None:
                continue  # completed
            warned.add(ckpt)
            _warn(f"validation blocked: {ckpt} (update {request.get('step')}) failed {len(records)} attempts "
                  f"(last: {records[-1].get('error')}); no drainer retries it and early stopping skips it")

    def _drain_after_training(self, dispatcher: Any, stop: threading.Event, thread: threading.Thread) -> None:
        """Drain what training left in the backlog; Ctrl-C (or a user's interrupt of training) leaves it pending."""
        stop.set()
        thread.join()
        qc = self._qc_dispatcher
        if self.interrupted:
            for one in (dispatcher, qc):
                proc = one.proc if one is not None else None
                if proc is not None and proc.poll() is None:  # its claim is recovered by the next drainer
                    proc.terminate()
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
            return
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            for one in (dispatcher, qc):
                if one is None:
                    continue
                print(f"[traceml] draining the {one.kind} backlog ...", file=sys.stderr, flush=True)
                try:
                    one.drain_final()
                except KeyboardInterrupt:
                    _warn(f"final {one.kind} drain interrupted; what is left stays pending for the next drainer")
                    break
                except (OSError, subprocess.SubprocessError) as exc:
                    _warn(f"final {one.kind} drain failed: {exc}")
        finally:
            signal.signal(signal.SIGINT, previous)
        try:
            self._warn_blocked(dispatcher.max_attempts, self._blocked_warned)
        except OSError:
            pass
        self._consume_final_receipts()

    def _consume_final_receipts(self) -> None:
        """Let the script's early stopping consume the receipts of the final drain (docs/hygiene.md)."""
        from traceml_tui.hygiene.finalize import consume_final_receipts

        problem = consume_final_receipts(self.run_dir, self.hygiene or {})
        if problem is not None:
            _warn(problem)
