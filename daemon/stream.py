"""The stream: every byte rule of one JSONL file, and nothing else (docs/daemon.md rules 3–5, "Exactly once").

Given a stream's committed *cursor* — ``identity`` (hash of the header line), ``generation``, ``offset``
(always just after a ``\\n``), ``skipping`` (inside a line over the limit) and ``tail`` (length and hash of
the last committed line) — and what ``stat`` says of its path now, this room decides what to read and
returns it: blocks of complete lines with the offset each starts at, the cursor after them and the error
spans it found itself (a line over the limit). It owns

* the descriptors kept open between passes (:class:`FdCache`, checked against the path's device and inode);
* the identity of a file (its header line: :func:`read_head`, cached per path while the bytes are the same);
* the generation rules: a different header, a shorter file or a rewritten tail starts a new generation
  read from byte 0 (:meth:`Streams.advance`); a rotated file is drained first (:meth:`Streams.rotated`);
* complete lines only, at most ``MAX_LINE`` bytes each, and the NUL hold-back (:func:`cut`).

It never decodes a line and never writes SQL: the service decodes what it returns (``daemon/decode.py``)
and the store writes it, in the pass's one transaction, with the cursor (rule 2).
"""

from __future__ import annotations

import hashlib
import os
import resource
import stat
import time
from collections import OrderedDict
from typing import Iterator, NamedTuple, Optional

from traceml_tui.core import records, rundir

MAX_LINE = records.MAX_LINE_BYTES
READ_BYTES = 4 << 20  # one read takes at most this much (≈10k records)
HEAD_PROBE = 4096
SMALL_READ = 64 << 10  # new bytes up to this much are read in the same pread as the committed tail
NUL_GRACE_S = 120.0  # a line starting with NUL bytes is waited for while its file changed this recently
FD_CACHE_MAX = 8192  # open stream descriptors kept between passes (bounded by the open-file limit too)
#: The keys of a stream's cursor (the ``files`` columns a read moves; ``size``, ``mtime_ns`` and ``ino`` are
#: what the read saw of the file).
CURSOR = ("identity", "generation", "offset", "skipping", "tail")


# ----------------------------------------------------------------- the head: a file's identity
class Head(NamedTuple):
    """The first complete line of a file and the identity derived from it."""

    line: bytes  # without the trailing newline
    end: int  # offset just after the newline
    identity: str


def identity_of(line: bytes) -> str:
    """File identity: a hash of the whole header line (never the inode, never a prefix)."""
    return hashlib.sha256(line.rstrip(b"\r")).hexdigest()[:32]


def read_head(fd: int) -> Optional[Head]:
    """Read the first complete line of ``fd``; ``None`` while it has no newline yet.

    A first line longer than the line limit still gets an identity (from its
    first ``MAX_LINE + 1`` bytes) so the file can be tracked and the line
    reported once.
    """
    buf = b""
    probe = HEAD_PROBE
    while True:
        data = os.pread(fd, probe, len(buf))
        if not data:
            return None
        buf += data
        cut = buf.find(b"\n")
        if cut >= 0:
            return Head(buf[:cut], cut + 1, identity_of(buf[:cut]))
        if len(buf) > MAX_LINE:
            return Head(buf[: MAX_LINE + 1], -1, identity_of(buf[: MAX_LINE + 1]))
        probe = min(probe * 4, MAX_LINE + 2 - len(buf))


# ----------------------------------------------------------------- reads and the committed tail
def read_block(fd: int, offset: int, size: int) -> bytes:
    """Read up to ``min(size - offset, READ_BYTES)`` bytes from ``offset``."""
    want = min(size - offset, READ_BYTES)
    if want <= 0:
        return b""
    chunks = []
    while want > 0:
        data = os.pread(fd, want, offset)
        if not data:
            break
        chunks.append(data)
        offset += len(data)
        want -= len(data)
    return b"".join(chunks)


def tail_of(line: bytes) -> str:
    """The cursor's ``tail`` for the last committed ``line`` (without its newline): ``length:sha1``."""
    return f"{len(line)}:{hashlib.sha1(line).hexdigest()}"


