"""``traceml compare``: the headless CI check (I/O and exit codes only).

    traceml compare REFERENCE CANDIDATE [--max-step-time-regression-pct P]
                    [--output BASE] [--format text|json|markdown] [--junit PATH]
    traceml compare --calibrate REF1 REF2 [REF3 ...] [--format text|json] [--output BASE]

Exit codes: 0 within/faster (or exploratory), 4 slower, 3 inconclusive,
1 bad input or an output that cannot be written, 2 usage errors. The JSON
and text artifacts are written before the exit code is returned, so a CI
job keeps its evidence whatever the verdict. Errors are one line on stderr.

Imports stay minimal (no textual, no torch, numpy only for the noise
section when step records exist): CI pays interpreter start-up and little
more.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional

from traceml_tui.compare import policy
from traceml_tui.compare.load import SummaryError, read_summary
from traceml_tui.core.cliargs import EXIT_USAGE, RaisingParser, UsageError, usage_line
from traceml_tui.pipes import write_stdout

PROG = "traceml compare"
FORMATS = ("text", "json", "markdown")
_GENERIC_STEMS = {"final_summary", "summary", "run", "output"}
MAX_LABEL_CHARS = 64


class InputError(Exception):
    """Bad input or unwritable output (exit 1)."""


def _threshold(text: str) -> float:
    try:
        return policy.parse_threshold(text)
    except policy.ThresholdError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; it must be a finite number >= 0") from None


def _path(text: str) -> str:
    # An empty --junit wrote nothing and an empty --output fell back to the
    # default: both hid a CI variable that expanded to nothing.
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = RaisingParser(
        prog=PROG,
        description="Compare a reference final_summary.json with a candidate (reference first) "
        "and, with a threshold, give the CI result of seed 000.",
        epilog="Exit codes: 0 within threshold or faster (or exploratory), 4 slower, 3 inconclusive, "
        "1 invalid input or output failure, 2 usage error. See docs/compare.md.",
    )
    parser.add_argument("summaries", nargs="+", metavar="SUMMARY", help="REFERENCE CANDIDATE (or 2+ runs with --calibrate)")
    parser.add_argument(
        "--max-step-time-regression-pct",
        dest="threshold",
        type=_threshold,
        default=None,
        metavar="P",
        help="fail (exit 4) when the candidate's Step Time is more than P%% above the reference",
    )
    parser.add_argument(
        "--output", metavar="BASE", type=_path, default=None, help="write BASE.json and BASE.txt (default compare/<ref>_vs_<cand>)"
    )
    parser.add_argument("--format", choices=FORMATS, default="text", help="what to print on stdout (default text)")
    parser.add_argument("--junit", metavar="PATH", type=_path, default=None, help="also write a JUnit XML file with one test case")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="treat the summaries as repeats of the reference and suggest a threshold",
    )
    return parser


# --- labels and output paths -----------------------------------------------------


def sanitize_label(value: str) -> str:
    """A filename-safe label: [A-Za-z0-9._-] only, no leading dots, bounded length."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", value.strip())
    text = re.sub(r"_+", "_", text).strip("._-")
    return text[:MAX_LABEL_CHARS].rstrip("._-")


def _path_label(path: Path) -> str:
    stem = sanitize_label(path.stem)
    if not stem or stem.lower() in _GENERIC_STEMS:
        parent = sanitize_label(path.resolve().parent.name)
        if parent:
            return parent
    return stem or "run"


def derive_label(path: Path, summary: dict[str, Any]) -> str:
    """Run name from the summary when it has one, else from the file or its folder."""
    run_name = policy.nested(summary, "meta", "run_name")
    if isinstance(run_name, str) and sanitize_label(run_name):
        return sanitize_label(run_name)
    return _path_label(path)


def derive_labels(paths: tuple[Path, Path], summaries: tuple[dict, dict]) -> tuple[str, str]:
    """Distinct labels for the reference and the candidate."""
    ref, cand = derive_label(paths[0], summaries[0]), derive_label(paths[1], summaries[1])
    if ref == cand:
        ref_p, cand_p = _path_label(paths[0]), _path_label(paths[1])
        if ref_p != cand_p:
            return ref_p, cand_p
        return f"reference_{ref}", f"candidate_{cand}"
    return ref, cand


def output_base(option: Optional[str], labels: tuple[str, str]) -> Path:
    """BASE path for the artifacts (``.json``/``.txt`` suffixes are dropped)."""
    default_name = f"{labels[0]}_vs_{labels[1]}"
    if option is None or not option.strip():
        return Path("compare") / default_name
    text = option.strip()
    if text.endswith(("/", os.sep)) or Path(text).is_dir():
        return Path(text) / default_name
    base = Path(text)
    if base.suffix.lower() in (".json", ".txt"):
        base = base.with_suffix("")
    return base


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: by identity when both exist (hard
    links, symlinks), else by their resolved absolute paths."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def _refuse_clashes(outputs: list[tuple[str, Path]], inputs: list[tuple[str, Path]]) -> None:
    """InputError when an output would replace an input summary or another output.

    Checked before the first write: the atomic writes would otherwise
    silently replace a summary with a report, or one report with another.
    """
    taken = list(inputs)
    for out_name, out_path in outputs:
        for name, path in taken:
            if _same_file(out_path, path):
                raise InputError(
                    f"refusing to overwrite the {name} {str(path)!r} with the {out_name} "
                    f"{str(out_path)!r}; nothing was written"
                )
        taken.append((out_name, out_path))


