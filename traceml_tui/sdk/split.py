"""A run's data split in its provenance, written once and checked on every resume (seed 004).

``traceml.record_split(name, members, policy=...)`` writes
``provenance/splits/<name>.json`` the first time: the split's name, its policy
text, its member count, a digest of its membership and the member ids. Every
later call with that name (a resumed attempt, another rank) recomputes the
membership from the script's current split code and compares digests: a
different membership is refused with one line and nothing written, so training
does not start on another split. The record is never rewritten (docs/hygiene.md,
"Split policy").
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterable

from traceml_tui.core.atomic import atomic_write_json
from traceml_tui.core.rundir import RunDir
from traceml_tui.sdk.errors import Refused

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class SplitChanged(Refused):
    """The split code now yields another membership than the run recorded; ``str()`` is one line."""


def member_ids(members: Iterable[Any]) -> list[str]:
    """The membership as sorted, distinct strings: order in which the code lists members does not matter."""
    ids = set()
    for member in members:
        item = getattr(member, "item", None)
        ids.add(str(item() if callable(item) and not isinstance(member, (str, bytes)) else member))
    return sorted(ids)


def digest(ids: list[str]) -> str:
    """SHA-256 over the sorted ids, one per line."""
    hasher = hashlib.sha256()
    for member in ids:
        hasher.update(member.encode("utf-8"))
        hasher.update(b"\n")
    return "sha256:" + hasher.hexdigest()


def split_path(run_dir: Path, name: str) -> Path:
    """Where split ``name`` is recorded."""
    return RunDir(run_dir).splits / f"{name}.json"


def record(run_dir: Path, name: str, members: Iterable[Any], *, policy: str, write: bool) -> dict:
    """Record split ``name`` once (when ``write``) or check the current membership against the record.

    Returns the record (as written, or as found). Raises :class:`SplitChanged`
    when a recorded split now has another membership, ``ValueError`` for a bad
    name or policy.
    """
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
        raise ValueError(f"record_split: name must be a plain name (letters, digits, '.', '_', '-'), got {name!r:.40}")
    if not isinstance(policy, str) or not policy.strip():
        raise ValueError("record_split: policy must be a nonempty text saying how the split is made")
    ids = member_ids(members)
    current = {"name": name, "policy": policy.strip(), "count": len(ids), "digest": digest(ids), "members": ids}
    path = split_path(Path(run_dir), name)
    recorded = _read(path)
    if recorded is None and write:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            atomic_write_json(path, current, exclusive=True)  # write-once: never replaced in place
            return current
        except FileExistsError:
            recorded = _read(path)  # another writer was first: check against theirs
    if recorded is None:
        return current
    if recorded.get("digest") != current["digest"]:
        raise SplitChanged(
            f"record_split: split {name!r} differs from the run's record provenance/splits/{name}.json "
            f"({recorded.get('count')} members, {str(recorded.get('digest'))[:19]}… recorded; "
            f"{current['count']}, {current['digest'][:19]}… now); restore the split code or start a fresh --run-name"
        )
    return recorded


def _read(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is one
        raise SplitChanged(f"record_split: provenance/splits/{path.name} is not readable JSON; the recorded split "
                           "cannot be checked") from None
    if not isinstance(value, dict):
        raise SplitChanged(f"record_split: provenance/splits/{path.name} is not a split record; the recorded split "
                           "cannot be checked")
    return value
