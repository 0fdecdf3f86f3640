"""``traceml daemon ROOT… [--index PATH] [--poll-interval S] [--no-inotify] [--once]``.

Runs the ingester in the foreground until SIGTERM/SIGINT (``--once``: ingest
what is present and exit, for scripts, cron and tests). Exit codes: 0 done
(damaged files refused on the way included: ``--once`` says how many), 1 the
index is held by another writer, sits on a network filesystem, was written by
a newer traceml or cannot be written, 2 bad arguments.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Callable, TextIO

from traceml_tui.core.cliargs import OneLineParser, positive_seconds, seconds

from . import index as idx
from . import locations, service
from .lock import IndexLockedError
from .reader import IngestProgress


def _parser() -> OneLineParser:
    p = OneLineParser(prog="traceml daemon", description="Ingest run directories into the local SQLite index.")
    p.add_argument("roots", nargs="*", metavar="ROOT", help="folders holding run directories")
    p.add_argument("--index", metavar="PATH", help="index file (default $XDG_STATE_HOME/traceml/index.sqlite)")
    p.add_argument("--poll-interval", type=positive_seconds, default=1.0, metavar="S", help="re-stat known files every S seconds (default 1)")
    p.add_argument("--rescan-interval", type=positive_seconds, default=None, metavar="S", help="walk the roots every S seconds (default 5)")
    p.add_argument("--no-inotify", action="store_true", help="poll only (no inotify hints)")
    p.add_argument("--once", action="store_true", help="ingest everything present and exit")
    p.add_argument("--prune-missing", action="store_true", help="delete the rows of runs whose folder is gone, then exit")
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="serve Prometheus metrics of the index here (for example 127.0.0.1:9464)")
    p.add_argument("--metrics-retention", type=seconds, default=3600.0, metavar="S",
                   help="seconds an ended run stays in the metrics after its last record (default 3600)")
    return p


def progress_printer(stream: TextIO) -> Callable[[dict], None]:
    """``Ingester.on_progress`` for a terminal: a bar redrawn in place on a TTY, a plain line every 2 s
    otherwise (logs, CI); the finished backlog ends with one line."""
    tty = stream.isatty()
    last = [0.0]

    def show(fields: dict) -> None:
        p = IngestProgress(**{k: fields[k] for k in IngestProgress.__dataclass_fields__})
        now = time.monotonic()
        if not p.done and now - last[0] < (0.25 if tty else 2.0):
            return
        last[0] = now
        files = f"{p.files_done} / {p.files_total} files"
        rate = f"{p.records_per_s:,.0f} records/s"
        if p.done:
            line = f"traceml daemon: {p.text()} from {p.files_total} files ({rate})"
            stream.write(("\r\x1b[2K" if tty else "") + line + "\n")
        elif tty:
            frac = p.records_done / p.records_total if p.records_total else p.files_done / max(1, p.files_total)
            bar = "#" * round(20 * min(1.0, frac))
            stream.write(f"\r\x1b[2K[{bar:<20}] {p.text()} · {files} · {rate}")
        else:
            stream.write(f"traceml daemon: {p.text()} · {files} · {rate}\n")
        stream.flush()

    return show


def main(argv: list[str]) -> int:
    """Entry point of ``traceml daemon``."""
    args = _parser().parse_args(argv)
    index_path = os.path.abspath(args.index) if args.index else str(locations.default_index_path())
    if not args.roots and not args.prune_missing:
        print("traceml daemon: give at least one ROOT folder to watch", file=sys.stderr)
        return 2
    for root in args.roots:
        if not os.path.isdir(root):
            print(f"traceml daemon: root is not a folder: {root}", file=sys.stderr)
            return 2
    metrics_at = None
    if args.metrics:
        from .metrics import HostPortError, parse_host_port

        try:
            metrics_at = parse_host_port(args.metrics)
        except HostPortError as exc:
            print(f"traceml daemon: {exc}", file=sys.stderr)
            return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    ingester = service.Ingester(index_path, args.roots, poll_interval=args.poll_interval,
                                use_inotify=not args.no_inotify, rescan_interval=args.rescan_interval)
    ingester.on_progress = progress_printer(sys.stderr)  # a first launch over a large log root says so
    try:
        ingester.open()
    except locations.NetworkFilesystemError as exc:
        print(f"traceml daemon: {exc}", file=sys.stderr)
        return 1
    except (IndexLockedError, idx.IndexSchemaError, idx.IndexDamagedError) as exc:
        print(f"traceml daemon: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"traceml daemon: cannot open the index {index_path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        if args.prune_missing:
            removed = idx.prune_missing(ingester.conn)
            print(f"traceml daemon: pruned {removed} missing run(s)")
            return 0
        if args.once:
            try:
                n = ingester.run_once()
            except service.IndexWriteError as exc:
                print(f"traceml daemon: {exc} (ingested {ingester.records_ingested} record(s) before that)",
                      file=sys.stderr)
                return 1
            # Damaged files are refused one by one (one error row each) and never fail the run: exit 0, with
            # the count, so that cron and CI see both (docs/daemon.md, "Damaged input").
            refused = len(ingester.refused)
            tail = f"; refused {refused} file(s) (see `traceml status` errors)" if refused else ""
            print(f"traceml daemon: ingested {n} record(s) into {index_path}{tail}")
            return 0
        if metrics_at is not None:
            from .metrics import serve as serve_metrics

            try:
                serve_metrics(index_path, *metrics_at, retention_s=args.metrics_retention)
            except OSError as exc:
                print(f"traceml daemon: cannot serve metrics on {args.metrics}: {exc.strerror or exc}", file=sys.stderr)
                return 1
            print(f"traceml daemon: metrics on http://{args.metrics}/metrics", file=sys.stderr, flush=True)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: ingester.request_stop())
        print(f"traceml daemon: watching {len(args.roots)} root(s) into {index_path} (pid {os.getpid()})",
              file=sys.stderr, flush=True)
        ingester.serve()
        return 0
    finally:
        ingester.close()
