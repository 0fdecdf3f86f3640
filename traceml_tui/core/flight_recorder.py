"""torch's flight recorder dumps, read into hang facts (pure; docs/run.md "Hang forensics").

When the user enables torch's flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE``
or ``TORCH_FR_BUFFER_SIZE`` > 0), each rank keeps a ring of its recent
collectives, and torch writes it to ``<prefix><rank>`` on a collective timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT``; the prefix is ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
or ``TORCH_FR_DUMP_TEMP_FILE``, default ``/tmp/nccl_trace_rank_``). A dump is
a pickled dict (torch's ``distributed/flight_recorder/components/loader.py``
reads ``version``, ``pg_config`` and ``entries``); each entry holds
``record_id``, ``process_group`` (name, description), ``collective_seq_id``,
``profiling_name`` (``nccl:all_reduce``), ``state`` (``scheduled``,
``started``, ``completed``), ``retired`` and ``frames`` (``name``,
``filename``, ``line``).

The newest entry of the default process group says the same as a ``hang``
record: the collective count the rank reached and whether it is still inside
that collective. :func:`hang_from_dump` turns it into a
:class:`traceml_tui.core.records.Hang` so the one rule
(``core/state.py`` ``hang_roles``) decides.

A dump is untrusted bytes (a file in a shared temp folder): it is unpickled
with an unpickler that refuses every class and global, so only plain
containers, strings and numbers load, and anything else is no dump at all.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any, Optional

from traceml_tui.core import records

#: The largest dump read (bytes); a bigger file is not a dump of a ring buffer.
MAX_DUMP_BYTES = 64 << 20
#: Environment variables that enable the recorder (a size > 0) and name the dump files' prefix.
BUFFER_ENVS = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
PREFIX_ENVS = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")
DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
#: The default process group's name in a dump.
DEFAULT_GROUP = "0"


class _PlainUnpickler(pickle.Unpickler):
    """Loads dicts, lists, tuples, strings, numbers, booleans and None; any class or global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight-recorder dump holds no {module}.{name}")


def load_dump(data: bytes) -> Optional[dict]:
    """A dump's dict, or None when the bytes are not a plain pickled dict with an ``entries`` list."""
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_DUMP_BYTES:
        return None
    try:
        dump = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - truncated, foreign or hostile bytes: no dump
        return None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        return None
    return dump


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _frames(raw: Any) -> list[records.Frame]:
    out = []
    for frame in raw if isinstance(raw, list) else []:
        if not isinstance(frame, dict):
            continue
        filename, line, name = frame.get("filename"), _int(frame.get("line")), frame.get("name")
        if isinstance(filename, str) and isinstance(name, str) and line is not None:
            parts = filename.replace("\\", "/").split("/")
            at = max((i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")), default=-1)
            rel = "/".join(parts[at + 1:]) if at >= 0 else parts[-1]  # never an absolute path
            out.append(records.Frame(file=rel[-200:], line=line, func=name[:200]))
    return out


def hang_from_dump(dump: dict, *, run: str, rank: int, attempt: int, step: int, ts: float) -> Optional[records.Hang]:
    """The dump's newest collective of the default group as a ``hang`` record, or None when it has none.

    ``collective`` is the collective's name when the rank is still inside it
    (not completed, not retired), else null: it had left its newest collective
    and never issued the next one (then the stack is empty: the entry's frames
    say where it was, not where it is). ``seq`` is that entry's collective count.
    """
    newest = None
    for entry in dump.get("entries", []):
        if not isinstance(entry, dict) or entry.get("is_p2p") is True:
            continue
        group = entry.get("process_group")
        if isinstance(group, (list, tuple)) and group and str(group[0]) != DEFAULT_GROUP:
            continue
        record_id, seq = _int(entry.get("record_id")), _int(entry.get("collective_seq_id"))
        if record_id is None or seq is None:
            continue
        if newest is None or record_id > newest[0]:
            newest = (record_id, seq, entry)
    if newest is None:
        return None
    _, seq, entry = newest
    name = entry.get("profiling_name")
    name = name.split(":", 1)[-1].split(" ", 1)[0][:80] if isinstance(name, str) else None
    inside = entry.get("state") != "completed" and entry.get("retired") is not True
    # The entry's frames are where the rank issued that collective: where it is now only while inside it.
    return records.Hang(v=records.RECORD_VERSION, run=run, rank=rank, attempt=attempt, step=step, ts=ts,
                        collective=name if inside else None, seq=seq,
                        stack=_frames(entry.get("frames")) if inside else [])


def dump_path(environ: dict, rank: int) -> Optional[str]:
    """Where torch writes rank ``rank``'s dump under this environment, or None when the recorder is off."""
    def size(name: str) -> int:
        try:
            return int(environ.get(name, "0"))
        except ValueError:
            return 0

    if not any(size(name) > 0 for name in BUFFER_ENVS):
        return None
    prefix = next((environ[name] for name in PREFIX_ENVS if environ.get(name)), DEFAULT_PREFIX)
    return f"{prefix}{rank}"


def read_dump_file(path: str) -> Optional[dict]:
    """A dump file's dict (None: missing, too big, unreadable, not a dump). Only a regular file is opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        import stat

        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_DUMP_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return load_dump(handle.read(MAX_DUMP_BYTES + 1))
    except OSError:
        return None
    finally:
        os.close(fd)