def _write(path: Path, data: bytes) -> None:
    from traceml_tui.core.atomic import atomic_write_bytes

    try:
        atomic_write_bytes(path, data)
    except (FileExistsError, NotADirectoryError):
        raise InputError(f"cannot write {path}: part of its folder path is a file, not a folder") from None
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _load(role: str, path: str, *, require_shape: bool = True) -> dict[str, Any]:
    try:
        return read_summary(path, require_shape=require_shape)
    except SummaryError as exc:
        raise InputError(f"{role} summary {path!r} {exc}") from None


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


# --- the two modes ----------------------------------------------------------------


def run_compare(args: argparse.Namespace) -> int:
    from traceml_tui.compare.core import compare_summaries
    from traceml_tui.compare.render_text import render_text

    if len(args.summaries) != 2:
        raise UsageError(
            f"expected exactly 2 summaries (REFERENCE CANDIDATE), got {len(args.summaries)}; "
            "use --calibrate for repeated reference runs"
        )
    paths = (Path(args.summaries[0]), Path(args.summaries[1]))
    summaries = (_load("reference", args.summaries[0]), _load("candidate", args.summaries[1]))
    labels = derive_labels(paths, summaries)
    result = compare_summaries(summaries[0], summaries[1], args.threshold, labels=labels)

    from traceml_tui.compare.noise import noise_section

    noise = noise_section(
        summaries[0],
        summaries[1],
        paths[0].parent,
        paths[1].parent,
        result.report["step_time"]["clock"],
        args.threshold,
    )
    if noise is not None:
        result = result.with_section("noise", noise)

    report = result.to_dict()
    text = render_text(report)
    base = output_base(args.output, labels)
    json_path = base.with_name(base.name + ".json")
    txt_path = base.with_name(base.name + ".txt")
    outputs = [("--output JSON report", json_path), ("--output text report", txt_path)]
    if args.junit:
        outputs.append(("--junit XML", Path(args.junit)))
    _refuse_clashes(outputs, [("reference summary", paths[0]), ("candidate summary", paths[1])])
    _write(json_path, _json_bytes(report))
    _write(txt_path, text.encode("utf-8"))
    if args.junit:
        from traceml_tui.compare.junit import render_junit

        _write(Path(args.junit), render_junit(report, text).encode("utf-8"))

    if args.format == "json":
        shown = json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    elif args.format == "markdown":
        from traceml_tui.compare.render_markdown import render_markdown

        shown = render_markdown(report)
    else:
        shown = f"{text}Report: {json_path}  {txt_path}\n"
    write_stdout(shown)  # a closed pipe loses the printout, never the verdict: the artifacts are written
    return result.exit_code


def run_calibrate(args: argparse.Namespace) -> int:
    from traceml_tui.compare.calibrate import calibrate, render_calibration

    if len(args.summaries) < 2:
        raise UsageError("--calibrate needs at least 2 summaries of repeated reference runs")
    if args.threshold is not None or args.junit:
        raise UsageError("--calibrate does not take --max-step-time-regression-pct or --junit")
    # One file twice would pass as two repeats with zero spread and suggest the minimum threshold.
    for later, raw in enumerate(args.summaries):
        for earlier in args.summaries[:later]:
            if _same_file(Path(earlier), Path(raw)):
                raise UsageError(f"--calibrate got the same summary twice ({earlier!r} and {raw!r}); give each repeat once")
    runs = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(args.summaries, start=1):
        summary = _load(f"run {index}", raw)
        label = derive_label(Path(raw), summary)
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label = f"{label}_{seen[label]}"
        runs.append((label, summary))
    report = calibrate(runs)
    text = render_calibration(report)
    if args.output:
        base = output_base(args.output, ("calibration", runs[0][0]))
        json_path, txt_path = base.with_name(base.name + ".json"), base.with_name(base.name + ".txt")
        _refuse_clashes(
            [("--output JSON report", json_path), ("--output text report", txt_path)],
            [(f"run {index} summary", Path(raw)) for index, raw in enumerate(args.summaries, start=1)],
        )
        _write(json_path, _json_bytes(report))
        _write(txt_path, text.encode("utf-8"))
    write_stdout(json.dumps(report, indent=2, ensure_ascii=False) + "\n" if args.format == "json" else text)
    return 0 if report["result"] == "OK" else policy.EXIT_CODES[policy.INCONCLUSIVE]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``traceml compare``; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help
            return int(exc.code or 0)
        return run_calibrate(args) if args.calibrate else run_compare(args)
    except UsageError as exc:
        print(usage_line(PROG, str(exc)), file=sys.stderr)
        return EXIT_USAGE
    except InputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return policy.EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - CI must get one line and exit 1, never a traceback
        print(f"{PROG}: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return policy.EXIT_BAD_INPUT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
