"""Coverage-guided fuzzing of traceml's readers with atheris, run by hand before a release (docs/security.md).

Not a test module (pytest collects ``test_*.py`` only) and not run by CI: atheris is not a dependency.
Install it by hand (``pip install atheris``), then run one target, seeded with the committed corpus::

    python tests/fuzz/atheris_harness.py backlog -max_total_time=600 tests/fuzz/corpus/backlog

Targets and the contract each asserts (the same as the hypothesis properties beside this file):

* ``backlog`` — the bytes as a receipt, claim, request or failure file of a copy of the committed hygiene run:
  ``backlog_status`` never raises, a damaged file is exactly one error line, the ``--json`` output is strict JSON;
* ``config``  — the bytes as ``traceml.yaml``: a config or one ``ConfigError``/``HygieneConfigError`` line;
* ``cursor``  — the bytes as a Trackio export cursor: refused with one line (the file left as it was) or read;
* ``compare`` — the bytes as the candidate summary against the committed schema-1.9 reference: exit 0/3/4, or
  exit 1 with one line that is not an internal error;
* ``json``    — the bytes through ``core.jsonsafe`` and every ``core.hygiene_files`` decoder: only the
  documented errors.

A crash leaves ``crash-<hash>`` holding the input: copy it into ``tests/fuzz/corpus/<target>/`` (the pytest
corpus tests replay it) and fix the reader.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(TESTS.parent))  # the repository, when run from anywhere

FIXTURES = TESTS / "fixtures"
WORK = Path(tempfile.mkdtemp(prefix="traceml-atheris-"))


def _strict(text: str) -> None:
    def refuse(constant: str) -> None:
        raise AssertionError(f"invalid JSON constant {constant}")
    json.loads(text, parse_constant=refuse)


def _backlog_target():
    from traceml_tui.core import hygiene_files
    from traceml_tui.core.jsonsafe import dumps_valid
    from traceml_tui.hygiene.backlog import backlog_status
    from traceml_tui.hygiene.validate_cli import format_status

    run = WORK / "hygiene"
    shutil.copytree(FIXTURES / "runs" / "hygiene", run)
    files = sorted(p.relative_to(run).as_posix() for p in (run / "validation").glob("*/*.json"))

    def one(data: bytes) -> None:
        rel = files[data[0] % len(files)] if data else files[0]
        body = data[1:]
        path = run / rel
        original = path.read_bytes()
        path.write_bytes(body)
        try:
            status = backlog_status(run)
        finally:
            path.write_bytes(original)
        try:
            hygiene_files.decode_named(Path(rel).parent.name, Path(rel).name, body)
            assert status["errors"] == [], status["errors"]
        except hygiene_files.DamagedFile:
            assert len(status["errors"]) == 1 and status["errors"][0].startswith(rel), status["errors"]
        format_status(status).encode("utf-8")
        _strict(dumps_valid(status))

    return one


def _config_target():
    from traceml_tui.guard.config import ConfigError, load_config
    from traceml_tui.hygiene.config import HygieneConfigError, parse_hygiene

    path = WORK / "traceml.yaml"

    def one(data: bytes) -> None:
        path.write_bytes(data)
        try:
            config = load_config(path)
            if config.hygiene is not None:
                parse_hygiene(config.hygiene)
        except (ConfigError, HygieneConfigError) as exc:
            assert "\n" not in str(exc), str(exc)

    return one


def _cursor_target():
    from traceml_tui.export import cursor as cm
    from traceml_tui.export import trackio_export as tx

    class Sink:
        def open(self, **kwargs): pass
        def log(self, points, step): pass
        def table(self, *args): pass
        def image(self, *args): pass
        def close(self): pass

    run = WORK / "completed"
    shutil.copytree(FIXTURES / "runs" / "completed", run)
    registration = tx.Registration(project="fuzz-lab", group="g", description="atheris", server_url=None)
    tx.export_run(run, registration, Sink())
    path = cm.cursor_path(run, registration.project)
    good = path.read_bytes()

    def one(data: bytes) -> None:
        path.write_bytes(data)
        try:
            tx.export_run(run, registration, Sink())
        except ValueError as exc:
            assert "\n" not in str(exc) and path.name in str(exc), str(exc)
            assert path.read_bytes() == data
        finally:
            path.write_bytes(good)

    return one


def _compare_target():
    from traceml_tui.compare.cli import main

    reference = FIXTURES / "summaries" / "ours" / "base_1.9.json"
    candidate = WORK / "cand" / "final_summary.json"
    candidate.parent.mkdir()

    def one(data: bytes) -> None:
        candidate.write_bytes(data)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(reference), str(candidate), "--format", "json", "--output", str(WORK / "out" / "c")])
        if code in (0, 3, 4):
            _strict(out.getvalue())
        else:
            lines = err.getvalue().strip().splitlines()
            assert code == 1 and len(lines) == 1 and "internal error" not in lines[0], (code, err.getvalue())

    return one


def _json_target():
    import msgspec

    from traceml_tui.core import hygiene_files, jsonsafe

    decoders = [lambda d, f=f: hygiene_files.decode_backlog(f, d) for f in hygiene_files.BACKLOG_TYPES]
    decoders += [hygiene_files.decode_early_stopping, hygiene_files.decode_cursor]

    def one(data: bytes) -> None:
        try:
            jsonsafe.loads_bounded(data)
        except ValueError:
            pass
        try:
            jsonsafe.decode_bounded(data)
        except (msgspec.DecodeError, msgspec.ValidationError, jsonsafe.NestingError):
            pass
        for decode in decoders:
            try:
                decode(data)
            except hygiene_files.DamagedFile as exc:
                assert "\n" not in str(exc)

    return one


TARGETS = {"backlog": _backlog_target, "config": _config_target, "cursor": _cursor_target,
           "compare": _compare_target, "json": _json_target}


def main(argv: list[str]) -> None:
    """``atheris_harness.py TARGET [libFuzzer options and corpus folders]``."""
    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.exit(f"usage: {argv[0]} {{{','.join(TARGETS)}}} [libFuzzer options] [corpus dirs]")
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: pip install atheris (it is not a traceml dependency; docs/security.md)")
    with atheris.instrument_imports():
        one = TARGETS[argv[1]]()
    atheris.Setup([argv[0], *argv[2:]], one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
