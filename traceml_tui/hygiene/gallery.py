"""Grouped exemplar galleries (seed 004, "Reuse One Base QC Implementation").

One group per column, examples from distinct sources down the rows (at least
16), paged so that no group is ever omitted: every page shows every group's
column, and a group with fewer examples, or none, keeps its column with its
"n available" count. No example is repeated to fill a gap: a source given
twice in one group is refused. Drawn by the shared grid renderer
(:func:`traceml_tui.hygiene.batch_grid.render_canvas`). Files, immutable per QC
step (docs/qc.md, "Exemplar galleries")::

    qc/gallery/<name>/step-00000120.png           (or step-00000120-p1of3.png …)
    qc/gallery/<name>/step-00000120.json          the sidecar: every tile's group, source, score,
                                                  coordinates, page, row and pixel box; the health measures

The sidecar is written last: its presence means every page is complete.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from traceml_tui.core import atomic
from traceml_tui.core.rundir import RunDir, middle_cut
from traceml_tui.hygiene import batch_grid, qc_measures

RENDERER = "traceml.gallery/1"
#: Seed 004: "configure at least 16 examples from distinct source images down the rows".
MIN_ROWS = 16
MIN_CELL, MAX_CELL = 48, 96
PAD = 4
TITLE_H, HEADER_H, CAPTION_H, LABEL_W = 22, 30, 12, 28
COLUMN_MIN = 84  # a column is at least as wide as its "n available" line at 7 pt
_EXAMPLE_KEYS = ("source", "image", "score", "coords")


class GalleryError(ValueError):
    """Groups that cannot be shown as a gallery; ``str()`` names the group and what is wrong."""


@dataclass(frozen=True)
class Example:
    source: str
    image: Any
    score: Optional[float] = None
    coords: Optional[tuple[float, ...]] = None


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "item"):
        raise GalleryError(f"{what} must be a number, got {type(value).__name__}")
    try:  # numpy and torch scalars have .item(); an array of several values is not a number
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        raise GalleryError(f"{what} must be a number, got {type(value).__name__}") from None
    if not math.isfinite(number):
        raise GalleryError(f"{what} must be finite, got {number}")
    return number


def _example(item: Any, where: str) -> Example:
    """One example from ``{"source", "image", "score"?, "coords"?}`` or ``(source, image[, score])``."""
    if isinstance(item, Example):
        fields = {"source": item.source, "image": item.image, "score": item.score, "coords": item.coords}
    elif isinstance(item, Mapping):
        unknown = [str(k) for k in item if k not in _EXAMPLE_KEYS]
        if unknown:
            raise GalleryError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(_EXAMPLE_KEYS)})")
        fields = dict(item)
    elif isinstance(item, (tuple, list)) and len(item) in (2, 3):
        fields = dict(zip(("source", "image", "score"), item))
    else:
        raise GalleryError(f"{where}: an example is a mapping with source and image, or (source, image[, score])")
    source = fields.get("source")
    if isinstance(source, bool) or not isinstance(source, (str, int)) or not str(source).strip():
        raise GalleryError(f"{where}: the source id must be a nonempty string or an integer")
    if fields.get("image") is None:
        raise GalleryError(f"{where}: no image")
    score = fields.get("score")
    score = None if score is None else _number(score, f"{where}: score")
    coords = fields.get("coords")
    if coords is not None:
        if isinstance(coords, (str, bytes)) or not hasattr(coords, "__iter__"):
            raise GalleryError(f"{where}: coords must be a sequence of numbers")
        coords = tuple(_number(c, f"{where}: coords") for c in coords)
    return Example(source=str(source).strip(), image=fields["image"], score=score, coords=coords)


def normalize_groups(groups: Mapping[str, Sequence[Any]], eligible: Optional[Mapping[str, int]] = None,
                     rows: int = MIN_ROWS) -> tuple[dict[str, list[Example]], dict[str, int]]:
    """Check the groups; return ``({group: [Example]}, {group: available})`` in the given order.

    Refused (:class:`GalleryError`): no group, a group name that is not a
    nonempty line, a source twice in one group, ``eligible`` below the
    examples given, and a group given fewer than ``min(rows, eligible)``
    examples (a gallery never shows fewer examples than it could).
    """
    if not isinstance(groups, Mapping) or not groups:
        raise GalleryError("a gallery needs a mapping of at least one group to its examples")
    eligible = dict(eligible or {})
    unknown = [g for g in eligible if g not in groups]
    if unknown:
        raise GalleryError(f"eligible names group {unknown[0]!r}, which is not in the gallery")
    out: dict[str, list[Example]] = {}
    available: dict[str, int] = {}
    for group, items in groups.items():
        if not isinstance(group, str) or not group.strip() or any(ord(c) < 32 for c in group) or len(group) > 64:
            raise GalleryError(f"group name {group!r}: a nonempty line of at most 64 characters")
        if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
            raise GalleryError(f"group {group!r}: its examples must be a sequence")
        examples = [_example(item, f"group {group!r} example {i}") for i, item in enumerate(items)]
        seen: dict[str, int] = {}
        for i, ex in enumerate(examples):
            if ex.source in seen:
                raise GalleryError(f"group {group!r}: source {ex.source!r} is given twice (examples {seen[ex.source]} "
                                   f"and {i}); a gallery shows distinct sources and never repeats one to fill a gap")
            seen[ex.source] = i
        count = eligible.get(group, len(examples))
        if isinstance(count, bool) or not isinstance(count, int) or count < len(examples):
            raise GalleryError(f"group {group!r}: eligible must be a count >= the {len(examples)} examples given, "
                               f"got {count!r}")
        if len(examples) < min(rows, count):
            raise GalleryError(f"group {group!r}: {len(examples)} examples given but {count} sources are eligible: "
                               f"give at least {min(rows, count)} (one per row)")
        out[group] = examples
        available[group] = count
    return out, available


def plan_gallery(groups: Mapping[str, Sequence[Example]], *, rows: int, cell: int,
                 min_width: int = 0) -> dict[str, Any]:
    """The pixel layout: one column per group on every page, ``rows`` examples down each column.

    Pages = the largest group's examples over ``rows`` (at least one page, so a
    gallery of empty groups still shows its columns). Returns ``{pages, width,
    height, columns, tiles}``; a tile is ``{group, column, source, score, coords,
    page, row, box}``.
    """
    names = list(groups)
    pages = max(1, max(-(-len(g) // rows) for g in groups.values()))
    row_h = cell + CAPTION_H + PAD
    column_w = column_width(cell)
    width = max(LABEL_W + len(names) * column_w + PAD, int(min_width))
    height = TITLE_H + HEADER_H + rows * row_h + PAD
    tiles = []
    for column, group in enumerate(names):
        x0 = LABEL_W + column * column_w + (column_w - cell) // 2
        for index, ex in enumerate(groups[group]):
            page, row = divmod(index, rows)
            y0 = TITLE_H + HEADER_H + row * row_h
            tiles.append({"group": group, "column": column, "source": ex.source, "score": ex.score,
                          "coords": list(ex.coords) if ex.coords is not None else None, "page": page + 1,
                          "row": row, "box": [x0, y0, x0 + cell, y0 + cell]})
    return {"pages": pages, "width": width, "height": height, "columns": names, "tiles": tiles}


def column_width(cell: int) -> int:
    """A group column's width in pixels: its tiles, or its header line when that is wider."""
    return max(cell + PAD, COLUMN_MIN)


