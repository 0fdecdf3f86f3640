"""``traceml export trackio RUN_DIR… --project LANE-MANAGER --group G --description TEXT``.

Exit codes: 0 delivered (or nothing new), 2 bad registration, arguments or
destination configuration (checked before any artifact is read or any server
contacted), a Trackio run that belongs to another run directory, two source keys
of one record that would publish one key, or a description, group or first
measurements that Trackio's API reads back differently, 65 malformed
step lines were skipped (everything else was delivered), 75 the destination was
unavailable (nothing lost: the next export retries from the cursor).

``--check TARGET`` (docs/export.md, "Check before launch"): 0 the folder and
every planned metric are mapped, 2 one line naming the first that is not, 75
Trackio could not be asked whether the folder's Trackio run is taken.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Optional

from traceml_tui.core.cliargs import OneLineParser

EXIT_MALFORMED = 65  # EX_DATAERR: the run holds lines that are not records
EXIT_UNAVAILABLE = 75  # EX_TEMPFAIL: try again later


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="traceml export", description="Publish run directories to a tracking dashboard (a derived index).")
    sub = p.add_subparsers(dest="target", required=True, parser_class=OneLineParser)
    t = sub.add_parser("trackio", help="publish to Trackio")
    t.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run folders (with --check: a run folder holding manifest.json, or a traceml.yaml)")
    t.add_argument("--project", help="<lane>-<manager>, lowercase and stable (e.g. vanguard-hal)")
    t.add_argument("--group", help="group shared by related experiments")
    t.add_argument("--description", help="plain-language description: question, knob, the run's current role")
    t.add_argument("--server-url", help="a self-hosted Trackio server (default: the local Trackio store)")
    t.add_argument("--validate-only", action="store_true",
                   help="check the registration and metric mapping, read nothing, contact nothing")
    t.add_argument("--check", action="store_true",
                   help="before launch: check that the run's folder and its planned metrics (hygiene: block) are "
                        "mapped; send nothing")
    t.add_argument("--follow", action="store_true", help="keep exporting as the runs grow")
    t.add_argument("--interval", type=float, default=30.0, help="seconds between --follow passes (default 30)")
    t.add_argument("--cursor-dir", help="keep export cursors here instead of <run_dir>/export/")
    t.add_argument("--run-name", help="the Trackio run to publish one RUN_DIR as (default: its folder's name)")
    return p


def _err(message: str) -> None:
    print(f"traceml export: {message}", file=sys.stderr)


def _check(args: argparse.Namespace) -> int:
    """``--check``: each TARGET's folder and planned metrics mapped (0), one line naming what is not (2).

    75 when the Trackio store or server cannot be asked whether the folder's
    Trackio run belongs to another folder. Nothing is written, nothing is sent.
    """
    from traceml_tui.export import check, readback, trackio_export

    if args.follow or (args.run_name is not None and len(args.run_dirs) > 1):
        _err("--check takes no --follow, and --run-name with one TARGET only")
        return 2
    try:
        import trackio  # noqa: F401
    except ImportError:
        _err("the trackio package is not installed (pip install 'traceml[trackio]')")
        return 2
    problem = trackio_export.destination_problem(args.server_url)
    if problem:
        _err(problem)
        return 2
    reader = readback.TrackioReader(args.server_url)
    cursor_dir = Path(args.cursor_dir) if args.cursor_dir else None
    failed = unavailable = False
    for target in args.run_dirs:
        try:
            plan = check.load_plan(Path(target), args.run_name)
            sources = check.planned_keys(plan.hygiene)
            state = check.check_folder(plan, args.project, reader, cursor_dir)
        except check.CheckFailed as exc:
            _err(f"check failed: {exc}")
            failed = True
            continue
        except readback.ReadBackUnavailable as exc:
            _err(f"{target}: cannot ask Trackio whether run {plan.run_name!r} is taken ({exc})")
            unavailable = True
            continue
        keys = sorted({key for _, key in sources})
        print(f"check ok: {plan.run_dir} ({plan.origin}) -> Trackio run {plan.run_name!r} of {args.project} "
              f"({state}); {len(keys)} planned keys mapped: {', '.join(keys)}", flush=True)
    return 2 if failed else EXIT_UNAVAILABLE if unavailable else 0


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``traceml export``."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    from traceml_tui.export import mapping

    # registration first: nothing is read and no server is contacted until it is complete
    problems = mapping.registration_problems(args.project, args.group, args.description)
    if problems:
        _err("registration incomplete: " + "; ".join(problems))
        return 2
    if args.validate_only:
        lane, manager = mapping.lane_and_manager(args.project)
        print(f"registration ok: project {args.project} (lane {lane}, manager {manager}), group {args.group}, "
              f"{len(mapping.MAPPING)} mapped sources, step metric {mapping.STEP_METRIC}")
        return 0
    if args.interval <= 0:
        _err("--interval must be positive")
        return 2
    if args.check:
        return _check(args)
    from traceml_tui.core.rundir import RunDir

    run_dirs = [Path(d) for d in args.run_dirs]
    for d in run_dirs:
        if not d.is_dir() or not RunDir(d).ranks.is_dir():
            _err(f"{d}: not a run directory (no ranks/ folder)")
            return 2
    if args.run_name is not None and (len(run_dirs) > 1 or args.run_name.strip() in ("", ".", "..")
                                      or "/" in args.run_name or args.run_name != args.run_name.strip()):
        _err("--run-name names one RUN_DIR's Trackio run: one RUN_DIR, a name without '/' or surrounding spaces")
        return 2
    named: dict[str, Path] = {}
    for d in run_dirs:  # one Trackio run per run directory: two folders of one name would merge
        other = named.setdefault(d.resolve().name, d.resolve())
        if other != d.resolve():
            _err(f"{other} and {d.resolve()} are both named {d.resolve().name!r}: export each on its own, "
                 "one of them with --run-name")
            return 2

    from traceml_tui.export import trackio_export as tx

    try:
        import trackio  # noqa: F401
    except ImportError:
        _err("the trackio package is not installed (pip install 'traceml[trackio]')")
        return 2
    problem = tx.destination_problem(args.server_url)
    if problem:  # a configuration error, not an outage: retrying (--follow) would never succeed
        _err(problem)
        return 2
    registration = tx.Registration(args.project, args.group, args.description.strip(), args.server_url)
    cursor_dir = Path(args.cursor_dir) if args.cursor_dir else None

    stop = {"now": False}

    def _stop(signum, frame):  # noqa: ANN001 - signal handler signature
        stop["now"] = True

    if args.follow:
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)

    while True:
        unavailable = malformed = refused = False
        for run_dir in run_dirs:
            try:
                counts = tx.export_run(run_dir, registration, tx.TrackioSink(args.server_url), cursor_dir=cursor_dir,
                                       run_name=args.run_name)
            except tx.SinkUnavailable as exc:
                _err(f"{run_dir.name}: Trackio unavailable ({exc}); local results untouched, will retry from the cursor")
                unavailable = True
                continue
            except (OSError, ValueError) as exc:  # this run's configuration or data: the other runs still go
                _err(f"{run_dir.name}: {exc}")
                refused = True
                continue
            if counts["malformed"]:
                malformed = True
                _err(f"{run_dir.name}: skipped {counts['malformed']} malformed step-file lines (not records; "
                     "the run directory is unchanged, everything else was sent)")
            if counts["points"] or counts["tables"] or counts["images"]:
                updated = " (new description/group, read back)" if counts["registration"] else ""
                if counts.get("verified"):
                    updated += f" (first measurements read back through Trackio: {counts['verified']} equal)"
                print(f"{run_dir.name}: sent {counts['points']} points, {counts['tables']} tables, "
                      f"{counts['images']} images to {args.project}{updated}", flush=True)
            elif not args.follow:
                print(f"{run_dir.name}: nothing new", flush=True)
        if refused:
            return 2  # a configuration or data error does not fix itself: --follow stops too
        if not args.follow:
            return EXIT_UNAVAILABLE if unavailable else EXIT_MALFORMED if malformed else 0
        finished = all(RunDir(d).summary_json.is_file() for d in run_dirs)
        if finished and not unavailable:
            return 0  # a finished run has nothing more to grow
        deadline = time.monotonic() + args.interval
        while time.monotonic() < deadline and not stop["now"]:
            time.sleep(min(0.2, args.interval))
        if stop["now"]:
            return 0