def tail_matches(fd: int, offset: int, tail: Optional[str]) -> bool:
    """True when the last committed line still sits just before ``offset`` (no in-place rewrite)."""
    if not tail or offset <= 0:
        return True
    length_text, _, digest = tail.partition(":")
    try:
        length = int(length_text)
    except ValueError:
        return True
    start = offset - length - 1
    if start < 0:
        return False
    data = os.pread(fd, length + 1, start)
    return len(data) == length + 1 and data.endswith(b"\n") and hashlib.sha1(data[:-1]).hexdigest() == digest


def read_past_tail(fd: int, offset: int, tail: Optional[str], size: int) -> Optional[bytes]:
    """The new bytes from ``offset`` (as :func:`read_block` reads them) when the last committed line still
    sits just before ``offset``; None when it does not (an in-place rewrite).

    A live append is small: its bytes come in the same ``pread`` as the committed tail.
    """
    want = min(size - offset, READ_BYTES)
    if not tail or offset <= 0 or want > SMALL_READ:
        return read_block(fd, offset, size) if tail_matches(fd, offset, tail) else None
    length_text, _, digest = tail.partition(":")
    try:
        length = int(length_text)
    except ValueError:
        return read_block(fd, offset, size)
    start = offset - length - 1
    if start < 0:
        return None
    got = os.pread(fd, length + 1 + max(0, want), start)
    line, data = got[:length + 1], got[length + 1:]
    if not (len(line) == length + 1 and line.endswith(b"\n") and hashlib.sha1(line[:-1]).hexdigest() == digest):
        return None
    if 0 < len(data) < want:  # a short read: the rest as read_block would have read it
        data += read_block(fd, offset + len(data), offset + want)
    return data


# ----------------------------------------------------------------- complete lines
class Cut(NamedTuple):
    """What one read of a stream yields: complete lines to decode and the cursor after them."""

    block: bytes  # complete lines (ends with a newline), or b"" when there are none to decode
    at: int  # the byte offset ``block`` starts at
    offset: int  # the cursor's offset after this read
    skipping: int  # 1 while inside a line over MAX_LINE
    tail: Optional[str]  # the cursor's tail after this read
    more: bool  # bytes may remain past ``offset``: read again
    held_back: bool  # reading stopped before a line of NUL bytes (look again next poll, stat or not)
    error: Optional[tuple[int, int, str]] = None  # (offset, length, message): a line over MAX_LINE, skipped


def cut(data: bytes, offset: int, size: int, skipping: int, tail: Optional[str], nul_fresh: bool) -> Cut:
    """The complete lines of ``data`` (read at ``offset`` from a file of ``size`` bytes) and the cursor after
    them (docs/daemon.md rule 4; pure).

    ``skipping`` continues a line over the limit: its rest up to the next newline is dropped. A line that
    starts with a NUL byte is a region a writer on NFS extended before its data landed: never committed
    past while the file changed within NUL_GRACE_S (``nul_fresh``); a complete line of NULs only, or one in
    a quiet file, is a bad line like any other (a hole that never fills must not stall the stream).
    """
    read_end = offset + len(data)
    skip_ended = False  # the rest of a skipped line ended in this window: the cursor moved past it
    if skipping:
        nl = data.find(b"\n")
        if nl < 0:  # (more only when this read moved the cursor: an empty short read must not loop)
            return Cut(b"", offset, read_end, 1, None, offset < read_end < size, False)
        data = data[nl + 1:]
        offset += nl + 1
        tail = None
        skip_ended = True
    # (`b"\0" in data` is one memchr; the line-start search only runs when a NUL is there at all)
    hole = _nul_hole(data) if nul_fresh and b"\0" in data else None
    held = hole is not None
    if held:
        data = data[:hole]
        size = read_end = offset + hole
        if not data:
            return Cut(b"", offset, offset, 0, tail, False, True)
    nl = data.rfind(b"\n")
    if nl < 0:
        if len(data) > MAX_LINE:
            return Cut(b"", offset, read_end, 1, None, read_end < size, held,
                       (offset, len(data), f"line longer than {MAX_LINE} bytes (≥ {len(data)} so far); skipped"))
        # Nothing complete here. After a skip that ended in this window (the cursor moved) the rest of the file
        # is still to read, its next line crossing the window's end: stopping there lost every line after it
        # until the file changed. Without a skip the cursor did not move: reading again would read the same.
        return Cut(b"", offset, offset, 0, tail, skip_ended and read_end < size, held)
    block = data[: nl + 1]
    last_line = block[block.rfind(b"\n", 0, len(block) - 1) + 1:-1]
    end = offset + nl + 1
    more = read_end < size or (end < read_end and len(data) - nl - 1 > MAX_LINE)
    return Cut(block, offset, end, 0, tail_of(last_line), more, held)


