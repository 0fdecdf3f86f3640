"""Finding run directories and their files, and watchdog events as hints.

Discovery never follows a symbolic link and only reports regular files
(DESIGN.md daemon rule 5): a link to a folder outside the root is not
entered, a FIFO named ``steps-0.jsonl`` is not reported. The
:class:`Watcher` is UI-free: it only calls back with paths that changed;
polling stays the primary mechanism (rule 1).
"""

from __future__ import annotations

import os
import re
import stat
import threading
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Optional

MAX_DEPTH = 4  # run directories are looked for at most this many levels below a root

STEPS_RE = re.compile(r"^steps-(\d+)\.jsonl$")
RANK_RE = re.compile(r"^rank_(\d+)$")
NODE_RE = re.compile(r"^node_(\d+)$")
BACKLOG_KINDS = {"requests": "request", "claims": "claim", "receipts": "receipt", "failures": "failure"}
_RUN_MARKERS = ("manifest.json", "ranks", "nodes")
_IGNORED_EVENTS = frozenset({"opened", "closed_no_write"})
_SKIP_DIRS = {"ranks", "nodes", "validation", "checkpoints", "__pycache__"}


class StreamFile(NamedTuple):
    rel: str  # path relative to the run directory
    stream: str  # "steps" or "system"
    rank: Optional[int]
    attempt: Optional[int]
    node: Optional[int]


class SideFile(NamedTuple):
    rel: str
    kind: str  # manifest | summary | outcome | request | claim | receipt | failure
    key: Optional[str]  # checkpoint id (backlog) or node rank (outcome)
    size: int
    mtime_ns: int


def _scandir(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _regular_stat(entry: os.DirEntry) -> Optional[os.stat_result]:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def is_run_dir(path: str) -> bool:
    """A run directory holds a manifest or a ``ranks``/``nodes`` folder (not through links)."""
    for name in _RUN_MARKERS:
        try:
            st = os.lstat(os.path.join(path, name))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            return True
    return False


def discover_runs(root: str, max_depth: int = MAX_DEPTH) -> Iterator[str]:
    """Yield run directories at most ``max_depth`` levels below ``root`` (the root itself included)."""
    stack = [(root, 0)]
    while stack:
        path, depth = stack.pop()
        if is_run_dir(path):
            yield path
            continue  # runs do not nest
        if depth >= max_depth:
            continue
        for entry in _scandir(path):
            if entry.name.startswith(".") or entry.name in _SKIP_DIRS:
                continue
            if _is_dir(entry):
                stack.append((entry.path, depth + 1))


def scan_run(run_dir: str) -> tuple[list[StreamFile], list[SideFile]]:
    """List a run directory's JSONL streams and JSON side files (regular files only)."""
    streams: list[StreamFile] = []
    sides: list[SideFile] = []

    def side(entry: os.DirEntry, rel: str, kind: str, key: Optional[str]) -> None:
        st = _regular_stat(entry)
        if st is not None:
            sides.append(SideFile(rel, kind, key, st.st_size, st.st_mtime_ns))

    for entry in _scandir(run_dir):
        name = entry.name
        if name == "manifest.json":
            side(entry, name, "manifest", None)
        elif name == "final_summary.json":
            side(entry, name, "summary", None)
        elif name == "ranks" and _is_dir(entry):
            for rank_entry in _scandir(entry.path):
                m = RANK_RE.match(rank_entry.name)
                if not m or not _is_dir(rank_entry):
                    continue
                for f in _scandir(rank_entry.path):
                    fm = STEPS_RE.match(f.name)
                    if fm and _regular_stat(f) is not None:
                        rel = f"ranks/{rank_entry.name}/{f.name}"
                        streams.append(StreamFile(rel, "steps", int(m.group(1)), int(fm.group(1)), None))
        elif name == "nodes" and _is_dir(entry):
            for node_entry in _scandir(entry.path):
                m = NODE_RE.match(node_entry.name)
                if not m or not _is_dir(node_entry):
                    continue
                node = int(m.group(1))
                for f in _scandir(node_entry.path):
                    rel = f"nodes/{node_entry.name}/{f.name}"
                    if f.name == "system.jsonl" and _regular_stat(f) is not None:
                        streams.append(StreamFile(rel, "system", None, None, node))
                    elif f.name == "guard_outcome.json":
                        side(f, rel, "outcome", str(node))
        elif name == "validation" and _is_dir(entry):
            for sub in _scandir(entry.path):
                kind = BACKLOG_KINDS.get(sub.name)
                if kind is None or not _is_dir(sub):
                    continue
                for f in _scandir(sub.path):
                    if f.name.endswith(".json") and not f.name.startswith("."):
                        side(f, f"validation/{sub.name}/{f.name}", kind, f.name[:-5])
    return streams, sides


class Watcher:
    """Watchdog (inotify) observer that only reports changed paths through ``on_change``.

    Events are hints: they make the ingester look sooner, never decide what
    is read. :meth:`start` returns False when no observer could be started
    (e.g. the inotify watch limit), in which case polling alone carries on.
    """

    def __init__(self, roots: list[str], on_change: Callable[[str], None]) -> None:
        self.roots = roots
        self.on_change = on_change
        self._observer = None
        self._lock = threading.Lock()

    def start(self) -> bool:
        """Start watching the roots recursively; False when watchdog is unavailable."""
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            return False
        callback = self.on_change

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:  # noqa: D401 - watchdog hook
                if event.event_type in _IGNORED_EVENTS:
                    return  # our own reads would wake us forever
                callback(os.fsdecode(event.src_path))
                dest = getattr(event, "dest_path", None)
                if dest:
                    callback(os.fsdecode(dest))

        from watchdog import events as ev

        # Opens and no-write closes are left out at the inotify mask: a rescan opens every folder,
        # and receiving those events would cost more than the rescan itself.
        wanted = [ev.FileCreatedEvent, ev.FileModifiedEvent, ev.FileMovedEvent, ev.FileDeletedEvent,
                  ev.FileClosedEvent, ev.DirCreatedEvent, ev.DirMovedEvent, ev.DirDeletedEvent]
        observer = Observer()
        try:
            for root in self.roots:
                try:
                    observer.schedule(_Handler(), root, recursive=True, event_filter=wanted)
                except TypeError:  # watchdog < 4 has no event_filter
                    observer.schedule(_Handler(), root, recursive=True)
            observer.daemon = True
            observer.start()
        except Exception:  # inotify limits, vanished roots: polling covers everything anyway
            try:
                observer.stop()
            except Exception:
                pass
            return False
        self._observer = observer
        return True

    def stop(self) -> None:
        """Stop the observer (idempotent)."""
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            observer.join(timeout=2)


def run_dir_of(path: str, run_dirs: dict[str, object]) -> Optional[str]:
    """The known run directory that contains ``path`` (walks up at most 4 levels)."""
    p = Path(path)
    for candidate in [p, *list(p.parents)[:4]]:
        key = str(candidate)
        if key in run_dirs:
            return key
    return None
