"""Watchdog (inotify) events as hints (docs/daemon.md rule 1).

Polling stays the primary mechanism: it is the only one that sees writes from
other nodes over a shared filesystem. The :class:`Watcher` only calls back
with paths that changed, so the ingester looks sooner; it never decides what
is read. Which folders are runs and which files they hold is
:mod:`traceml_tui.core.rundir`'s (``discover_runs``, ``RunDir.scan``,
``run_dir_of``), which never follows a symbolic link (rule 5).
"""

from __future__ import annotations

import os
import threading
from typing import Callable

_IGNORED_EVENTS = frozenset({"opened", "closed_no_write"})


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
