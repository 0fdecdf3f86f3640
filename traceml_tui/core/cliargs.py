"""Command-line conventions every `traceml` command shares: a usage error is one stderr line and exit 2.

argparse's own ``error`` prints the whole usage block first (four to six lines for `traceml status` or
`traceml daemon`), which a CI log or a login-node terminal shows as noise around the one line that matters.
"""

from __future__ import annotations

import argparse
import math
import sys

#: Exit code of a usage error (a bad flag or value), shared by every command.
EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are ``PROG: usage error: WHAT (see `PROG --help`)`` and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: usage error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


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
