"""Import hooks: when the script imports a trainer module, attach traceml to it (docs/trainers.md).

A :class:`TrainerFinder` sits first on ``sys.meta_path``. For the modules named
in :data:`TARGETS` it asks the other finders for the real spec and wraps its
loader so that, right after the module has executed, the integration's
``activate(module)`` runs (patching the module's ``Trainer`` class). Nothing
here imports a framework: a script that never imports one pays one dict
lookup per import. A module already imported when the hooks are installed is
activated at once.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from typing import Any, Optional, Sequence

from traceml_tui.integrations.support import unmeasured

#: Module that defines a trainer -> "module:function" that attaches traceml to it.
TARGETS: dict[str, str] = {
    "transformers.trainer": "traceml_tui.integrations.hf:activate",
    "lightning.pytorch.trainer.trainer": "traceml_tui.integrations.lightning:activate",
    "pytorch_lightning.trainer.trainer": "traceml_tui.integrations.lightning:activate",
}

_activated: set[str] = set()


def activate(name: str, module: Any) -> None:
    """Run the integration of ``name`` on its freshly executed ``module`` (once; never raises)."""
    if name in _activated:
        return
    _activated.add(name)
    try:
        target, _, function = TARGETS[name].partition(":")
        getattr(importlib.import_module(target), function)(module)
    except Exception as exc:  # noqa: BLE001 - fail-open: the script runs on without traceml's callback
        unmeasured("all", f"attaching to {name} failed ({type(exc).__name__}: {str(exc)[:200]}); "
                            "training continues untraced")


class _ActivatingLoader(importlib.abc.Loader):
    """The real loader, then :func:`activate` on the executed module."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        activate(self._name, module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package… of the real loader
        return getattr(self._loader, name)


class TrainerFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the trainer modules other finders find."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if fullname not in TARGETS or fullname in _activated:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ActivatingLoader(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once) and activate trainer modules already imported."""
    if not any(isinstance(finder, TrainerFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, TrainerFinder())
    for name in TARGETS:
        module = sys.modules.get(name)
        if module is not None:
            activate(name, module)
