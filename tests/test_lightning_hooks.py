"""The Lightning callback drops unused per-batch hooks only where Lightning's dispatcher skips them.

Setting a hook to None saves Lightning's per-callback dispatch (docs/trainers.md "Overhead"); a
Lightning whose dispatcher would call it must keep the inherited no-op hooks (fail open).
"""

import pytest

from traceml_tui.integrations import lightning as pl_adapter


def test_the_installed_dispatcher_skips_a_hook_that_is_not_callable() -> None:
    # Imported by the test, not at collection: importing Lightning costs ~10 s of CPU, which every pytest-xdist
    # worker would pay while collecting even when this test runs elsewhere or is deselected.
    pytest.importorskip("lightning")
    import lightning.pytorch as pl

    assert pl_adapter._dispatcher_skips_none("lightning.pytorch")
    cls = pl_adapter.callback_class("lightning.pytorch")
    assert issubclass(cls, pl.Callback)
    for hook in pl_adapter._SKIPPED_HOOKS:
        assert getattr(cls, hook) is None


def test_an_unknown_dispatcher_keeps_the_hooks_callable() -> None:
    assert not pl_adapter._dispatcher_skips_none("json")  # no trainer/call.py: keep every hook callable
