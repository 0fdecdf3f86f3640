"""The keys every list of `traceml watch` shares, as terminal users expect them (docs/watch.md "Keys").

``j``/``k`` move down/up, ``g``/Home go to the first line and ``G``/End to the
last, in every list: the tables (runs, ranks, backlog, compare), the describe
tree, the log view and the help text. Each widget maps the four actions onto
its own idea of a cursor; the keys are declared once here so that Help, the
docs and the widgets cannot drift apart.
"""

from __future__ import annotations

from textual.binding import Binding


def list_bindings(down: str = "cursor_down", up: str = "cursor_up", first: str = "cursor_first",
                  last: str = "cursor_last") -> list[Binding]:
    """``j``/``k``/``g``/``G``/Home/End bound to a widget's own actions (hidden from the footer; Help lists them)."""
    return [
        Binding("j", down, "Down", show=False),
        Binding("k", up, "Up", show=False),
        Binding("g,home", first, "First", show=False),
        Binding("G,end", last, "Last", show=False),
    ]


#: What Help says about the list keys (they are on every list, so Help lists them once, under "Everywhere").
LIST_KEYS_HELP: tuple[tuple[str, str], ...] = (
    ("j k", "down / up in every list (as ↓ / ↑)"),
    ("g Home", "the first line of the list"),
    ("G End", "the last line of the list"),
)
