"""Rolling recovery saves: the training state a resumed attempt continues from (seed 004).

A recovery save is not a scientific checkpoint: it is written at its own declared
cadence (``hygiene.recovery.every``), never triggers validation, and only the
newest ``hygiene.recovery.keep`` per rank are kept — an older one is removed only
when nothing refers to it (a pending validation request, the early-stopping
selection, a resume or a provenance record). See docs/hygiene.md, "Recovery saves".

One save is one file, ``recovery/rank_<r>/step-<8 digits>.attempt-<a>.pt``,
written to a temporary name, fsynced and renamed into place: a file under its
final name is complete. It holds the model, optimizer and scheduler states, the
SDK's counters (step, attempt, examples), the Python, NumPy and torch CPU RNG
states (CUDA's too when CUDA is initialized) and the script's extras.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from traceml_tui.core import atomic
from traceml_tui.core.rundir import RECOVERY, RunDir
from traceml_tui.sdk.errors import Refused

FORMAT = 1
_SAVE_RE = re.compile(r"step-(\d{8})\.attempt-(\d+)\.pt")
#: One line per restore, so the save an attempt resumed from stays referenced (never pruned).
RESUMES = "resumes.jsonl"


class RecoveryError(Refused):
    """A recovery call that cannot do what it was asked; ``str()`` is one line."""


@dataclass(frozen=True)
class Save:
    """One complete recovery save on disk."""

    step: int
    attempt: int
    path: Path


@dataclass
class Recovered:
    """What :func:`traceml_tui.restore_recovery` restored: the update the session continues after, and extras."""

    step: int
    attempt: int
    path: str  # relative to the run directory
    extras: dict = field(default_factory=dict)


def save_name(step: int, attempt: int) -> str:
    """File name of the save of ``step`` written by ``attempt``."""
    return f"step-{int(step):08d}.attempt-{int(attempt)}.pt"


def list_saves(run_dir: Path, rank: int) -> list[Save]:
    """This rank's complete saves, oldest first (by step, then attempt); temporary files are not saves."""
    folder = RunDir(run_dir).recovery_dir(rank)
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    saves = []
    for entry in entries:
        match = _SAVE_RE.fullmatch(entry.name)
        if match and entry.is_file(follow_symlinks=False):
            saves.append(Save(int(match.group(1)), int(match.group(2)), Path(entry.path)))
    return sorted(saves, key=lambda s: (s.step, s.attempt))


def rng_state() -> dict:
    """The global RNG states: Python's, NumPy's (when imported), torch CPU's and CUDA's (when initialized)."""
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = (name, keys.tolist(), pos, has_gauss, cached)  # plain values: torch's safe loader reads them
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured; torch's CPU state is restored on the CPU, whatever the model's device."""
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"].cpu())
    if "numpy" in state:
        import numpy

        name, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((name, numpy.asarray(keys, dtype=numpy.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def write_save(run_dir: Path, rank: int, step: int, attempt: int, payload: dict) -> Path:
    """Write one save atomically (temporary file, fsync, rename) and return its path."""
    import torch

    target = RunDir(run_dir).recovery_dir(rank) / save_name(step, attempt)
    atomic.atomic_write_with(target, lambda handle: torch.save(payload, handle))
    return target


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _paths_in(value: Any) -> Iterator[str]:
    """Every string a JSON value holds (a reference may sit under any key)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _paths_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _paths_in(item)


