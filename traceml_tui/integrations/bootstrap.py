"""What `traceml run` starts each rank through: ``python -m traceml_tui.integrations.bootstrap SCRIPT ARGS…``.

It installs the trainer import hooks (:mod:`traceml_tui.integrations.hooks`)
unless ``TRACEML_AUTO_ATTACH=0``, then runs ``SCRIPT`` exactly as
``python SCRIPT ARGS…`` would: as ``__main__``, with ``sys.argv`` =
``[SCRIPT, ARGS…]``, ``sys.path[0]`` = the script's folder and ``__file__``
set; its exit status and uncaught exceptions are the process's own. Nothing
here imports a framework or torch (docs/trainers.md).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    """Run ``argv[0]`` as the main script with ``argv[1:]`` as its arguments."""
    if not argv:
        print("usage: python -m traceml_tui.integrations.bootstrap SCRIPT [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    from traceml_tui.integrations.support import auto_attach_enabled

    if auto_attach_enabled():
        from traceml_tui.integrations import hooks

        hooks.install()
    sys.argv = list(argv)
    # What `python SCRIPT` sets (Python 3.9+): __file__ is the path joined to the working folder (not
    # normalized), sys.path[0] the script's real folder (links resolved) instead of `-m`'s working folder.
    script = argv[0] if os.path.isabs(argv[0]) else os.path.join(os.getcwd(), argv[0])
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    run_as_main(script)


def run_as_main(path: str) -> None:
    """Execute the file at ``path`` as a fresh ``__main__`` module, as the interpreter runs a script.

    Not ``runpy.run_path``: that rewrites ``sys.argv[0]`` and swaps ``__main__``
    back afterwards, which a script (or pickling its classes at exit) can see.
    """
    import builtins
    import importlib.machinery
    import types

    with open(path, "rb") as handle:
        source = handle.read()
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    exec(code, main.__dict__)

if __name__ == "__main__":
    main(sys.argv[1:])
