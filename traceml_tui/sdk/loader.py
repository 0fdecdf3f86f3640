"""Data wait: the time the training loop spends in ``next()`` of the loader that feeds it.

Three ways a loader is instrumented (none imports torch):

* a plain ``torch.utils.data.DataLoader`` needs no code change: once traceml is
  active in a process that imported torch's data loader, the DataLoader
  iterator's ``__next__`` is timed (one class attribute, installed once; a
  pass-through when no session records). Opt out with ``init(time_dataloader=False)``
  or ``TRACEML_TIME_DATALOADER=0``;
* ``traceml.wrap_loader(iterable)`` returns an iterable whose iterators are timed;
* ``with traceml.trace_loader(loader) as batches:`` times ``batches`` and, when
  the loader's class allows it, the loader itself iterated inside the block.

Attribution (:meth:`Session.loader_wait`): a ``next()`` inside a traced step
adds to that step's ``data_in_step``; one between steps adds to the next step's
``data_wait``, counting only the loader that produced the last batch before the
step (a validation loader iterated between steps is work between steps, not the
training loop's data wait). Only the thread that records steps is timed, and a
loader wrapped twice (a wrapped DataLoader) is timed once, by the outermost call.
"""

from __future__ import annotations

import os
import sys
from threading import get_ident
from time import perf_counter
from typing import Any, Iterable, Iterator

from traceml_tui import sdk as _sdk
from traceml_tui.sdk import env

#: True while a timed ``next()`` runs: an inner timed call (a wrapped DataLoader) passes through.
_busy = False
#: The DataLoader iterator's ``__next__`` is timed (or timing it was declined).
dataloader_done = False


def _timed(source: Any, fn: Any, arg: Any) -> Any:
    """``fn(arg)``, its duration credited to the recording session's data wait."""
    global _busy
    if _busy:
        return fn(arg)
    session = _sdk._session
    if session is None or session.closed or session.thread != get_ident():
        return fn(arg)
    _busy = True
    start = perf_counter()
    try:
        return fn(arg)
    finally:
        _busy = False
        session.loader_wait(source, perf_counter() - start)


class TimedIterator:
    """An iterator whose ``next()`` time counts as data wait."""

    __slots__ = ("_it",)

    def __init__(self, iterator: Iterator) -> None:
        self._it = iterator

    def __iter__(self) -> "TimedIterator":
        return self

    def __next__(self) -> Any:
        return _timed(self, next, self._it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


class TimedLoader:
    """An iterable whose iterators are timed; other attributes (``len``, ``dataset``, …) are the loader's."""

    __slots__ = ("_loader",)

    def __init__(self, loader: Iterable) -> None:
        self._loader = loader

    def __iter__(self) -> Iterator:
        it = iter(self._loader)
        return it if type(it) is TimedIterator else TimedIterator(it)

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __repr__(self) -> str:
        return f"traceml.wrap_loader({self._loader!r})"


def wrap_loader(iterable: Any) -> Any:
    """Time every ``next()`` on ``iterable`` as data wait: ``for batch in traceml.wrap_loader(loader):``.

    An iterable (a DataLoader, a list, a dataset) gives a :class:`TimedLoader`;
    an iterator (a generator) gives a :class:`TimedIterator`.
    """
    if isinstance(iterable, (TimedLoader, TimedIterator)):
        return iterable
    if hasattr(type(iterable), "__next__"):
        return TimedIterator(iterable)
    return TimedLoader(iterable)


_subclasses: dict[type, type] = {}


def _timed_subclass(cls: type) -> type:
    sub = _subclasses.get(cls)
    if sub is None:
        def __iter__(self: Any) -> Iterator:  # noqa: N807 - the special method of the subclass
            it = super(sub, self).__iter__()
            return it if type(it) is TimedIterator else TimedIterator(it)

        sub = type(cls.__name__, (cls,), {
            "__slots__": (), "__iter__": __iter__, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "_traceml_timed_class": cls,
        })
        _subclasses[cls] = sub
    return sub


class trace_loader:  # noqa: N801 - used as a context manager, reads like a function
    """``with traceml.trace_loader(loader) as batches:`` — time the loader's ``next()`` inside the block.

    ``batches`` is ``wrap_loader(loader)``. When the loader's class allows it (any
    Python class, DataLoader included) ``for batch in loader:`` inside the block is
    timed too; iterators created in the block stay timed after it.
    """

    __slots__ = ("_loader", "_swapped")

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._swapped: Any = None

    def __enter__(self) -> Any:
        loader = self._loader
        cls = type(loader)
        if not hasattr(cls, "__next__") and "_traceml_timed_class" not in cls.__dict__:
            try:
                loader.__class__ = _timed_subclass(cls)
                self._swapped = cls
            except TypeError:  # a builtin or C type: only the returned wrapper is timed
                self._swapped = None
        return wrap_loader(loader)

    def __exit__(self, *exc: Any) -> bool:
        swapped, self._swapped = self._swapped, None
        if swapped is not None and type(self._loader).__dict__.get("_traceml_timed_class") is swapped:
            self._loader.__class__ = swapped
        return False


def enabled(option: Any) -> bool:
    """Whether plain DataLoaders are timed: ``init(time_dataloader=…)``, else ``TRACEML_TIME_DATALOADER`` (default on)."""
    if option is not None:
        return bool(option)
    return os.environ.get(env.TIME_DATALOADER, "1").strip().lower() not in ("0", "false", "no", "off")


def decline_dataloader() -> None:
    """Never time plain DataLoaders in this process (the opt-out)."""
    global dataloader_done
    dataloader_done = True


def install_dataloader() -> None:
    """Time ``torch.utils.data.DataLoader`` iterators, once torch's data loader is imported.

    Cheap to call every step until it succeeds: without the module it is one
    dict lookup; torch is never imported here. The class attribute also covers
    iterators created before it was installed (the running epoch).
    """
    global dataloader_done
    module = sys.modules.get("torch.utils.data.dataloader")
    if module is None:
        return
    dataloader_done = True
    cls = getattr(module, "_BaseDataLoaderIter", None)
    original = getattr(cls, "__next__", None) if cls is not None else None
    if original is None or getattr(original, "_traceml_timed", False):
        return

    def __next__(self: Any) -> Any:  # noqa: N807 - replaces the iterator's special method
        # _timed(self, original, self) written inline: this runs once per batch, in every training loop
        global _busy
        session = _sdk._session
        if _busy or session is None or session.closed or session.thread != get_ident():
            return original(self)
        _busy = True
        start = perf_counter()
        try:
            return original(self)
        finally:
            _busy = False
            seconds = perf_counter() - start
            if session.current is None and session.data_source is None:
                # the first fetch since the last step began (Session.loader_wait's case, without the call)
                session.data_source = self
                session.data_pending = seconds
            else:
                session.loader_wait(self, seconds)

    __next__._traceml_timed = True  # type: ignore[attr-defined]
    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    __next__.__doc__ = original.__doc__
    cls.__next__ = __next__
