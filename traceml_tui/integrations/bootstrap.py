"""What `traceml run` starts each rank through: ``python -m traceml_tui.integrations.bootstrap SCRIPT ARGS…``.

It installs the trainer import hooks (:mod:`traceml_tui.integrations.hooks`)
unless ``TRACEML_AUTO_ATTACH=0``, then runs ``SCRIPT`` exactly as
``python SCRIPT ARGS…`` would: as ``__main__``, with ``sys.argv`` =
``[SCRIPT, ARGS…]``, ``sys.path[0]`` = the script's folder and ``__file__``
set; its exit status and uncaught exceptions are the process's own. Nothing
here imports a framework or the SDK (docs/trainers.md).
"""

from __future__ import annotations

import os
import runpy
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
    script = os.path.abspath(argv[0])  # a script's __file__ is absolute (Python 3.9+); argv[0] stays as given
    sys.argv = list(argv)
    # `python -m` put the working folder first on the path; a script run directly has its own folder there.
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
