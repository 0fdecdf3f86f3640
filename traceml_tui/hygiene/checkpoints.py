"""Publishing immutable checkpoints and their validation requests (seed 004).

Training publishes a checkpoint and a durable request, then continues; it never
runs validation inline. A checkpoint file is never replaced or deleted here: a
step published again (a resume re-reaching the same update) gets a new id.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from traceml_tui.core.atomic import atomic_write_json, fsync_dir
from traceml_tui.core.rundir import CHECKPOINTS, RunDir
from traceml_tui.hygiene import backlog

CHECKPOINT_DIR = CHECKPOINTS  # relative to the run directory


def checkpoint_id(step: int, serial: int = 1) -> str:
    """Id of the ``serial``-th checkpoint published at ``step`` (``step-00000120``, then ``step-00000120-2``)."""
    base = f"step-{int(step):08d}"
    return base if serial <= 1 else f"{base}-{serial}"


def _free_id(run_dir: Path, step: int) -> str:
    serial = 1
    while True:
        ckpt = checkpoint_id(step, serial)
        layout = RunDir(run_dir)
        taken = layout.request(ckpt).exists() or layout.checkpoint_file(ckpt).exists()
        if not taken:
            return ckpt
        serial += 1


def _save_state(state: Any, target: Path) -> None:
    import torch  # lazily: only a training process that publishes a state pays for torch

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, target)  # fails if the id exists: a published checkpoint is immutable
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    try:
        os.chmod(target, 0o444)
    except OSError:
        pass
    fsync_dir(target.parent)


def _relative(run_dir: Path, path: Path) -> str:
    resolved = path.resolve()
    try:
        return resolved.relative_to(run_dir.resolve()).as_posix()
    except ValueError:
        return str(path)  # outside the run dir: recorded as given


def publish_checkpoint(run_dir: Path, path_or_state: Any, *, step: int, config_digest: str) -> str:
    """Publish one checkpoint and its validation request; returns the checkpoint id (see :func:`publish_request`)."""
    return publish_request(run_dir, path_or_state, step=step, config_digest=config_digest)["checkpoint"]


def publish_request(run_dir: Path, path_or_state: Any, *, step: int, config_digest: str) -> dict:
    """Publish one checkpoint and its validation request; returns the request as written.

    ``path_or_state`` is either an existing file (recorded as is, relative to
    ``run_dir`` when inside it) or a state object saved with ``torch.save``
    atomically and read-only under ``<run_dir>/checkpoints/<id>.pt``. The
    request ``validation/requests/<id>.json`` is written once, atomically.
    """
    run_dir = Path(run_dir)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    backlog.ensure_dirs(run_dir)
    while True:
        ckpt = _free_id(run_dir, step)
        if isinstance(path_or_state, (str, os.PathLike)):
            source = Path(path_or_state)
            if not source.is_file():
                raise FileNotFoundError(f"checkpoint file not found: {source}")
            rel = _relative(run_dir, source)
        else:
            target = RunDir(run_dir).checkpoint_file(ckpt)
            try:
                _save_state(path_or_state, target)
            except FileExistsError:
                continue  # a concurrent publisher took this id; pick the next one
            rel = target.relative_to(run_dir).as_posix()
        request = {
            "checkpoint": ckpt,
            "step": step,
            "path": rel,
            "config_digest": config_digest,
            "created": time.time(),
        }
        try:
            atomic_write_json(RunDir(run_dir).request(ckpt), request, exclusive=True)
        except FileExistsError:
            continue
        return request


def resolve_checkpoint_path(run_dir: Path, request: dict) -> Path:
    """Absolute path of a request's checkpoint file."""
    path = Path(str(request.get("path", "")))
    return path if path.is_absolute() else (Path(run_dir) / path).resolve()
