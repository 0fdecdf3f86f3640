"""The daemon in rooms (docs/daemon.md, "Rooms" and "Reader API"): each room stays small enough to read in one sitting.

The ingester's service holds lifecycle, the serve loop and the transaction; the stream, pass planning, decoding
and the cold path return what they found and write no SQL. The read side's entrance, ``Reader``, holds the
connection, the runs and the views' entry points; what it reads lives in its rooms (``reader.series``,
``reader.backlog``, ``reader.events``, ``reader.files``). import-linter holds the arrows (pyproject.toml).
"""

from __future__ import annotations

import ast
from pathlib import Path

DAEMON = Path(__file__).resolve().parents[1] / "daemon"
MAX_METHODS = 25
MAX_SERVICE_LINES = 700


def _classes(paths):
    for path in sorted(paths):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods = [n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                yield path.name, node.name, methods


def _over_budget(paths) -> dict[tuple[str, str], int]:
    """Every class of ``paths`` with more than MAX_METHODS methods (no exception)."""
    return {(module, name): len(methods) for module, name, methods in _classes(paths) if len(methods) > MAX_METHODS}


def test_no_class_in_the_daemon_has_more_than_25_methods():
    found = {(module, name) for module, name, _ in _classes(DAEMON.glob("*.py"))}
    # The walk sees the rooms of both sides, the reader among them.
    assert {("service.py", "Ingester"), ("stream.py", "Streams"), ("reader.py", "Reader"),
            ("read_series.py", "SeriesReader"), ("read_backlog.py", "BacklogReader"),
            ("read_events.py", "EventsReader"), ("read_files.py", "FilesReader"),
            ("read_runs.py", "RunsReader")} <= found
    over = _over_budget(DAEMON.glob("*.py"))
    assert not over, f"classes over {MAX_METHODS} methods: {over}; split them into rooms (docs/daemon.md)"


def test_the_budget_catches_a_class_one_method_over(tmp_path):
    def source(n: int) -> str:
        return "class Grown:\n" + "".join(f"    def m{i}(self):\n        pass\n" for i in range(n))

    (tmp_path / "fits.py").write_text(source(MAX_METHODS), encoding="utf-8")
    (tmp_path / "grown.py").write_text(source(MAX_METHODS + 1), encoding="utf-8")
    assert _over_budget(tmp_path.glob("*.py")) == {("grown.py", "Grown"): MAX_METHODS + 1}


def test_the_reader_delegates_to_its_rooms():
    """What moved into a room is reached through it, not through a second entrance on the reader."""
    reader = next(m for mod, name, m in _classes([DAEMON / "reader.py"]) if name == "Reader")
    moved = {"series", "series_tail", "series_metrics", "node_samples", "step_count", "backlog", "backlog_outstanding",
             "eval_freshness", "newest_evaluated_step", "early_stopping", "events", "errors", "unmeasured",
             "manifest", "summary_bytes", "failure", "validation", "log_files"}
    assert not moved & set(reader)


def test_the_service_stays_within_700_lines():
    lines = len((DAEMON / "service.py").read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_SERVICE_LINES, f"daemon/service.py has {lines} lines; put new logic in its room"
