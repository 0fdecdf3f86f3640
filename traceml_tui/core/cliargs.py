"""Command-line conventions every `traceml` command shares: a usage error is one stderr line and exit 2.

argparse's own ``error`` prints the whole usage block first (four to six lines for `traceml status` or
`traceml daemon`), which a CI log or a login-node terminal shows as noise around the one line that matters.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Optional

#: Exit code of a usage error (a bad flag or value), shared by every command.
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command line; the command prints :func:`usage_line` for it and exits :data:`EXIT_USAGE`.

    ``prog`` names the (sub)command whose parser refused it, when a parser did.
    """

    def __init__(self, message: str, prog: Optional[str] = None) -> None:
        super().__init__(message)
        self.prog = prog


def usage_line(prog: str, message: str) -> str:
    """The one line every usage error is: ``PROG: usage error: WHAT (see `PROG --help`)``."""
    return f"{prog}: usage error: {message} (see `{prog} --help`)"


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are :func:`usage_line` on stderr and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(usage_line(self.prog, message), file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


class RaisingParser(OneLineParser):
    """A :class:`OneLineParser` that raises :class:`UsageError` instead, for a command whose usage errors take
    its own exit path (compare reports them like its other failures; validate dispatches subcommands)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, self.prog)


def seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds, zero or more (``nan``, ``inf`` and ``-5`` refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds, zero or more")
    return value


def positive_seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds above zero."""
    value = seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value
