"""Publishing immutable checkpoints and their validation requests (seed 004).

Training publishes a checkpoint and a durable request, then continues; it never
runs validation inline. A checkpoint file is never replaced or deleted here: a
step published again (a resume re-reaching the same update) gets a new id.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Callable

from traceml_tui.core.atomic import atomic_write_json, fsync_dir
from traceml_tui.core.rundir import CHECKPOINTS, RunDir
from traceml_tui.hygiene import backlog, folders, qc_backlog

CHECKPOINT_DIR = CHECKPOINTS  # relative to the run directory


def checkpoint_id(step: int, serial: int = 1) -> str:
    """Id of the ``serial``-th checkpoint published at ``step`` (``step-00000120``, then ``step-00000120-2``)."""
    base = f"step-{int(step):08d}"
    return base if serial <= 1 else f"{base}-{serial}"


def _free_id(run_dir: Path, step: int, suffix: str) -> str:
    serial = 1
    while True:
        ckpt = checkpoint_id(step, serial)
        layout = RunDir(run_dir)
        taken = layout.request(ckpt).exists() or layout.checkpoint_file(ckpt, suffix).exists()
        if not taken:
            return ckpt
        serial += 1


def _write_once(target: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``target`` once, read-only: the one way a published checkpoint comes to be (docs/hygiene.md).

    Written to a temp file in the same folder, fsynced, made read-only, then
    hard-linked into place, which fails with ``FileExistsError`` when the id is
    taken: a published checkpoint is never replaced.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o444)
        os.link(tmp, target)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    fsync_dir(target.parent)


def _torch_save(state: Any) -> Callable[[IO[bytes]], None]:
    def write(handle: IO[bytes]) -> None:
        import torch  # lazily: only a training process that publishes a state pays for torch

        torch.save(state, handle)

    return write


def _copy_of(source: Path) -> Callable[[IO[bytes]], None]:
    def write(handle: IO[bytes]) -> None:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, handle, 1 << 20)

    return write


def _source(path: "str | os.PathLike[str]") -> Path:
    """The checkpoint file or folder a script named: a relative path is the script's own (its current folder)."""
    source = Path(os.path.abspath(path))
    if not source.exists():
        raise FileNotFoundError(
            f"publish_checkpoint: checkpoint file or folder not found: {os.fspath(path)} "
            "(a relative path is read from the folder the script runs in)"
        )
    if not source.is_file() and not source.is_dir():
        raise ValueError(f"publish_checkpoint: not a file or a folder: {os.fspath(path)} "
                         "(publish one checkpoint file, a checkpoint folder or a state object)")
    return source


def publish_checkpoint(run_dir: Path, path_or_state: Any, *, step: int, config_digest: str) -> str:
    """Publish one checkpoint and its validation request; returns the checkpoint id (see :func:`publish_request`)."""
    return publish_request(run_dir, path_or_state, step=step, config_digest=config_digest)["checkpoint"]


def publish_request(run_dir: Path, path_or_state: Any, *, step: int, config_digest: str) -> dict:
    """Publish one checkpoint and its validation request; returns the request as written.

    ``path_or_state`` is a checkpoint file or folder the script wrote (a
    relative path is read from the script's current folder), which is copied,
    or a state object saved with ``torch.save``. Either way the checkpoint
    becomes ``<run_dir>/checkpoints/<id><suffix>`` (a file keeps its suffix, a
    state gets ``.pt``, a folder — Hugging Face's ``checkpoint-N/`` — becomes
    the folder ``checkpoints/<id>/``, :mod:`traceml_tui.hygiene.folders`),
    written once with read-only files, so the script may overwrite or delete
    its own copy afterwards without changing what is validated. The
    request ``validation/requests/<id>.json`` is written once, atomically, with
    the checkpoint's path relative to ``run_dir``. At a QC point of a run whose ``hygiene.qc`` requires worker
    QC, its QC request ``qc/requests/<id>.json`` is written too (:mod:`traceml_tui.hygiene.qc_backlog`).
    """
    run_dir = Path(run_dir)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    tree = None
    if isinstance(path_or_state, (str, os.PathLike)):
        source = _source(path_or_state)  # before anything is written
        if source.is_dir():
            tree = folders.scan(source, os.fspath(path_or_state))  # refuses links and empty folders up front
            suffix, write = "", None
        else:
            suffix, write = source.suffix or ".pt", _copy_of(source)
    else:
        suffix, write = ".pt", _torch_save(path_or_state)
    backlog.ensure_dirs(run_dir)
    while True:
        ckpt = _free_id(run_dir, step, suffix)
        target = RunDir(run_dir).checkpoint_file(ckpt, suffix)
        try:
            if tree is not None:
                folders.copy_once(tree, target)
            else:
                _write_once(target, write)
        except FileExistsError:
            continue  # a concurrent publisher took this id; pick the next one
        request = {
            "checkpoint": ckpt,
            "step": step,
            "path": target.relative_to(run_dir).as_posix(),
            "config_digest": config_digest,
            "created": time.time(),
        }
        try:
            atomic_write_json(RunDir(run_dir).request(ckpt), request, exclusive=True)
        except FileExistsError:
            continue
        # At a QC point of a run that requires worker QC, the same checkpoint is also requested for heavy QC
        # (qc/requests/<id>.json, docs/qc.md): one checkpoint, two kinds of request.
        qc_backlog.publish_qc_request(run_dir, request)
        return request


def last_published_step(run_dir: Path) -> "int | None":
    """The highest step among the run's published checkpoints (its validation requests), None before the first."""
    steps = [request["step"] for request in backlog.list_requests(Path(run_dir))
             if isinstance(request.get("step"), int) and not isinstance(request.get("step"), bool)]
    return max(steps) if steps else None


def resolve_checkpoint_path(run_dir: Path, request: dict) -> Path:
    """Absolute path of a request's checkpoint (a file, or the folder of a published folder checkpoint)."""
    path = Path(str(request.get("path", "")))
    return path if path.is_absolute() else (Path(run_dir) / path).resolve()
