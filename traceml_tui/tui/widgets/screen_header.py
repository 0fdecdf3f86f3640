"""Every screen's header: Textual's Header, whose title line keeps the screen's subject whole.

The line is ``title — sub-title``: the title is the app's name and the data
source (``traceml watch · daemon pid 4242 · commit 2s ago``), the sub-title the
screen's subject (``describe · guard-candidate-20261130-133543``, a run's
name). Textual cuts the whole line at its end, so on an 80-column terminal a
long source line left the run name as ``…``. Here the source line gives way
first, a whole fact at a time (the app's name, then its last facts), never
cut inside a fact; the subject is cut, at its end, only when it does not fit
alone. A warning still colours the whole header (``-source-stale``).
"""

from __future__ import annotations

from rich.cells import cell_len
from textual.app import ComposeResult, RenderResult
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Header
from textual.widgets._header import HeaderTitle  # not exported; Header finds its title line by this type

from traceml_tui.core.rundir import tail_cut

#: Between the facts of the title (``traceml watch · daemon pid 4242 · commit 2s ago``).
FACT_SEP = " · "
#: Between the title and the sub-title (as Textual's App.format_title writes it).
TITLE_SEP = " — "


def fit_title(title: str, sub_title: str, width: int, app_name: str = "") -> tuple[str, str]:
    """The (title, sub-title) to show in ``width`` cells; the sub-title (the screen's subject) is kept whole.

    When ``title — sub_title`` does not fit, the title gives way first: its
    leading ``app_name``, then its last facts (``·``-separated), one whole fact
    at a time, then all of it. The sub-title alone is cut at its end only when
    it is wider than ``width``.
    """
    if not sub_title or width <= 0:
        return title, sub_title
    facts = title.split(FACT_SEP) if title else []
    if facts and app_name and facts[0] == app_name:
        shorter = [facts, facts[1:]]
        facts = facts[1:]
    else:
        shorter = [facts]
    shorter += [facts[:n] for n in range(len(facts) - 1, 0, -1)]
    room = width - cell_len(sub_title) - cell_len(TITLE_SEP)
    for kept in shorter:
        text = FACT_SEP.join(kept)
        if text and cell_len(text) <= room:
            return text, sub_title
    return "", tail_cut(sub_title, width)


class FittedTitle(HeaderTitle):
    """The header's title line, laid out for the width it has (:func:`fit_title`) at every render."""

    def render(self) -> RenderResult:
        header = self.parent
        if not isinstance(header, Header):
            return super().render()
        title, sub_title = fit_title(header.screen_title, header.screen_sub_title, self.size.width,
                                     app_name=self.app.title)
        if not title:
            return Content(sub_title)  # alone: not dimmed as a sub-title beside the title is
        return self.app.format_title(title, sub_title)


class ScreenHeader(Header):
    """Textual's Header with a :class:`FittedTitle` (the icon, the clock space and the title bindings are its)."""

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            yield FittedTitle() if type(widget) is HeaderTitle else widget


def set_screen_title(screen: Screen, title: str) -> None:
    """Set ``screen``'s title, repainting only its header's title line.

    ``Screen.title`` is a repainting reactive: a new value repaints the whole screen, every cell of it sent to
    the terminal again, and the source line changes every second (``commit 3s ago``; docs/watch.md "Cheap
    over SSH"). The value is set without its watchers, and the title lines that show it are redrawn.
    """
    if screen.title == title:
        return
    screen.set_reactive(Screen.title, title)
    for line in screen.query(FittedTitle):
        line.refresh()
