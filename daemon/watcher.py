"""Inotify events as hints (docs/daemon.md rule 1).

Polling stays the primary mechanism: it is the only one that sees writes from
other nodes over a shared filesystem. The :class:`Watcher` only calls back
with paths that changed, so the ingester looks sooner; it never decides what
is read. Which folders are runs and which files they hold is
:mod:`traceml_tui.core.rundir`'s (``discover_runs``, ``RunDir.scan``,
``run_dir_of``), which never follows a symbolic link (rule 5).

One thread reads the inotify descriptor (``inotify_simple`` sets it up, a thin
ctypes wrapper, reads and parses it) in batches: a burst of appends is one
read, its events are deduplicated by (watch, name), and ``on_change`` is
called once per read with the set of paths that changed, so a live daemon's
hints cost a few reads a second and a dictionary lookup per event however
many lines are appended (docs/daemon.md, "Live path"). Where
inotify is not available (macOS, or ``inotify_simple`` missing) watchdog's
observer gives the same hints, at a higher cost per event.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from typing import Callable

from traceml_tui.core.signals import shielded

log = logging.getLogger("traceml.daemon")

READ_DELAY_MS = 20  # after the first event of a burst, wait this long so that the rest comes in the same read
STOP_POLL_MS = 250  # how often the reading thread checks that it was asked to stop

# inotify(7) bits. Opens and no-write closes are left out at the mask: a rescan opens every folder, and
# receiving those events would cost more than the rescan itself (and our own reads would wake us forever).
IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x8, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_DONT_FOLLOW, IN_ISDIR = 0x4000, 0x8000, 0x1000000, 0x2000000, 0x40000000
WATCH_MASK = (IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
              | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW)


class Watcher:
    """Inotify watches on every folder under the roots; reports changed paths through ``on_change``.

    ``on_change`` gets a set of paths: with inotify, every path named by the
    events of one read, once each; with watchdog, one path (or a move's two).
    Events are hints: they make the ingester look sooner, never decide what
    is read. :meth:`start` returns False when no watch could be set up (no
    inotify on this platform, ``inotify_simple`` missing, the watch limit),
    in which case polling alone carries on. Folders are never followed
    through a symbolic link.
    """

    def __init__(self, roots: list[str], on_change: Callable[[set[str]], None], backend: str = "auto") -> None:
        """``backend``: "auto" (inotify, else watchdog), "inotify" or "watchdog"."""
        self.roots = roots
        self.backend = backend
        self._observer = None  # watchdog's, when it is the backend
        self.on_change = on_change
        self._ino = None
        self._dirs: dict[int, str] = {}  # watch descriptor -> folder
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._full = False  # the watch limit was reached: folders beyond it are polled only
        #: Times the kernel reported lost events (a queue overflow); only our inotify reader can count them.
        self.losses = 0

    def start(self) -> bool:
        """Watch every folder under the roots and start the reading thread; False when no backend works."""
        if self.backend in ("auto", "inotify") and self._start_inotify():
            return True
        return self.backend in ("auto", "watchdog") and self._start_watchdog()

    @property
    def reports_losses(self) -> bool:
        """True when lost events are reported (our inotify reader counts them in :attr:`losses`); watchdog's
        observers drop an overflow silently, so their silence proves nothing."""
        thread = self._thread
        return self._ino is not None and thread is not None and thread.is_alive()

    def _start_watchdog(self) -> bool:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            return False
        on_change = self.on_change

        class _Hints(FileSystemEventHandler):
            def on_any_event(self, event) -> None:  # every kind is a hint; the ingester decides
                if event.event_type in ("opened", "closed_no_write"):
                    return
                paths = {os.fsdecode(event.src_path)}
                dest = getattr(event, "dest_path", "")
                if dest:
                    paths.add(os.fsdecode(dest))
                on_change(paths)

        observer = Observer()
        try:
            for root in self.roots:
                observer.schedule(_Hints(), root, recursive=True)
            observer.start()
        except (OSError, RuntimeError):
            return False
        self._observer = observer
        return True

    def _start_inotify(self) -> bool:
        try:
            from inotify_simple import INotify
        except ImportError:
            return False
        try:
            ino = INotify()
        except OSError:  # not Linux, or the per-user instance limit
            return False
        self._ino = ino
        try:
            for root in self.roots:
                self._add_tree(root, report=False)
        except OSError:
            self._close()
            return False
        if not self._dirs:
            self._close()
            return False
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="traceml-inotify", daemon=True)
        with shielded():  # (core/signals.py: a SIGTERM sent to the daemon goes to the main thread, which serves)
            self._thread.start()
        return True

    def stop(self) -> None:
        """Stop the reading thread and close the descriptor (idempotent)."""
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            observer.join(timeout=2)
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=2)
        self._close()

    # ----------------------------------------------------------------- internals
    def _close(self) -> None:
        ino, self._ino = self._ino, None
        self._dirs.clear()
        if ino is not None:
            try:
                ino.close()
            except OSError:
                pass

    def _add_tree(self, top: str, report: bool) -> None:
        """Watch ``top`` and every folder below it (links not followed); ``report``: hint what is already there."""
        if self._full:
            return
        for folder, _subdirs, files in os.walk(top, followlinks=False):
            try:
                wd = self._ino.add_watch(folder, WATCH_MASK)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:  # the watch limit: what is watched keeps its hints, polling the rest
                    self._full = True
                    log.warning("traceml daemon: inotify watch limit reached; folders beyond it are polled only")
                    return
                if folder == top and not report:
                    raise
                continue  # vanished or unreadable meanwhile: polling covers it
            self._dirs[wd] = folder
            if report:  # made before its watch existed: its files would never send an event of their own
                self.on_change({folder, *(os.path.join(folder, name) for name in files)})

    def _loop(self) -> None:
        ino = self._ino
        stop = self._stop
        while not stop.is_set():
            try:
                events = ino.read(timeout=STOP_POLL_MS, read_delay=READ_DELAY_MS)
            except (OSError, ValueError) as exc:  # closed under us (stop() is on its way), or broken
                if not stop.is_set():
                    log.warning("traceml daemon: inotify stopped (%s); polling only", exc)
                return
            if events:
                self._dispatch(events)

    def _dispatch(self, events) -> None:
        """Report the paths named by one read's ``events`` (``inotify_simple.Event``), once each.

        Events are merged on (watch, name) first: a thousand appends to one file cost a thousand dictionary
        updates and one path.
        """
        masks: dict[tuple[int, str], int] = {}
        for wd, mask, _cookie, name in events:
            key = (wd, name)
            masks[key] = masks.get(key, 0) | mask
        changed: set[str] = set()
        new_dirs, gone = [], []
        for (wd, name), mask in masks.items():
            if mask & IN_Q_OVERFLOW:  # events were lost: counted, and every root is worth a look
                self.losses += 1
                changed.update(self.roots)
                continue
            folder = self._dirs.get(wd)
            if folder is None:
                continue
            if mask & IN_IGNORED:  # the folder went (or was unmounted): its watch is gone with it
                gone.append(wd)
                if mask == IN_IGNORED:
                    continue
            path = os.path.join(folder, name) if name else folder
            changed.add(path)
            if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                new_dirs.append(path)
        for wd in gone:
            del self._dirs[wd]
        if changed:
            self.on_change(changed)
        for path in new_dirs:
            if not os.path.islink(path):
                self._add_tree(path, report=True)
