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
    try:
        exec(code, main.__dict__)
    except SystemExit as exc:
        script_ended(exc.code)
        raise
    script_ended(None)


def script_ended(code: object) -> None:
    """The script's body ended (returned, or raised ``SystemExit(code)``): its rank's ``rank_end`` now, before the
    interpreter shuts down (:func:`traceml_tui.sdk.session.close_at_script_end`). Nothing when the script never
    used traceml; never raises (fail-open: the script's own exit status stands)."""
    sdk = sys.modules.get("traceml_tui.sdk")  # never imported here: a script that did not use it has no session
    session = getattr(sdk, "_session", None)
    if session is None:
        return
    try:
        from traceml_tui.sdk.session import close_at_script_end

        close_at_script_end(session, code)
    except Exception:  # noqa: BLE001 - the exit handler writes the end record instead
        pass

if __name__ == "__main__":
    main(sys.argv[1:])
