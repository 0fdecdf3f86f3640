"""Training output of one node: every line a rank writes gets its rank, the terminal sees it as written.

torchrun lets the ranks inherit its own stdout and stderr, so a node's output
is one stream in which only an uncaught exception names its rank (torch's
excepthook prefixes it with ``[rank<N>]:``); a plain ``print`` cannot be told
apart. The launcher therefore asks torchrun to redirect each local rank's
stdout and stderr to its own file (``--redirects 3``, into a hidden working
folder ``nodes/node_<k>/.rank-logs-*``) and copies those files, as they grow:

* to the terminal exactly as the rank wrote them (stdout to stdout, stderr to
  stderr, no prefix), chunk by chunk, so progress bars still move;
* to the node's ``training.stdout.log`` / ``training.stderr.log`` as whole
  lines, each prefixed ``[rank<N>]: `` with the rank's global number (a line
  that already starts with its own ``[rank<N>]:`` is kept as it is).

torchrun's own output (its warnings and its ``ChildFailedError`` report) still
comes through its pipes and goes to the same logs without a prefix. Several
writers share one log, so every write is a whole line under the log's lock.
The working folder is removed once its files are copied (docs/run.md
"Training logs"). A one-process run keeps its single pipe: all of its lines are
its one rank's.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Optional

#: Name prefix of the hidden folder torchrun writes the ranks' files into, inside ``nodes/node_<k>/``.
WORK_PREFIX = ".rank-logs-"
#: Seconds between two looks at the ranks' files (an append reaches the terminal and the log within this).
POLL_S = 0.1
#: The longest unfinished line held back for the log; beyond it the part is written as a line of its own
#: (a progress bar redrawn with carriage returns never ends its line).
MAX_PENDING = 64 * 1024
#: Seconds between two listings of the working folder once every expected file was found (a restart of
#: the workers makes a new ``attempt_<n>`` folder).
RESCAN_S = 1.0

_RANK_FILE = re.compile(r"^(\d+)$")


class NodeLog:
    """One of a node's training logs, written by several copiers: whole lines, one at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "ab")
        self._lock = threading.Lock()
        self.failed = False  # a write failed (disk full): said once; the terminal copy goes on

    def write(self, data: bytes) -> None:
        """Append ``data`` (whole lines) and flush, so the Log screen sees it at once."""
        if not data:
            return
        with self._lock:
            if self._file.closed:
                return
            try:
                self._file.write(data)
                self._file.flush()
            except OSError as exc:
                if not self.failed:
                    self.failed = True
                    print(f"traceml run: warning: cannot write {self.path.name}: {exc.strerror}; "
                          "the training output still reaches this terminal", file=sys.stderr, flush=True)

    def close(self) -> None:
        with self._lock:
            self._file.close()


class LineBuffer:
    """Bytes in, whole lines out; a line longer than :data:`MAX_PENDING` comes out in parts."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """The complete lines (each ending in ``\\n``) that ``chunk`` finishes, as one block."""
        data = self.pending + chunk if self.pending else chunk
        cut = data.rfind(b"\n") + 1
        block, self.pending = data[:cut], data[cut:]
        if len(self.pending) > MAX_PENDING:  # written in parts of MAX_PENDING; the last part waits for more
            keep = len(self.pending) % MAX_PENDING or MAX_PENDING
            head, self.pending = self.pending[:-keep], self.pending[-keep:]
            block += b"".join(head[i:i + MAX_PENDING] + b"\n" for i in range(0, len(head), MAX_PENDING))
        return block

    def rest(self) -> bytes:
        """The unfinished last line, ended (at the end of the output)."""
        rest, self.pending = self.pending, b""
        return rest + b"\n" if rest else b""


def _write_terminal(terminal: IO[bytes], chunk: bytes) -> None:
    try:
        terminal.write(chunk)
        terminal.flush()
    except (OSError, ValueError):  # our terminal went away; the log stays complete
        pass


def prefixed(rank: int, line: bytes) -> bytes:
    """``line`` as the node log holds it: ``[rank<N>]: `` first, unless torch's excepthook already put it."""
    tag = b"[rank%d]:" % rank
    return line if line.startswith(tag) else tag + b" " + line


def prefixed_lines(rank: int, block: bytes) -> bytes:
    """:func:`prefixed` on every line of ``block`` (whole lines), in a few passes over the bytes, not per line.

    Each line start gets the tag, then a tag followed by the same tag at a line
    start (the line was already tagged) loses the added one: only at line starts,
    so a tag inside a line is never touched (tests/test_rank_logs.py proves it equal to :func:`prefixed`).
    """
    if not block:
        return b""
    tag = b"[rank%d]:" % rank
    added = b"\n" + tag + b" "
    body = (b"\n" + block[:-1]).replace(b"\n", added).replace(added + tag, b"\n" + tag)
    return body[1:] + b"\n"


