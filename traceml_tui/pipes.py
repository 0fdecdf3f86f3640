"""Standard output whose reader went away (`traceml status | head`, a CI step that closed its pipe)."""

from __future__ import annotations

import os
import sys


def detach_stdout() -> None:
    """Point stdout at /dev/null after a ``BrokenPipeError``.

    Python flushes stdout again at exit; without this it would print an
    "Exception ignored … BrokenPipeError" and turn the command's exit code into 120.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def write_stdout(text: str) -> bool:
    """Write and flush ``text``; False (stdout detached) when the reader has gone. The caller's exit code stands."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        detach_stdout()
        return False
    return True
