"""``traceml view SUMMARY``: print the text card stored in a final summary.

Reads with the same bounded, strict loader as ``traceml compare`` and prints
the ``text`` field exactly as the run stored it (older artifacts may keep it
in ``card``). Exit 1 with one line on stderr for a bad file, 2 for usage.
"""

from __future__ import annotations

import sys

from traceml_tui.compare.load import SummaryError, read_summary
from traceml_tui.core.cliargs import RaisingParser, UsageError, usage_line
from traceml_tui.pipes import write_stdout

PROG = "traceml view"


def stored_text(summary: dict) -> str | None:
    """The stored text card of a summary (``text``, else legacy ``card``), or None."""
    for key in ("text", "card"):
        value = summary.get(key)
        if isinstance(value, str) and value.strip():
            return value.rstrip("\r\n")
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``traceml view``; returns the process exit code."""
    parser = RaisingParser(prog=PROG, description="Print the text card stored in a final_summary.json.")
    parser.add_argument("summary", metavar="SUMMARY", help="path to final_summary.json")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except UsageError as exc:
        print(usage_line(PROG, str(exc)), file=sys.stderr)
        return 2
    try:
        summary = read_summary(args.summary, require_shape=False)
    except SummaryError as exc:
        print(f"{PROG}: error: summary {args.summary!r} {exc}", file=sys.stderr)
        return 1
    text = stored_text(summary)
    if text is None:
        print(f"{PROG}: error: summary {args.summary!r} has no stored text card ('text' field)", file=sys.stderr)
        return 1
    write_stdout(text + "\n")  # `traceml view S | head`: the reader leaving early is not an error
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
