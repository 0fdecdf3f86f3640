"""Item 12: a file the daemon may not read is an error row naming it, not a silent skip."""

from __future__ import annotations

import os

import pytest

from traceml_tui.core import rundir

from support.daemon_files import write_steps

pytestmark = pytest.mark.faults


def _deny(monkeypatch, target) -> None:
    """Refuse reads of ``target`` as a chmod 000 file would for a non-root user (tests run as root here)."""
    real = rundir.open_under

    def open_under(root, path):
        if os.fspath(path) == os.fspath(target):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(root, path)

    monkeypatch.setattr(rundir, "open_under", open_under)


def test_unreadable_stream_is_one_error_row_and_the_rest_is_ingested(env, monkeypatch):
    bad = write_steps(env.root / "r", 0, range(1, 4))
    write_steps(env.root / "r", 1, range(1, 6))
    _deny(monkeypatch, bad)
    env.ingest()
    env.ingest()  # a second pass adds no second row
    _, steps, errors, _ = env.run("r")
    assert steps == 5
    assert [e.message for e in errors] == ["ranks/rank_0/steps-0.jsonl: cannot be read (Permission denied)"]


def test_unreadable_manifest_is_named(env, monkeypatch):
    write_steps(env.root / "r", 0, range(1, 3))
    manifest = env.root / "r" / "manifest.json"
    manifest.write_text('{"run_name": "r"}')
    _deny(monkeypatch, manifest)
    env.ingest()
    _, _, errors, _ = env.run("r")
    assert [e.message for e in errors] == ["manifest.json: cannot be read (Permission denied)"]
