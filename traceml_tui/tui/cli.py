"""`traceml watch [ROOT…]`: open the terminal UI over the index.

Uses the index of a daemon already running for those roots; otherwise starts
the same ingester in a background thread (the embedded default). Textual is
imported only here, after the arguments are checked, so the rest of the
`traceml` CLI stays free of it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Optional

from traceml_tui.core.cliargs import OneLineParser, positive_seconds, seconds

#: The writer re-stats known files this often (the daemon's default --poll-interval): the header's commit-age
#: warning counts in it, or in --poll when that is longer.
WRITER_POLL_S = 1.0


def _parser() -> OneLineParser:
    p = OneLineParser(prog="traceml watch", description="Terminal UI over the traceml index.")
    p.add_argument("roots", nargs="*", metavar="ROOT", help="folders holding run directories (default ./logs)")
    p.add_argument("--index", metavar="PATH", help="the SQLite index (default $XDG_STATE_HOME/traceml/index.sqlite)")
    p.add_argument("--compare", nargs=2, metavar=("REF", "CAND"),
                   help="open the Compare screen on two runs (summary file, run directory or run name)")
    p.add_argument("--max-step-time-regression-pct", dest="threshold", default="5", metavar="PCT",
                   help="Compare screen threshold in percent (default 5; 'none' = exploratory)")
    p.add_argument("--poll", type=positive_seconds, default=0.25, metavar="S", help="seconds between index checks (default 0.25)")
    p.add_argument("--stall-after", type=seconds, default=None, metavar="S",
                   help="a silent rank is stalled after max(S, 10 typical step intervals) without records"
                        " (default 30, as `traceml status`)")
    p.add_argument("--no-alerts", action="store_true", help="start with the bell/notifications off (toggle: a)")
    web = p.add_argument_group("browser", "serve the same app to a web browser (textual-serve) instead of this terminal")
    web.add_argument("--web", action="store_true", help="serve the app over HTTP; each browser tab runs its own view")
    web.add_argument("--host", help="address to bind with --web (default 127.0.0.1)")
    web.add_argument("--port", type=int, help="port to bind with --web (default 8000)")
    web.add_argument("--public", action="store_true",
                     help="allow a --host other than loopback (prefer an SSH tunnel to 127.0.0.1)")
    web.add_argument("--no-token", action="store_true",
                     help="serve without the access token printed at start (anyone who reaches the port sees the runs)")
    return p


def _fail(message: str, code: int = 1) -> int:
    print(f"traceml watch: {message}", file=sys.stderr)
    return code


def _run_name_known(name: str, roots: list[str], index: Path) -> bool:
    """Whether ``name`` names a run the Compare screen can find: one in the index, or a run folder of that
    name under the roots (the embedded ingester will index it)."""
    from daemon.reader import Reader
    from traceml_tui.core import rundir

    try:
        with Reader(index) as reader:
            if reader.find_run(name) is not None:
                return True
    except Exception:  # noqa: BLE001 - no index yet, or one this watch will upgrade: look on disk
        pass
    return any(os.path.basename(run) == name for root in roots if os.path.isdir(root)
               for run in rundir.discover_runs(root))


def _embed_or_join(service, index: Path, roots: list[str]):
    """Start the embedded ingester, or join the writer that holds the index: ``(ingester, running)``.

    Two `traceml watch` started together (two tmux panes) both see no writer;
    the one that loses the lock race shows the winner's index instead of exiting.
    """
    for attempt in range(3):
        running = service.find_running_daemon(index)
        if running is not None:
            return None, running
        ingester = service.Ingester(index, roots, poll_interval=0.5, use_inotify=True, mode="watch")
        try:
            ingester.start()
            return ingester, None
        except service.IndexLockedError:
            if attempt == 2:  # held, yet nobody answers find_running_daemon (a hard-linked alias): refuse
                raise
    raise AssertionError("unreachable")


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _serve_web(args: argparse.Namespace, roots: list[str], index: Path, host: str, port: int) -> int:
    """Serve `traceml watch` to browsers; each connection runs the app as a child that reads this index.

    The ingester (if this process embeds it) keeps running here, so every browser tab's app joins it as a
    reader instead of racing for the writer lock.
    """
    import shlex

    try:
        from traceml_tui.tui.web import WatchServer, new_token, page_url
    except ImportError:
        return _fail("--web needs textual-serve: pip install 'traceml-tui[web]'")

    command = [sys.executable, "-m", "traceml_tui", "watch", *roots, "--index", str(index), "--poll", str(args.poll),
               "--max-step-time-regression-pct", str(args.threshold)]
    if args.stall_after is not None:
        command += ["--stall-after", str(args.stall_after)]
    if args.no_alerts:
        command.append("--no-alerts")
    if args.compare:
        command += ["--compare", *args.compare]
    token = None if args.no_token else new_token()
    if token is None:
        print(f"traceml watch: warning: serving on {host}:{port} without an access token; anyone who can reach it "
              "sees these runs and drives the app", file=sys.stderr)
    elif args.public:
        print(f"traceml watch: warning: serving on {host}:{port} to other machines; the token is all that guards "
              "it (an SSH tunnel to 127.0.0.1 is safer)", file=sys.stderr)
    # Jupyter style: the one line to open (docs/cluster.md); the page's own requests then carry a cookie.
    print(f"traceml watch: serving the app on {page_url(host, port, token)} (Ctrl+C stops)", file=sys.stderr,
          flush=True)
    WatchServer(shlex.join(command), host=host, port=port, token=token, title="traceml watch",
                public=args.public).serve()
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of `traceml watch`; returns the exit code."""
    args = _parser().parse_args(argv)
    from daemon import locations, service
    from traceml_tui.compare.policy import ThresholdError, parse_optional_threshold

    try:
        threshold = parse_optional_threshold(args.threshold)
    except ThresholdError as exc:
        return _fail(f"--max-step-time-regression-pct: {exc}", 2)
    if not args.web and (args.host is not None or args.port is not None or args.public or args.no_token):
        return _fail("--host, --port, --public and --no-token go with --web", 2)
    host = args.host or "127.0.0.1"
    port = 8000 if args.port is None else args.port
    if args.web:
        if not 0 < port < 65536:
            return _fail(f"--port must be 1-65535 (got {port})", 2)
        if not _is_loopback(host) and not args.public:
            return _fail(f"--host {host} is reachable from other machines: add --public to mean it, or keep "
                         "127.0.0.1 and use an SSH tunnel", 2)
    explicit = bool(args.roots)
    roots = [os.path.abspath(r) for r in (args.roots or ["logs"])]
    for root in roots:
        if explicit and not os.path.isdir(root):
            return _fail(f"{root} is not a folder")
    index = Path(args.index) if args.index else locations.default_index_path()
    if args.compare:
        for spec in args.compare:
            p = Path(spec)
            if (p.suffix == ".json" or os.sep in spec) and not p.exists():
                return _fail(f"{spec} does not exist")
            if not p.exists() and not _run_name_known(spec, roots, index):
                return _fail(f"--compare {spec}: not a summary file, a run folder, a run under "
                             f"{', '.join(roots)} or a run in the index {index}")

    try:
        ingester, running = _embed_or_join(service, index, roots)
    except (OSError, RuntimeError) as exc:
        return _fail(str(exc))
    if running is not None:
        real = [os.path.realpath(r) for r in roots]  # the writer names its roots by their real paths
        missing = [r for r, p in zip(roots, real)
                   if not any(p == w or p.startswith(w.rstrip(os.sep) + os.sep) for w in running.roots)]
        if missing:
            print(f"traceml watch: a {running.mode} (pid {running.pid}) already writes {index} for "
                  f"{', '.join(running.roots) or 'other roots'}; showing its index ({', '.join(missing)} not watched)",
                  file=sys.stderr)

    if args.web:
        try:
            return _serve_web(args, roots, index, host, port)
        finally:
            if ingester is not None:
                ingester.stop()

    from traceml_tui.tui.app import create_app
    from traceml_tui.tui.source import IndexSource

    # ROOT arguments filter what is shown, whoever writes the index; the header says who does, and when
    # that writer exits this watch takes over for its roots (docs/watch.md, "Data source").
    source = IndexSource(index, ingester=ingester, roots=roots if explicit else None, ingest_roots=roots,
                         probe=functools.partial(service.find_running_daemon, index),
                         takeover=functools.partial(_embed_or_join, service, index),
                         poll_s=max(args.poll, WRITER_POLL_S),
                         **({} if args.stall_after is None else {"stall_floor_s": args.stall_after}))
    app = create_app(source, poll_interval=args.poll, alerts=not args.no_alerts,
                     compare=tuple(args.compare) if args.compare else None, threshold_pct=threshold)
    try:
        app.run()
    finally:
        source.close()
    return int(app.return_code or 0)
