"""The `traceml` command: a thin dispatcher.

Each subcommand lives in its own module exposing ``main(argv) -> int``; the
module is imported only when its command runs, so `traceml compare` never pays
for (or depends on) what `traceml watch` or the SDK import.
"""

from __future__ import annotations

import importlib
import sys

# command -> (module, one-line help). Order is the order shown by `traceml --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("traceml_tui.run.cli", "launch a training script under the guard contract"),
    "compare": ("traceml_tui.compare.cli", "compare two final summaries (CI verdict)"),
    "view": ("traceml_tui.compare.view", "print the text card stored in a final summary"),
    "daemon": ("daemon.cli", "ingest run directories into the local SQLite index"),
    "status": ("daemon.status_cli", "print what the index holds"),
    "watch": ("traceml_tui.tui.cli", "open the terminal UI over the index"),
    "validate": ("traceml_tui.validate_cli", "validation backlog: drain, status"),
    "curve": ("traceml_tui.hygiene.curve_cli", "render the canonical learning_curve.png"),
    "export": ("traceml_tui.export.cli", "publish a run to Trackio (derived index)"),
}

USAGE = "usage: traceml COMMAND [ARGS...]"


def _help() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [USAGE, "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run `traceml COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand and return its exit code."""
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        # `traceml status | head`: the reader went away; that is not an error of ours. (A command whose exit
        # code matters with a closed pipe, `traceml compare`, keeps its own: see traceml_tui/pipes.py.)
        from traceml_tui.pipes import detach_stdout

        detach_stdout()
        return 0


def _dispatch(args: list[str]) -> int:
    if not args:  # a usage error: the command list on stderr, so `traceml > file` does not hide it
        print(_help(), file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help"):
        print(_help())
        return 0
    if args[0] == "--version":
        from traceml_tui import __version__

        print(f"traceml {__version__}")
        return 0
    name, rest = args[0], args[1:]
    entry = COMMANDS.get(name)
    if entry is None:
        from traceml_tui.core.cliargs import EXIT_USAGE, usage_line

        print(usage_line("traceml", f"unknown command {name!r}"), file=sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module(entry[0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
