"""Real runs built once per test session and shared by every process of it (the pytest-xdist workers).

Under ``pytest -n 2`` each worker is a process of its own and sets a session-scoped fixture up for itself.
A case of :mod:`support.realruns` costs tens of seconds of two CPU-bound ranks, so building it in every
worker would cost more than running in parallel saves. :class:`SharedRealRuns` builds each case once, under
a lock file in a folder every worker of the session shares, and writes what it built (or the build error)
to ``<case>.json`` beside it; the other workers read that file. A case that failed to build fails the same
way everywhere without being built again.

The run folders are shared and read-only by agreement: a test that changes a run copies it first
(``shutil.copytree``). :meth:`SharedRealRuns.changed` lists what changed in the runs this process used
since they were built; the ``real_runs`` fixture (tests/conftest.py) fails the session's last test of
them when the list is not empty.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

from filelock import FileLock, Timeout

from support.parallel import fingerprint_changes
from support.realruns import BUILDERS, CaseBuildError, RealRun, RealRuns, build_case


def fingerprint(run: RealRun) -> dict[str, list[int]]:
    """Every file of a built case (its scratch folder and, where it lies elsewhere, its live copy), by path:
    ``[size, mtime_ns]``."""
    roots = [run.work_dir]
    if run.live_copy is not None and run.work_dir not in run.live_copy.parents:
        roots.append(run.live_copy)
    files: dict[str, list[int]] = {}
    for root in roots:
        for folder, _dirs, names in os.walk(root):
            for name in names:
                path = Path(folder, name)
                try:
                    st = path.lstat()
                except FileNotFoundError:
                    continue
                files[str(path)] = [st.st_size, st.st_mtime_ns]
    return files


class SharedRealRuns(RealRuns):
    """:class:`~support.realruns.RealRuns` whose cases are built once for every process using ``root``.

    ``builders`` is how many cases this process builds at a time in the background (:meth:`prefetch`);
    a case another process is building is skipped there and waited for on first access.
    """

    def __init__(self, root: Path, *, builders: int = 2) -> None:
        super().__init__(root, workers=builders)
        self.root.mkdir(parents=True, exist_ok=True)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._queue: list[str] = []
        self._queue_lock = threading.Lock()

    # ------------------------------------------------------------------ one case, across processes

    def _record(self, case: str) -> Path:
        return self.root / f"{case}.json"

    def _file_lock(self, case: str) -> FileLock:
        return FileLock(self.root / f"{case}.lock")

    def _read(self, case: str) -> Optional[dict]:
        path = self._record(case)
        return json.loads(path.read_text()) if path.exists() else None

    def _load(self, data: dict) -> RealRun:
        if "error" in data:
            raise CaseBuildError(data["error"])
        return RealRun.from_json(data["run"])

    def _build_held(self, case: str) -> RealRun:
        """Build ``case`` (its lock held, no record yet) and record the run or the error."""
        work = self.root / case
        if work.exists():  # a process that died while building left it half made
            shutil.rmtree(work)
        try:
            run = build_case(case, work)
        except Exception as exc:
            text = str(exc) if isinstance(exc, CaseBuildError) else f"{case}: {type(exc).__name__}: {exc}"
            self._write(case, {"error": text})
            raise
        self._write(case, {"run": run.to_json(), "files": fingerprint(run)})
        return run

    def _write(self, case: str, data: dict) -> None:
        tmp = self._record(case).with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._record(case))  # readers see the whole record or none

    def _build(self, case: str) -> RealRun:
        """The case, built here or by another process (waited for); :class:`RealRuns` calls it once a case."""
        with self._file_lock(case):
            data = self._read(case)
            if data is None:
                return self._build_held(case)
        return self._load(data)

    def finished(self) -> list[Path]:
        """The scratch folders of the cases whose build has returned (built or failed), in any process."""
        return sorted(self.root / case for case in BUILDERS if self._record(case).exists())

    # ------------------------------------------------------------------ background builds

    def prefetch(self, cases: Iterable[str]) -> None:
        """Start building these cases in the background (in this order; unknown names are ignored), skipping
        any another process is already building."""
        with self._queue_lock:
            known = set(self._queue)
            self._queue += [c for c in dict.fromkeys(cases) if c in BUILDERS and c not in known]
        while len(self._threads) < self._workers:
            thread = threading.Thread(target=self._prefetch_loop, name="realruns", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _prefetch_loop(self) -> None:
        while not self._stop.is_set():
            with self._queue_lock:
                if not self._queue:
                    return
                case = self._queue.pop(0)
            lock = self._file_lock(case)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue  # another process (or thread) builds it; its first access here waits for it
            try:
                if not self._record(case).exists():
                    self._build_held(case)
            except Exception:  # noqa: BLE001 - recorded; raised to the tests that use the case
                pass
            finally:
                lock.release()

    def close(self) -> None:
        """Start no further background build; wait for the running ones (they clean up after themselves)."""
        self._stop.set()
        for thread in self._threads:
            thread.join()

    # ------------------------------------------------------------------ the read-only agreement

    def changed(self) -> list[str]:
        """``"<path>: changed|added|removed"`` for each file of the cases this process used that differs from
        what their build left (a test changed a shared run instead of a copy of it)."""
        out = []
        for case, run in sorted(self.built().items()):
            data = self._read(case) or {}
            out.extend(fingerprint_changes(data.get("files", {}), fingerprint(run)))
        return out