def referenced(run_dir: Path) -> set[str]:
    """Run-relative paths that something still refers to; such a save is never removed.

    A pending validation request (no receipt yet), the early-stopping state (its
    selection), the resume log and the provenance records.
    """
    layout = RunDir(run_dir)
    refs: set[str] = set()
    for request_path in layout.backlog_files("requests"):
        request = _json(request_path)
        if isinstance(request, dict) and not layout.receipt(str(request.get("checkpoint", ""))).exists():
            refs.update(_paths_in(request))
    refs.update(_paths_in(_json(layout.early_stopping)))
    sources = [layout.path / RECOVERY / RESUMES]
    if layout.provenance.is_dir():
        sources += [p for p in layout.provenance.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl")]
    for source in sources:
        try:
            lines = source.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        if source.suffix == ".json":
            lines = ["\n".join(lines)]
        for line in lines:
            try:
                refs.update(_paths_in(json.loads(line)))
            except ValueError:
                continue
    return refs


def prune(run_dir: Path, rank: int, keep: int) -> list[Path]:
    """Remove this rank's saves beyond the newest ``keep`` that nothing refers to; returns the removed ones."""
    run_dir = Path(run_dir)
    saves = list_saves(run_dir, rank)
    older = saves[: max(0, len(saves) - keep)]
    if not older:
        return []
    refs = referenced(run_dir)
    removed = []
    for save in older:
        names = {save.path.relative_to(run_dir).as_posix(), str(save.path), str(save.path.resolve())}
        if names & refs:  # a request may name its file relative to the run or absolutely
            continue
        try:
            save.path.unlink()
            removed.append(save.path)
        except FileNotFoundError:
            pass
    return removed


def _state_dict(obj: Any) -> Any:
    return obj.state_dict() if obj is not None else None


def build_payload(session: Any, *, model: Any, optimizer: Any, scheduler: Any, extras: Optional[dict]) -> dict:
    """What one save holds (module docstring)."""
    return {
        "format": FORMAT,
        "step": session.last_step,
        "attempt": session.attempt,
        "examples": session.examples,
        "rank": session.rank,
        "ts": time.time(),
        "rng": rng_state(),
        "model": _state_dict(model),
        "optimizer": _state_dict(optimizer),
        "scheduler": _state_dict(scheduler),
        "extras": dict(extras or {}),
    }


def _extras(extras: Optional[dict]) -> dict:
    if extras is not None and not isinstance(extras, dict):
        raise RecoveryError(f"save_recovery: extras must be a dict, got {type(extras).__name__}")
    check_extras(extras or {})
    return dict(extras or {})


_PLAIN = (int, float, str, bool, bytes, type(None))


def check_extras(value: Any, where: str = "extras") -> None:
    """Refuse, at save time, an extra torch's safe loader would refuse at restore (one line naming where)."""
    if isinstance(value, _PLAIN) or type(value).__name__ == "Tensor":
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise RecoveryError(f"save_recovery: {where} has a key of type {type(key).__name__}; use str or int keys")
            check_extras(item, f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_extras(item, f"{where}[{i}]")
        return
    raise RecoveryError(f"save_recovery: {where} is a {type(value).__name__}; extras hold tensors, numbers, strings, "
                        "lists, tuples and dicts (a generator: pass its get_state())")


def common_steps(run_dir: Path, rank: int, world_size: int) -> Optional[set[int]]:
    """Updates every rank whose recovery folder this process sees has a save of; None: no other rank's folder.

    All ranks of a resumed DDP run must continue from the same update: a rank
    interrupted while writing its save must not make the others restore a newer
    one than it can. Ranks on another node's disk are not visible and not counted.
    """
    others = [r for r in range(world_size) if r != rank and RunDir(run_dir).recovery_dir(r).is_dir()]
    if not others:
        return None
    steps = {s.step for s in list_saves(run_dir, rank)}
    for other in others:
        steps &= {s.step for s in list_saves(run_dir, other)}
    return steps


def load_newest(run_dir: Path, rank: int, *, warn: Any = None,
                steps: Optional[set[int]] = None) -> Optional[tuple[Save, dict]]:
    """The newest save of this rank that loads; an unreadable one is named (``warn``) and the next older tried.

    Loaded with torch's safe loader (``weights_only=True``): a save is data, never code.
    """
    import torch

    for save in reversed(list_saves(run_dir, rank)):
        if steps is not None and save.step not in steps:
            continue
        try:
            payload = torch.load(save.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable save: fall back to an older one
            if warn is not None:
                warn(f"traceml: recovery save {save.path.name} is unreadable ({type(exc).__name__}); trying an older one")
            continue
        if isinstance(payload, dict) and payload.get("format") == FORMAT and payload.get("step") == save.step:
            return save, payload
        if warn is not None:
            warn(f"traceml: recovery save {save.path.name} is not a traceml recovery save; trying an older one")
    return None


def log_resume(run_dir: Path, rank: int, attempt: int, save: Save) -> None:
    """Append the resume record: this attempt continued from ``save`` (which stays referenced)."""
    path = Path(run_dir) / RECOVERY / RESUMES
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"rank": rank, "attempt": attempt, "step": save.step,
                       "path": save.path.relative_to(run_dir).as_posix(), "ts": time.time()}, sort_keys=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def declared(run_dir: Path) -> Optional[dict]:
    """The run's declared ``hygiene.recovery`` block (``{every, keep}``) from its manifest, or None."""
    from traceml_tui.hygiene.dispatch import load_effective_hygiene

    hygiene = load_effective_hygiene(Path(run_dir))
    block = hygiene.get("recovery") if isinstance(hygiene, dict) else None
    return block if isinstance(block, dict) else None


def cadence(run_dir: Path, every: Optional[int], keep: Optional[int]) -> tuple[int, int]:
    """(every, keep): the declared block's, or the arguments where the run declares none.

    Arguments that contradict a declared block are refused: the run's effective
    config is the one record of its cadence.
    """
    block = declared(run_dir)
    if block is not None:
        for name, value in (("every", every), ("keep", keep)):
            if value is not None and value != block[name]:
                raise RecoveryError(f"save_recovery: {name}={value} contradicts the run's hygiene.recovery.{name}: "
                                    f"{block[name]}; change traceml.yaml instead")
        return int(block["every"]), int(block["keep"])
    if every is None or keep is None:
        raise RecoveryError("save_recovery: no recovery cadence: declare hygiene.recovery {every, keep} in "
                            "traceml.yaml (docs/hygiene.md) or pass every= and keep=")
    for name, value in (("every", every), ("keep", keep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RecoveryError(f"save_recovery: {name} must be an integer >= 1, got {value!r}")
    return every, keep


def save(session: Any, *, model: Any, optimizer: Any, scheduler: Any, extras: Optional[dict],
         every: Optional[int], keep: Optional[int], force: bool) -> Optional[str]:
    """The body of :func:`traceml_tui.save_recovery` (its docstring says what it does)."""
    if session.current is not None:
        raise RecoveryError("save_recovery: called inside trace_step; call it after the update, outside the step")
    every, keep = cadence(session.run_dir, every, keep)
    extras = _extras(extras)  # checked on every call: a bad extra is said at the first update, not the first save
    step = session.last_step
    if not force and (step < 1 or step % every):
        return None
    session.flush()  # the save's step has its record before the save exists: no gap on resume
    run_dir = Path(session.run_dir)
    target = RunDir(run_dir).recovery_dir(session.rank) / save_name(step, session.attempt)
    if not target.exists():
        payload = build_payload(session, model=model, optimizer=optimizer, scheduler=scheduler,
                                extras=extras)
        target = write_save(run_dir, session.rank, step, session.attempt, payload)
    prune(run_dir, session.rank, keep)
    return target.relative_to(run_dir).as_posix()


def _load_into(obj: Any, state: Any, what: str) -> None:
    if obj is None:
        return
    if state is None:
        raise RecoveryError(f"restore_recovery: the recovery save holds no {what} state; pass {what}= to save_recovery too")
    obj.load_state_dict(state)


def restore(session: Any, *, model: Any, optimizer: Any, scheduler: Any) -> Optional[Recovered]:
    """The body of :func:`traceml_tui.restore_recovery` (its docstring says what it does)."""
    if session.prev_end is not None or session.current is not None:
        raise RecoveryError("restore_recovery: this attempt already traced a step; restore before the first trace_step")
    run_dir = Path(session.run_dir)
    found = load_newest(run_dir, session.rank, warn=lambda line: print(line, file=sys.stderr),
                        steps=common_steps(run_dir, session.rank, session.world_size))
    if found is None:
        return None
    save_, payload = found
    if save_.step >= session.next_step:
        # The save's step was drained before it was written, so its record exists; a history that ends
        # earlier was cut (files removed): continuing would leave a gap (docs/run.md, start_step).
        raise RecoveryError(f"restore_recovery: {save_.path.name} is at update {save_.step} but the history of "
                            f"rank {session.rank} ends at update {session.next_step - 1}")
    _load_into(model, payload.get("model"), "model")
    _load_into(optimizer, payload.get("optimizer"), "optimizer")
    _load_into(scheduler, payload.get("scheduler"), "scheduler")
    set_rng_state(payload["rng"])
    session.next_step = save_.step + 1  # the newer attempt's records supersede the repeated updates
    session.examples = payload.get("examples")
    log_resume(run_dir, session.rank, session.attempt, save_)
    return Recovered(step=save_.step, attempt=save_.attempt, path=save_.path.relative_to(run_dir).as_posix(),
                     extras=dict(payload.get("extras") or {}))
