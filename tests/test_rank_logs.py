"""The launcher's copier of the ranks' output (traceml_tui/run/rank_logs.py): bytes the ranks write are untrusted.

Whatever bytes a rank writes, in whatever pieces they arrive, the node log gets
them back whole and in order, as lines that each end in a newline and carry the
rank's prefix once; the terminal gets exactly the bytes written.
"""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceml_tui.core.forensics import rank_of_line
from traceml_tui.run.rank_logs import MAX_PENDING, LineBuffer, NodeLog, PipeTee, RankLogs, prefixed, prefixed_lines

from support.lanes import examples

_bytes = st.binary(max_size=600) | st.lists(st.sampled_from([b"a", b"\n", b"\r", b"[rank1]: ", b"\xff", b"x" * 50]),
                                            max_size=40).map(b"".join)


def _lines(block: bytes) -> list[bytes]:
    return [line + b"\n" for line in block.split(b"\n")[:-1]]


@settings(max_examples=examples(300), deadline=None)
@given(data=_bytes, cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=8))
def test_line_buffer_returns_every_byte_as_whole_lines_in_order(data, cuts):
    buf = LineBuffer()
    pieces, start = [], 0
    for cut in sorted(c for c in cuts if c <= len(data)) + [len(data)]:
        pieces.append(data[start:cut])
        start = cut
    blocks = [buf.feed(piece) for piece in pieces] + [buf.rest()]
    assert all(block == b"" or block.endswith(b"\n") for block in blocks)  # whole lines only
    joined = b"".join(blocks)
    assert joined == (data if data.endswith(b"\n") or not data else data + b"\n")
    assert buf.pending == b"" and buf.rest() == b""


@settings(max_examples=examples(300), deadline=None)
@given(rank=st.integers(min_value=0, max_value=12), data=_bytes | st.lists(
    st.sampled_from([b"[rank1]:", b"[rank1]: ", b"[rank11]:", b"\n", b"x", b"[rank", b" "]), max_size=30).map(b"".join))
def test_prefixed_lines_is_prefixed_on_each_line(rank, data):
    """The fast path (a few passes over a block) equals the rule applied line by line."""
    block = data if data.endswith(b"\n") or not data else data + b"\n"
    assert prefixed_lines(rank, block) == b"".join(prefixed(rank, line) for line in _lines(block))


def test_a_line_without_end_comes_out_in_parts():
    """A progress bar redrawn with carriage returns never ends its line: the log gets it in bounded parts."""
    buf = LineBuffer()
    lines = _lines(buf.feed(b"\r50%" * (MAX_PENDING // 2)))
    assert lines and all(len(line) == MAX_PENDING + 1 for line in lines)
    assert 0 < len(buf.pending) <= MAX_PENDING


@given(rank=st.integers(min_value=0, max_value=4096), text=st.text(max_size=80).filter(lambda t: "\n" not in t))
def test_prefixed_lines_read_back_as_the_ranks_own(rank, text):
    line = prefixed(rank, text.encode() + b"\n")
    back = rank_of_line(line.decode()[:-1])
    assert back[0] == rank
    if not text.startswith(f"[rank{rank}]:"):
        assert back[1] == text
    # torch's excepthook already tagged it: never twice
    assert prefixed(rank, b"[rank%d]: boom\n" % rank) == b"[rank%d]: boom\n" % rank


def test_pipe_tee_copies_the_terminal_as_written_and_the_log_in_whole_lines(tmp_path):
    read, write = os.pipe()
    log = NodeLog(tmp_path / "training.stderr.log")
    terminal = io.BytesIO()
    terminal.flush = lambda: None
    tee = PipeTee(os.fdopen(read, "rb"), terminal, log)
    tee.start()
    for chunk in (b"W1201 torchrun sa", b"ys\nsecond", b" line, never ended"):
        os.write(write, chunk)
    os.close(write)
    tee.join(10)
    log.close()
    assert terminal.getvalue() == b"W1201 torchrun says\nsecond line, never ended"
    assert (tmp_path / "training.stderr.log").read_bytes() == b"W1201 torchrun says\nsecond line, never ended\n"


def test_rank_logs_copy_torchruns_files_with_global_ranks_and_leave_nothing(tmp_path):
    """The files as torchrun lays them out (``<dir>/<id>_<rand>/attempt_0/<local>/std*.log``), on node 1 of 2×2."""
    logs = {s: NodeLog(tmp_path / f"training.{s}.log") for s in ("stdout", "stderr")}
    terminals = {s: io.BytesIO() for s in ("stdout", "stderr")}
    for t in terminals.values():
        t.flush = lambda: None
    ranks = RankLogs(tmp_path, node_rank=1, nproc_per_node=2, logs=logs, terminals=terminals, poll_s=0.01)
    assert ranks.torchrun_args()[-1] == f"--log-dir={ranks.work_dir}" and ranks.work_dir.parent == tmp_path
    attempt = ranks.work_dir / "none_abc" / "attempt_0"
    files = {}
    for local in (0, 1):
        (attempt / str(local)).mkdir(parents=True)
        for stream in ("stdout", "stderr"):
            files[local, stream] = open(attempt / str(local) / f"{stream}.log", "wb", buffering=0)
    ranks.start()
    files[0, "stdout"].write(b"hello from local 0\nhalf")
    files[1, "stderr"].write(b"[rank3]: Traceback (most recent call last):\n")
    seen = threading.Event()

    def wait_for(path, text) -> None:
        for _ in range(1000):
            if text in path.read_bytes():
                seen.set()
                return
            seen.wait(0.01)
        raise AssertionError(f"{text!r} never reached {path}")

    wait_for(tmp_path / "training.stdout.log", b"[rank2]: hello from local 0\n")
    files[0, "stdout"].write(b" a line\nno end")
    for f in files.values():
        f.close()
    ranks.finish()
    for log in logs.values():
        log.close()
    assert (tmp_path / "training.stdout.log").read_bytes() == \
        b"[rank2]: hello from local 0\n[rank2]: half a line\n[rank2]: no end\n"
    assert (tmp_path / "training.stderr.log").read_bytes() == b"[rank3]: Traceback (most recent call last):\n"
    assert terminals["stdout"].getvalue() == b"hello from local 0\nhalf a line\nno end"
    assert terminals["stderr"].getvalue() == b"[rank3]: Traceback (most recent call last):\n"
    assert not ranks.work_dir.exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_log_that_cannot_be_written_is_said_once_and_never_stops_the_copy(capfd):
    """Disk full: one warning line, no exception, so the copier goes on feeding the terminal."""
    log = NodeLog(Path("/dev/full"))
    for _ in range(3):
        log.write(b"[rank0]: a line\n" * 1000)
    err = capfd.readouterr().err
    assert log.failed and err.count("cannot write full") == 1, err