class PipeTee(threading.Thread):
    """Copy a child's pipe to our own stream (as it comes) and to a node log (whole lines, unprefixed)."""

    def __init__(self, pipe: IO[bytes], terminal: IO[bytes], log: NodeLog) -> None:
        super().__init__(name=f"traceml-tee-{log.path.name}", daemon=True)
        self.pipe = pipe
        self.terminal = terminal
        self.log = log

    def run(self) -> None:
        fd = self.pipe.fileno()
        lines = LineBuffer()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.log.write(lines.feed(chunk))
            _write_terminal(self.terminal, chunk)
        self.log.write(lines.rest())


class _RankFile:
    """One rank's stdout or stderr file written by torchrun: how far it was copied."""

    def __init__(self, path: Path, rank: int, stream: str) -> None:
        self.path = path
        self.rank = rank
        self.stream = stream
        self.fd: Optional[int] = None
        self.lines = LineBuffer()


class RankLogs(threading.Thread):
    """Copy the files torchrun writes for each local rank (``--redirects 3``) to the terminal and the node logs.

    ``start()`` after the training command started; ``finish()`` once it
    exited: the last bytes are copied, unfinished lines ended, the working
    folder removed.
    """

    def __init__(self, node_dir: Path, node_rank: int, nproc_per_node: int, logs: dict[str, NodeLog],
                 terminals: Optional[dict[str, IO[bytes]]] = None, poll_s: float = POLL_S) -> None:
        super().__init__(name="traceml-rank-logs", daemon=True)
        self.work_dir = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=node_dir))
        self.first_rank = node_rank * nproc_per_node  # torchrun's static rendezvous: node k holds k*n … k*n+n-1
        self.nproc = nproc_per_node
        self.logs = logs
        self.terminals = terminals if terminals is not None else {"stdout": sys.stdout.buffer,
                                                                  "stderr": sys.stderr.buffer}
        self.poll_s = poll_s
        self.files: dict[Path, _RankFile] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # one copier at a time: the thread, then finish()

    def torchrun_args(self) -> list[str]:
        """The options that make torchrun write each local rank's stdout and stderr to files of its own."""
        return ["--redirects=3", "--tee=0", f"--log-dir={self.work_dir}"]

    # -- copying
    def _scan(self) -> None:
        """Find new rank files: ``<work>/<run id>_<random>/attempt_<n>/<local rank>/std{out,err}.log``."""
        for run in _subdirs(self.work_dir):
            for attempt in sorted(_subdirs(run), key=lambda p: _attempt_number(p.name)):
                for local in _subdirs(attempt):
                    match = _RANK_FILE.match(local.name)
                    if not match:
                        continue
                    for stream in ("stdout", "stderr"):
                        path = local / f"{stream}.log"
                        if path not in self.files and os.path.isfile(path):
                            self.files[path] = _RankFile(path, self.first_rank + int(match.group(1)), stream)

    def _copy(self, f: _RankFile, final: bool) -> None:
        if f.fd is None:
            try:
                f.fd = os.open(f.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError:
                return
        while True:
            try:
                chunk = os.read(f.fd, 1 << 20)
            except OSError:
                break
            if not chunk:
                break
            _write_terminal(self.terminals[f.stream], chunk)
            self.logs[f.stream].write(prefixed_lines(f.rank, f.lines.feed(chunk)))
        if final:
            self.logs[f.stream].write(prefixed_lines(f.rank, f.lines.rest()))
            os.close(f.fd)
            f.fd = None

    def _pass(self, final: bool = False) -> None:
        with self._lock:
            for f in list(self.files.values()):
                self._copy(f, final)

    def run(self) -> None:
        next_scan = 0.0
        while not self._stopping.is_set():
            now = time.monotonic()
            if len(self.files) < 2 * self.nproc or now >= next_scan:  # new files come only at (re)starts
                with self._lock:
                    self._scan()
                next_scan = now + RESCAN_S
            self._pass()
            self._stopping.wait(self.poll_s)

    def finish(self) -> None:
        """Copy what is left (the training command has exited), end unfinished lines, remove the working folder."""
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=10)
        with self._lock:
            self._scan()
        self._pass(final=True)
        shutil.rmtree(self.work_dir, ignore_errors=True)


def _subdirs(path: Path) -> list[Path]:
    try:
        with os.scandir(path) as entries:
            return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _attempt_number(name: str) -> int:
    _, _, number = name.partition("attempt_")
    return int(number) if number.isdigit() else -1