def _caption(tile: dict, cell: int) -> str:
    score = f" {tile['score']:.3g}" if tile.get("score") is not None else ""
    return middle_cut(f"{tile['source']}{score}", column_width(cell) // 5)


def render_gallery(layout: dict[str, Any], groups: Mapping[str, Sequence[Example]], available: Mapping[str, int],
                   *, rows: int, cell: int, title: str) -> list[bytes]:
    """Each page as PNG bytes, drawn by the shared grid renderer."""
    pages = []
    by_source = {(g, ex.source): ex for g, items in groups.items() for ex in items}
    for page in range(1, layout["pages"] + 1):
        texts: list[tuple[float, float, str, dict]] = [
            (PAD, TITLE_H / 2, f"{title}   page {page}/{layout['pages']}", {"ha": "left", "weight": "bold"})]
        for column, group in enumerate(layout["columns"]):
            x = LABEL_W + column * column_width(cell) + column_width(cell) / 2
            texts.append((x, TITLE_H + 8, middle_cut(group, column_width(cell) // 6), {"ha": "center", "weight": "bold"}))
            texts.append((x, TITLE_H + 21, f"{available[group]} available", {"ha": "center"}))
        on_page = [t for t in layout["tiles"] if t["page"] == page]
        for row in range(1 + max((t["row"] for t in on_page), default=-1)):  # rows that hold an example
            y = TITLE_H + HEADER_H + row * (cell + CAPTION_H + PAD) + cell / 2
            texts.append((LABEL_W - PAD, y, f"#{(page - 1) * rows + row}", {"ha": "right"}))
        cells = []
        for tile in on_page:
            box = tuple(tile["box"])
            cells.append((box, batch_grid.to_image(batch_grid.as_numpy(by_source[tile["group"], tile["source"]].image))))
            texts.append(((box[0] + box[2]) / 2, box[3] + CAPTION_H / 2, _caption(tile, cell), {"ha": "center"}))
        pages.append(batch_grid.render_canvas(layout["width"], layout["height"], cell, cells, texts))
    return pages


def _cell(groups: Mapping[str, Sequence[Example]]) -> int:
    extent = 1
    for items in groups.values():
        for ex in items[:1]:
            extent = max(extent, *batch_grid.to_image(batch_grid.as_numpy(ex.image)).shape[:2])
    return int(min(MAX_CELL, max(MIN_CELL, extent)))


def gallery_measures(groups: Mapping[str, Sequence[Example]], available: Mapping[str, int], *,
                     distance: Optional[Callable[[Any, Any], float]] = None,
                     distance_name: Optional[str] = None) -> dict[str, Any]:
    """``{"overall": measures, "groups": {group: measures}}`` (``hygiene/qc_measures.py``).

    Overall: every tile's source over the sum of the groups' eligible sources.
    A declared ``distance`` compares the examples' images as given; the
    default compares their 16 x 16 thumbnails in pixel space.
    """
    import numpy as np

    def thumbs(items: Sequence[Example]):
        if distance is not None or not items:
            return None
        return np.stack([batch_grid.thumbnail(batch_grid.to_image(batch_grid.as_numpy(ex.image)),
                                              qc_measures.THUMBNAIL).ravel() for ex in items])

    def measure(items: Sequence[Example], eligible: int) -> dict[str, Any]:
        return qc_measures.figure_measures([ex.source for ex in items], eligible=eligible, thumbnails=thumbs(items),
                                           items=[ex.image for ex in items], distance=distance,
                                           distance_name=distance_name)

    every = [ex for items in groups.values() for ex in items]
    return {"overall": measure(every, sum(available.values())),
            "groups": {g: measure(items, available[g]) for g, items in groups.items()}}


def roster_check(roster: Mapping[str, Any], sources: Sequence[str]) -> dict[str, Any]:
    """The bound roster a gallery was drawn from, and the sources it shows from outside that roster.

    With a roster bound by its digest alone the members are not known here:
    ``outside_roster`` is then ``None`` (not checked), never an empty list.
    """
    members = roster.get("members")
    known = set(members) if isinstance(members, list) else None
    outside = None if known is None else sorted({s for s in sources if s not in known})
    return {"name": roster.get("name"), "digest": roster.get("digest"), "outside_roster": outside}


def save_gallery(run_dir: Path, groups: Mapping[str, Sequence[Any]], *, step: int, name: str = "gallery",
                 rows: int = MIN_ROWS, eligible: Optional[Mapping[str, int]] = None,
                 distance: Optional[Callable[[Any, Any], float]] = None, distance_name: Optional[str] = None,
                 selection: Optional[str] = None, roster: Optional[Mapping[str, Any]] = None) -> Path:
    """Render a grouped exemplar gallery under ``run_dir/qc/gallery/<name>/``; return the sidecar's path.

    ``groups``: ``{group: [example, …]}`` in column order; an example is
    ``{"source": id, "image": array, "score": float?, "coords": [numbers]?}`` or
    ``(source, image[, score])``. ``rows`` (>= 16) examples per column and page.
    ``eligible``: a group's eligible source count when more exist than are
    given (shown as "n available"; default: the examples given). ``selection``
    records how the examples were chosen. ``roster``: the run's bound QC
    roster (``hygiene.qc.roster`` of the manifest); the sidecar then names it
    and lists the sources shown that are not among its members. Refusals:
    :class:`GalleryError`.
    """
    if not isinstance(name, str) or not batch_grid.NAME_RE.fullmatch(name):
        raise GalleryError(f"gallery name {name!r}: use letters, digits, '_', '.', '-' (at most 64)")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < MIN_ROWS:
        raise GalleryError(f"rows must be an integer >= {MIN_ROWS} (seed 004: at least 16 examples per group), "
                           f"got {rows!r}")
    examples, available = normalize_groups(groups, eligible, rows)
    cell = _cell(examples)
    shown = sum(len(v) for v in examples.values())
    title = f"{name} · step {step} · {len(examples)} groups · {shown} examples"
    layout = plan_gallery(examples, rows=rows, cell=cell, min_width=PAD + 6 * (len(title) + 14))
    measures = gallery_measures(examples, available, distance=distance, distance_name=distance_name)
    pngs = render_gallery(layout, examples, available, rows=rows, cell=cell, title=title)
    folder = RunDir(run_dir).gallery / name
    folder.mkdir(parents=True, exist_ok=True)
    stem = batch_grid.free_stem(folder, step)
    files = []
    for page, data in enumerate(pngs, start=1):
        file = folder / (f"{stem}.png" if layout["pages"] == 1 else f"{stem}-p{page}of{layout['pages']}.png")
        atomic.atomic_write_bytes(file, data, exclusive=True)
        files.append(file.relative_to(run_dir).as_posix())
    sidecar = {
        "renderer": RENDERER,
        "name": name,
        "step": int(step),
        "created": time.time(),
        "selection": selection,
        "rows": rows,
        "cell": cell,
        "pages": layout["pages"],
        "width": layout["width"],
        "height": layout["height"],
        "files": files,
        "groups": [{"name": g, "column": i, "available": available[g], "shown": len(examples[g])}
                   for i, g in enumerate(examples)],
        "tiles": layout["tiles"],
        "measures": measures,
    }
    if isinstance(roster, Mapping):
        sidecar["roster"] = roster_check(roster, [t["source"] for t in layout["tiles"]])
    path = folder / f"{stem}.json"
    atomic.atomic_write_json(path, sidecar, exclusive=True)  # last: its presence means every page is complete
    return path


def list_galleries(run_dir: Path) -> list[dict]:
    """Every saved gallery's sidecar under a run directory, oldest step first (unreadable ones skipped)."""
    from traceml_tui.core.jsonsafe import loads_bounded

    out = []
    for path in RunDir(run_dir).gallery_files():
        try:
            meta = loads_bounded(path.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict):
            meta["sidecar_file"] = path.relative_to(run_dir).as_posix()
            out.append(meta)
    return sorted(out, key=lambda m: (m.get("step", 0) if isinstance(m.get("step"), int) else 0,
                                      m.get("sidecar_file", "")))