def _nul_hole(data: bytes) -> Optional[int]:
    """The offset in ``data`` of the first line that starts with a NUL byte and is not a complete line of
    NULs only (data behind NULs, or a line not complete yet); None when there is none."""
    pos = 0 if data[:1] == b"\0" else data.find(b"\n\0") + 1 or None
    while pos is not None:
        end = data.find(b"\n", pos)
        if end < 0 or data[pos:end].strip(b"\0"):
            return pos
        pos = data.find(b"\n\0", end) + 1 or None  # a complete line of NULs is a bad line like any other: look on
    return None


def small_append(data: bytes, offset: int, size: int, skipping: int) -> bool:
    """True when ``data`` (read at ``offset``) is a small append of complete lines reaching the end of the
    file (the live case): no skip, no NUL region; its cursor is known without a :func:`cut`."""
    return (not skipping and len(data) <= SMALL_READ and data[-1:] == b"\n" and offset + len(data) == size
            and data[:1] != b"\0" and b"\n\0" not in data)


# ----------------------------------------------------------------- descriptors
class FdCache:
    """Open descriptors of active streams, least recently used first (docs/daemon.md, "Live path").

    An entry is the descriptor opened through ``rundir.open_under`` with the
    device and inode it was opened on. :meth:`get` returns it only while the
    path still names that file (the caller's ``stat`` of the path): a file
    replaced, rotated or deleted is closed here, never read again.
    """

    def __init__(self, cap: int) -> None:
        self.cap = max(16, cap)
        self._d: OrderedDict[str, tuple[int, int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, path: str) -> bool:
        return path in self._d

    def get(self, path: str, dev: int, ino: int) -> Optional[int]:
        """The cached descriptor of ``path`` when it is still (``dev``, ``ino``); a stale one is closed."""
        entry = self._d.get(path)
        if entry is None:
            return None
        if entry[1] != dev or entry[2] != ino:
            self.drop(path)
            return None
        self._d.move_to_end(path)
        return entry[0]

    def put(self, path: str, fd: int, dev: int, ino: int) -> None:
        """Keep ``fd`` for ``path`` (closing the least recently used beyond the cap)."""
        self.drop(path)
        self._d[path] = (fd, dev, ino)
        while len(self._d) > self.cap:
            _, (old, _, _) = self._d.popitem(last=False)
            os.close(old)

    def drop(self, path: str) -> None:
        """Close and forget the descriptor of ``path`` (if any)."""
        entry = self._d.pop(path, None)
        if entry is not None:
            os.close(entry[0])

    def paths(self) -> list[str]:
        """Paths with a cached descriptor."""
        return list(self._d)

    def clear(self) -> None:
        """Close every descriptor."""
        while self._d:
            _, (fd, _, _) = self._d.popitem()
            os.close(fd)


def fd_budget() -> int:
    """How many stream descriptors to keep: the open-file limit raised to its hard cap, half of it, ≤ FD_CACHE_MAX."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = FD_CACHE_MAX * 2 + 256
        if hard == resource.RLIM_INFINITY or hard > soft:
            target = want if hard == resource.RLIM_INFINITY else min(hard, want)
            if target > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
    except (ValueError, OSError):
        return 256
    return max(16, min(FD_CACHE_MAX, soft // 2 - 64))


class OpenFailed(Exception):
    """The path could not be opened (``cause``: the ``OSError``; a link on the way, no permission, gone)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Read(NamedTuple):
    """One read of a stream's current file (:meth:`Streams.advance`)."""

    cursor: dict  # the cursor after this read, with the ``size``, ``mtime_ns`` and ``ino`` it saw
    new_generation: bool  # a new generation started at byte 0 (replaced, rewritten, truncated, rotated)
    start: int  # the offset this read started at
    append: Optional[bytes]  # a small append of complete lines at ``start``, to decode with the pass's others
    cut: Optional[Cut]  # else the lines read (None: nothing new)

    @property
    def more(self) -> bool:
        """Bytes may remain past the new offset: read again."""
        return self.cut is not None and self.cut.more


class Streams:
    """The byte side of every stream: cached descriptors and header lines, and the reads themselves.

    The caller's order per stream and pass: :meth:`changed` (which targets moved), :meth:`open`,
    :meth:`identity`, then — when the path holds another inode than the one last read — :meth:`rotated`
    (the old file's rest), then :meth:`advance`. Each returns what it read; none of them decodes.
    """

    def __init__(self, cap: int = 256) -> None:
        self.fds = FdCache(cap)  # resized by the service once the open-file limit is known (fd_budget)
        self._heads: dict[str, tuple[bytes, str]] = {}  # path -> its header line as last read, and its identity
        #: path -> the cursor tail of a small append read here and that append's last line (with its newline):
        #: the next append's tail check compares these bytes instead of hashing them (:meth:`quick_append`)
        self._tails: dict[str, tuple[str, bytes]] = {}

    def reset(self) -> None:
        """Forget every descriptor, header and tail (after a rollback: memory may be ahead of the index)."""
        self.fds.clear()
        self._heads.clear()
        self._tails.clear()

    def quick_append(self, path: str, st: os.stat_result, identity: Optional[str], generation: Optional[int],
                     offset: Optional[int], skipping: Optional[int], tail: Optional[str], ino: Optional[int]
                     ) -> Optional[tuple[dict, bytes]]:
        """The live case in one step: the cursor after a small append of complete lines to a stream read here
        before, and the appended bytes; None whenever anything is not that case (the caller then reads it
        the usual way: :meth:`open`, :meth:`identity`, :meth:`advance`).

        The cursor (``identity`` … ``ino``: the stream's committed one) must be the one this object last read
        the file up to, through the descriptor still cached for the path's device and inode (``st``). Then the
        checks are :meth:`advance`'s, on bytes held from that read rather than on hashes: the header re-read
        and compared (rule 3), the committed last line read back with the new bytes in one ``pread`` and
        compared byte for byte (the tail check), and the new bytes a small append (:func:`small_append`).
        ``tests/fuzz/test_fuzz_stream.py`` holds it equal to the usual way."""
        if skipping or tail is None or ino != st.st_ino or identity is None:
            return None
        known = self._tails.get(path)
        head = self._heads.get(path)
        if known is None or head is None or known[0] != tail or head[1] != identity:
            return None
        size = st.st_size
        want = size - offset
        last = known[1]
        back = len(last)
        if want <= 0 or want > SMALL_READ or offset < back:
            return None
        fd = self.fds.get(path, st.st_dev, st.st_ino)
        if fd is None or os.pread(fd, len(head[0]), 0) != head[0]:
            return None
        got = os.pread(fd, back + want, offset - back)
        if len(got) != back + want or not got.startswith(last):
            return None
        data = got[back:]
        if data[-1:] != b"\n" or data[:1] == b"\0" or b"\n\0" in data:
            return None
        line = data[data.rfind(b"\n", 0, want - 1) + 1:]
        new_tail = tail_of(line[:-1])
        self._tails[path] = (new_tail, line)
        return {"identity": identity, "generation": generation, "offset": size, "skipping": 0, "tail": new_tail,
                "size": size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}, data

    def changed(self, targets, updates: dict, skip) -> list:
        """``(run, file, stat)`` of the ``targets`` whose (size, mtime, inode) moved since the cursor in
        ``updates`` (this transaction's) or the file's committed one; a path gone or no longer a regular file
        lets its descriptor go now (so a deleted file's space is never held past the pass that noticed)."""
        fds = self.fds
        due = []
        for run, f in targets:
            if f.path in skip or (run.missing and not os.path.isdir(run.dir)):
                continue
            try:
                st = os.stat(f.path, follow_symlinks=False)
            except OSError:
                fds.drop(f.path)
                continue  # vanished: the rescan marks the run missing when the whole folder went
            if not stat.S_ISREG(st.st_mode):
                fds.drop(f.path)
                continue
            pending = updates.get(f)
            if pending is None:
                seen = (f.size, f.mtime_ns, f.ino)
            else:
                seen = (pending.get("size", f.size), pending.get("mtime_ns", f.mtime_ns), pending.get("ino", f.ino))
            if (st.st_size, st.st_mtime_ns, st.st_ino) != seen:
                due.append((run, f, st))
        return due

    def open(self, root: str, path: str, st: os.stat_result) -> Optional[tuple[int, os.stat_result]]:
        """The descriptor of ``path`` and its ``stat``: the cached one while the path still names that file
        (``st``), else opened now with no link followed below ``root`` (rule 5); None when what is there is
        not a regular file (a FIFO or device swapped in is never read). :class:`OpenFailed` when it cannot
        be opened."""
        fd = self.fds.get(path, st.st_dev, st.st_ino)
        if fd is not None:
            return fd, st
        try:
            fd = rundir.open_under(root, path)  # a folder swapped for a link is never followed
        except OSError as exc:
            raise OpenFailed(exc) from None
        try:
            fst = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        if not stat.S_ISREG(fst.st_mode):
            os.close(fd)
            return None
        self.fds.put(path, fd, fst.st_dev, fst.st_ino)
        return fd, fst

    def preopen(self, root: str, path: str, st: os.stat_result) -> None:
        """Open ``path`` ahead of its turn (the cold path reads it ahead); it is checked as usual then."""
        if self.fds.get(path, st.st_dev, st.st_ino) is not None:
            return
        try:
            fd = rundir.open_under(root, path)
        except OSError:
            return
        try:
            fst = os.fstat(fd)
        except OSError:
            fst = None
        if fst is not None and stat.S_ISREG(fst.st_mode):
            self.fds.put(path, fd, fst.st_dev, fst.st_ino)
        else:
            os.close(fd)

    def peek(self, path: str, offset: int) -> bytes:
        """The bytes of ``path`` from ``offset`` (one :func:`read_block`) through a descriptor already opened
        by a checked read; b"" when there is none. Speculative: the cold path's read ahead."""
        try:
            st = os.stat(path, follow_symlinks=False)
            fd = self.fds.get(path, st.st_dev, st.st_ino)
            return b"" if fd is None else read_block(fd, offset, st.st_size)
        except OSError:
            return b""

    def identity(self, path: str, fd: int) -> Optional[str]:
        """The identity of the file open at ``fd`` (rule 3); None while it has no complete header line.

        The first line is re-read on every read: a file truncated and rewritten in place with a new header
        of the same length can look like an append to stat and to the tail check. While it holds the very
        bytes of the header last read here, its identity (their hash) is the one computed then.
        """
        known = self._heads.get(path)
        if known is not None and os.pread(fd, len(known[0]), 0) == known[0]:
            return known[1]
        head = read_head(fd)
        if head is None:
            return None
        if 0 < head.end <= HEAD_PROBE:  # the usual short header: kept (a long one is re-hashed)
            self._heads[path] = (head.line + b"\n", head.identity)
        return head.identity

    def rotated(self, root: str, path: str, cur: dict, ino: int, dev: int) -> Optional[Iterator[Cut]]:
        """The rest of the file last read at ``path`` (inode ``ino``), now renamed in the same folder
        (``steps-1.jsonl`` → ``steps-1.jsonl.1``): an iterator of its cuts under the cursor ``cur``, to be
        consumed before the new file starts a new generation; None when it is not there (or is not the
        generation ``cur`` was reading: nothing of it is ours to drain)."""
        folder = os.path.dirname(path)
        try:
            with os.scandir(folder) as it:
                names = [e.name for e in it if e.inode() == ino and e.name != os.path.basename(path)]
        except OSError:
            return None
        for name in names:
            try:
                fd = rundir.open_under(root, os.path.join(folder, name))
            except OSError:
                continue
            try:
                fst = os.fstat(fd)
                head = (read_head(fd) if fst.st_ino == ino and fst.st_dev == dev and stat.S_ISREG(fst.st_mode)
                        else None)
                if (head is not None and head.identity == cur["identity"] and fst.st_size >= cur["offset"]
                        and tail_matches(fd, cur["offset"], cur["tail"])):
                    owned, fd = fd, -1
                    return _drain(owned, fst, cur["offset"], cur["skipping"], cur["tail"])
            finally:
                if fd >= 0:
                    os.close(fd)
        return None

    def advance(self, fd: int, fst: os.stat_result, cur: dict, identity: str, rotated: bool,
                deferrable: bool, path: Optional[str] = None) -> Read:
        """Read the current file from the cursor ``cur`` (updated in place and returned in :class:`Read`).

        A new generation from byte 0 when the file was rotated (its predecessor drained), has another
        header, is shorter than the offset or no longer holds the committed tail (rule 3). A small append
        of complete lines reaching the end (``deferrable``: the live case) comes back whole, to be decoded
        with the pass's other appends; anything else as one :func:`cut`.
        """
        new_gen = rotated
        data = None  # the new bytes, when the tail check read them with the committed tail
        if not new_gen:
            if cur["identity"] is None:
                cur.update(identity=identity, offset=0, skipping=0, tail=None)
            elif (identity != cur["identity"] or fst.st_size < cur["offset"]
                  or (data := read_past_tail(fd, cur["offset"], cur["tail"], fst.st_size)) is None):
                new_gen = True  # replaced, rewritten or truncated: the head was re-read just now
        if new_gen:
            cur.update(identity=identity, generation=(cur["generation"] or 0) + 1, offset=0, skipping=0, tail=None)
        start = cur["offset"]
        if data is None:
            data = read_block(fd, start, fst.st_size)
        append = piece = None
        wait = False
        if data and deferrable and small_append(data, start, fst.st_size, cur["skipping"]):
            line = data[data.rfind(b"\n", 0, len(data) - 1) + 1:]
            cur.update(offset=start + len(data), skipping=0, tail=tail_of(line[:-1]))
            if path is not None:  # the next append's tail check, by bytes (quick_append)
                self._tails[path] = (cur["tail"], line)
            append = data
        elif data:
            piece = cut(data, start, fst.st_size, cur["skipping"], cur["tail"],
                        time.time() - fst.st_mtime < NUL_GRACE_S)
            cur.update(offset=piece.offset, skipping=piece.skipping, tail=piece.tail)
            wait = piece.more or piece.held_back
        # Held back at a NUL line: stat may not change when the data lands (NFS), so look again next poll.
        cur.update(size=None if wait else fst.st_size, mtime_ns=fst.st_mtime_ns, ino=fst.st_ino)
        return Read(cur, new_gen, start, append, piece)


def _drain(fd: int, fst: os.stat_result, offset: int, skipping: int, tail: Optional[str]) -> Iterator[Cut]:
    """The cuts of a rotated file from the cursor to its last complete line (closes ``fd`` when done)."""
    try:
        fresh = time.time() - fst.st_mtime < NUL_GRACE_S
        while True:
            data = read_block(fd, offset, fst.st_size)
            if not data:
                return
            piece = cut(data, offset, fst.st_size, skipping, tail, fresh)
            yield piece
            if not piece.more or piece.offset <= offset:
                return
            offset, skipping, tail = piece.offset, piece.skipping, piece.tail
    finally:
        os.close(fd)


def read_side(root: str, path: str, max_bytes: int) -> Optional[tuple[os.stat_result, Optional[bytes]]]:
    """A side file's ``stat`` and bytes, opened with no link followed below ``root`` (rule 5); the bytes are
    None when it is larger than ``max_bytes``; None when it is not a regular file. :class:`OpenFailed`
    when it cannot be opened."""
    try:
        fd = rundir.open_under(root, path)  # no link anywhere below the root (docs/security.md)
    except OSError as exc:
        raise OpenFailed(exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > max_bytes:
            return st, None
        data = b""
        while len(data) < st.st_size:
            chunk = os.pread(fd, st.st_size - len(data), len(data))
            if not chunk:
                break
            data += chunk
        return st, data
    finally:
        os.close(fd)
