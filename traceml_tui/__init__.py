"""traceml: terminal-first monitor and regression guard for PyTorch training.

Training scripts use the SDK through this package::

    import traceml_tui as traceml

    traceml.init()
    for batch in loader:
        with traceml.trace_step(model):
            loss = ...
            traceml.log(loss=loss.item(), lr=lr)

The SDK is loaded lazily so that importing this package (as `traceml compare`
and the daemon do) never imports torch.
"""

from __future__ import annotations

__version__ = "0.1.0"

_SDK_NAMES = (
    "init",
    "trace_step",
    "wrap_loader",
    "trace_loader",
    "log",
    "log_eval",
    "publish_checkpoint",
    "finish",
    "current_run",
    "log_batch_grid",
    "log_gallery",
    "log_field_stats",
    "declare_input",
    "save_recovery",
    "restore_recovery",
    "record_split",
    "report_unmeasured",
)


def __getattr__(name: str):
    if name in _SDK_NAMES:
        from traceml_tui import sdk

        value = getattr(sdk, name)
        globals()[name] = value  # later lookups skip this hook: it sits on the per-step path
        return value
    raise AttributeError(f"module 'traceml_tui' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SDK_NAMES))
