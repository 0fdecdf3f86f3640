"""The input batch grid (seed 004): one image of one complete batch.

Every batch member is a row and every consumed input (view, context/reference
input, augmentation) is a column labelled by its role, so one image shows the
whole batch the model saw. Up to 64 members fit one image: past 16 rows the
members continue in blocks side by side (each with its role headers and member
labels) with smaller tiles; only larger batches are paged (64 members per page)
and nothing is dropped. Every experiment uses this one renderer.

Layout is pure (:func:`plan_grid`); rendering composes a pixel canvas with
numpy and writes it through matplotlib (Agg) so tile boxes in the layout are
exact PNG pixel coordinates. Files are immutable per QC step::

    qc/batch_grid/<name>/step-00000120.json           layout + batch identity
    qc/batch_grid/<name>/step-00000120-p1of2.png      one file per page (a batch over 64 members)

A second grid at the same step (a resume) gets ``step-00000120-2``; nothing is
overwritten. Accepts numpy arrays and CPU (or GPU) tensors; no torchvision.
"""

from __future__ import annotations

import hashlib
import io
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from traceml_tui.core import atomic
from traceml_tui.core.rundir import BATCH_GRID, RunDir

RENDERER = "traceml.batch_grid/1"
GRID_DIR = BATCH_GRID  # relative to the run directory
MEMBERS_PER_PAGE = 64  # one image holds a whole batch up to this size (seed 004: one image of one batch)
ROWS_PER_PAGE = MEMBERS_PER_PAGE  # the name save_batch_grid's rows_per_page keeps
ROWS_PER_BLOCK = 16  # member rows before the next block starts beside them
MIN_CELL, MAX_CELL = 48, 160
BLOCK_CELL = 64  # largest tile of a page with several blocks: 64 members stay one readable image
PAD = 4
TITLE_H, HEADER_H, LABEL_W = 22, 20, 44
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # fullmatch: "$" would accept a trailing newline


class BatchGridError(ValueError):
    """A batch that cannot be shown as a grid; ``str()`` names what is wrong."""


@dataclass(frozen=True)
class Tile:
    page: int  # 1-based
    member: int  # index of the batch member
    role: str
    label: str
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 of the tile's cell in the page PNG (pixels)
    shape: tuple[int, ...]  # the member's input shape for this role, as given


@dataclass
class GridLayout:
    name: str
    roles: list[str]
    members: int
    pages: int
    rows_per_page: int  # members per page
    cell: int
    width: int
    height: int
    rows_per_block: int = ROWS_PER_BLOCK
    blocks: int = 1  # blocks of member rows side by side on a page
    block_width: int = 0
    tiles: list[Tile] = field(default_factory=list)


# --------------------------------------------------------------------------- batch → roles


def as_numpy(value: Any):
    import numpy as np

    if hasattr(value, "detach"):  # torch tensor, without importing torch
        value = value.detach()
        if getattr(value, "dtype", None) is not None and "bfloat16" in str(value.dtype):
            value = value.float()
        value = value.cpu().numpy()
    return np.asarray(value)


def split_roles(batch: Any, roles: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Normalize a batch into ``{role: array of shape (B, ...)}``.

    * a mapping ``{role: (B, ...)}`` — its keys are the roles (``roles`` may
      select and order them);
    * a list/tuple of arrays — one per role, named by ``roles``
      (default ``input0, input1, …``);
    * one array — ``(B, ...)`` is a single role (``roles=["image"]`` or
      default ``input``); with ``roles`` of length V > 1 the array must be
      ``(B, V, ...)`` and dimension 1 holds the views.

    Every role must have the same batch size.
    """
    if isinstance(batch, dict):
        keys = list(roles) if roles is not None else [str(k) for k in batch]
        missing = [k for k in keys if k not in batch]
        if missing:
            raise BatchGridError(f"roles not in the batch: {', '.join(missing)}")
        out = {str(k): as_numpy(batch[k]) for k in keys}
    elif isinstance(batch, (list, tuple)):
        names = list(roles) if roles is not None else [f"input{i}" for i in range(len(batch))]
        if len(names) != len(batch):
            raise BatchGridError(f"{len(names)} roles for {len(batch)} batch inputs")
        out = {str(n): as_numpy(x) for n, x in zip(names, batch)}
    else:
        array = as_numpy(batch)
        names = list(roles) if roles is not None else ["input"]
        if len(names) == 1:
            out = {str(names[0]): array}
        else:
            if array.ndim < 2 or array.shape[1] != len(names):
                raise BatchGridError(
                    f"{len(names)} roles need an array of shape (B, {len(names)}, ...), got {tuple(array.shape)}"
                )
            out = {str(n): array[:, i] for i, n in enumerate(names)}
    if not out:
        raise BatchGridError("the batch has no inputs")
    if len(set(out)) != len(out):
        raise BatchGridError("role names must be distinct")
    sizes = {name: (a.shape[0] if a.ndim else 0) for name, a in out.items()}
    if len(set(sizes.values())) != 1:
        raise BatchGridError("roles differ in batch size: " + ", ".join(f"{k}={v}" for k, v in sizes.items()))
    if next(iter(sizes.values())) == 0:
        raise BatchGridError("the batch is empty")
    return out


def batch_digest(inputs: dict[str, Any]) -> str:
    """Content digest of a batch (roles, shapes, bytes): identifies the fixed QC batch."""
    h = hashlib.sha256()
    for name, array in inputs.items():
        h.update(name.encode())
        h.update(repr((array.shape, str(array.dtype))).encode())
        h.update(array.tobytes())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- layout


def plan_grid(name: str, roles: Sequence[str], members: int, shapes: dict[str, tuple[int, ...]],
              *, cell: int, rows_per_page: int = ROWS_PER_PAGE, rows_per_block: int = ROWS_PER_BLOCK,
              min_width: int = 0) -> GridLayout:
    """Pixel layout of the grid: members down the rows, roles across the columns, paged.

    ``rows_per_page`` members share one page; past ``rows_per_block`` rows they
    continue in another block to the right (its own role headers and member
    labels). ``min_width`` leaves room for the title line of a narrow grid.
    """
    per_page = max(1, int(rows_per_page))
    per_block = max(1, min(int(rows_per_block), per_page))
    pages = -(-members // per_page)
    on_page = min(members, per_page)
    blocks = max(1, -(-on_page // per_block))
    cols = len(roles)
    block_width = LABEL_W + cols * (cell + PAD) + PAD
    width = max(blocks * block_width, int(min_width))
    height = TITLE_H + HEADER_H + min(on_page, per_block) * (cell + PAD) + PAD
    layout = GridLayout(name=name, roles=list(roles), members=members, pages=pages, rows_per_page=per_page,
                        cell=cell, width=width, height=height, rows_per_block=per_block, blocks=blocks,
                        block_width=block_width)
    for member in range(members):
        page, index = divmod(member, per_page)
        block, row = divmod(index, per_block)
        y0 = TITLE_H + HEADER_H + row * (cell + PAD)
        for col, role in enumerate(roles):
            x0 = block * block_width + LABEL_W + col * (cell + PAD)
            shape = tuple(int(s) for s in shapes[role][1:])
            layout.tiles.append(Tile(page=page + 1, member=member, role=role, label=f"#{member} {role}",
                                     box=(x0, y0, x0 + cell, y0 + cell), shape=shape))
    return layout


# --------------------------------------------------------------------------- pixels


def to_image(item: Any):
    """One member's input for one role as an RGB float image in [0, 1] (H, W, 3).

    (H, W) grey; (C, H, W) with C in 1/3/4 or (H, W, C) channels-last; other
    channel counts show the first channel; (D, H, W…) volumes show the middle
    slice; a 1-D signal is drawn as a strip. Integer images are read as
    0..255; float images already in [0, 1] are shown as they are, others are
    min-max scaled per tile (the label does not pretend to physical units).
    """
    import numpy as np

    a = np.asarray(item)
    if a.dtype == bool:
        a = a.astype(np.float64)
    integer = np.issubdtype(a.dtype, np.integer)
    a = a.astype(np.float64)
    if a.ndim == 0:
        a = a.reshape(1, 1)
    if a.ndim == 1:
        return _signal_image(a)
    while a.ndim > 3:  # volumes and stacks: the middle slice of the leading axis
        a = a[a.shape[0] // 2]
    if a.ndim == 3:
        if a.shape[0] in (1, 3, 4):  # channels-first, the torch convention, wins when ambiguous
            a = np.moveaxis(a, 0, -1)
        elif a.shape[-1] not in (1, 3, 4):
            a = a[0][..., None]  # many channels (e.g. features): the first one
        if a.shape[-1] == 4:
            a = a[..., :3]
        if a.shape[-1] == 1:
            a = np.repeat(a, 3, axis=-1)
    else:
        a = np.repeat(a[..., None], 3, axis=-1)
    finite = np.isfinite(a)
    a = np.where(finite, a, 0.0)
    if integer:
        a = a / 255.0
    elif finite.any():
        lo, hi = float(a[finite].min()), float(a[finite].max())
        if lo < 0.0 or hi > 1.0:
            a = (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)
    return np.clip(a, 0.0, 1.0)


def _signal_image(values):
    """A 1-D input (a signal, a context vector) drawn as a dark trace on white."""
    import numpy as np

    n = max(1, values.size)
    rows = int(min(64, max(16, n // 2)))
    img = np.ones((rows, n, 3))
    finite = np.isfinite(values)
    if not finite.any():
        return img
    lo, hi = float(values[finite].min()), float(values[finite].max())
    ys = np.where(finite, values, lo)
    ys = ((hi - ys) / (hi - lo) * (rows - 1)).astype(int) if hi > lo else np.full(n, rows // 2)
    prev = ys[0]
    for x, y in enumerate(ys):  # connect consecutive samples so the trace reads as a line
        a, b = sorted((prev, y))
        img[a:b + 1, x] = 0.1
        prev = y
    return img


def _fit(img, cell: int):
    """Nearest-neighbour resize into a cell x cell square, aspect ratio preserved, centred on grey."""
    import numpy as np

    h, w = img.shape[:2]
    scale = cell / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    rows = np.minimum((np.arange(nh) / scale).astype(int), h - 1)
    cols = np.minimum((np.arange(nw) / scale).astype(int), w - 1)
    out = np.full((cell, cell, 3), 0.85)
    y0, x0 = (cell - nh) // 2, (cell - nw) // 2
    out[y0:y0 + nh, x0:x0 + nw] = img[rows][:, cols]
    return out


def choose_cell(inputs: dict[str, Any]) -> int:
    """Cell size in pixels: the largest input extent, kept between MIN_CELL and MAX_CELL."""
    extent = 1
    for array in inputs.values():
        sample = to_image(array[0])
        extent = max(extent, *sample.shape[:2])
    return int(min(MAX_CELL, max(MIN_CELL, extent)))


def thumbnail(img, side: int):
    """A small square view of one tile image (letterboxed like the tiles): what the pixel-space measures compare."""
    return _fit(img, side)


def render_canvas(width: int, height: int, cell: int, tiles: Sequence[tuple[tuple[int, int, int, int], Any]],
                  texts: Sequence[tuple[float, float, str, dict]]) -> bytes:
    """The shared grid renderer: tiles and labels on one white page, as PNG bytes (matplotlib Agg).

    ``tiles``: ``(box, image)`` with ``box = (x0, y0, x1, y1)`` in page pixels and
    ``image`` from :func:`to_image` (fitted into the ``cell`` square, aspect kept);
    ``texts``: ``(x, y, text, matplotlib text options)`` at pixel positions, 7 pt.
    The batch grid and the exemplar galleries (``gallery.py``) both draw through it.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import numpy as np
    from matplotlib.figure import Figure

    dpi = 100
    canvas = np.ones((height, width, 3))
    for (x0, y0, _x1, _y1), img in tiles:
        canvas[y0:y0 + cell, x0:x0 + cell] = _fit(img, cell)
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    fig.figimage(canvas, xo=0, yo=0, origin="upper")
    for x, y, s, kw in texts:
        fig.text(x / width, 1.0 - y / height, s, fontsize=7, va="center", **kw)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def render_pages(layout: GridLayout, inputs: dict[str, Any], *, title: str) -> list[bytes]:
    """Render each page of the grid as PNG bytes (through :func:`render_canvas`; no display)."""
    pages: list[bytes] = []
    for page in range(1, layout.pages + 1):
        tiles = [t for t in layout.tiles if t.page == page]
        texts: list[tuple[float, float, str, dict]] = [
            (PAD, TITLE_H / 2, f"{title}   page {page}/{layout.pages}", {"ha": "left", "weight": "bold"})]
        blocks_here = -(-len({t.member for t in tiles}) // layout.rows_per_block)
        for block in range(blocks_here):
            for col, role in enumerate(layout.roles):
                texts.append((block * layout.block_width + LABEL_W + col * (layout.cell + PAD) + layout.cell / 2,
                              TITLE_H + HEADER_H / 2, role, {"ha": "center"}))
        for t in tiles:
            if t.role == layout.roles[0]:
                texts.append((t.box[0] - PAD, (t.box[1] + t.box[3]) / 2, f"#{t.member}", {"ha": "right"}))
        cells = [(t.box, to_image(inputs[t.role][t.member])) for t in tiles]
        pages.append(render_canvas(layout.width, layout.height, layout.cell, cells, texts))
    return pages


# --------------------------------------------------------------------------- files


def free_stem(folder: Path, step: int) -> str:
    stem = f"step-{step:08d}"
    serial = 1
    while (folder / f"{stem if serial == 1 else f'{stem}-{serial}'}.json").exists():
        serial += 1
    return stem if serial == 1 else f"{stem}-{serial}"


def member_sources(inputs: dict[str, Any]) -> list[str]:
    """A content identity per batch member (all its roles' bytes): the source id when none is given."""
    out = []
    for member in range(next(iter(inputs.values())).shape[0]):
        h = hashlib.sha256()
        for array in inputs.values():
            h.update(array[member].tobytes())
        out.append("content:" + h.hexdigest()[:16])
    return out


def grid_measures(inputs: dict[str, Any], *, sources: Optional[Sequence[Any]] = None,
                  eligible: Optional[int] = None, distance: Any = None) -> dict[str, Any]:
    """The health measures of one batch grid (``hygiene/qc_measures.py``), one example per member.

    ``sources``: the members' source ids (default: their content, so a member
    repeated in the batch counts once); ``eligible``: how many sources the QC
    batch draws from (default: the batch size). A declared ``distance`` compares
    members as ``{role: array}``; the default compares their thumbnails.
    """
    import numpy as np

    from traceml_tui.hygiene import qc_measures

    members = next(iter(inputs.values())).shape[0]
    if sources is None:
        ids = member_sources(inputs)
    else:
        ids = [str(s) for s in sources]
        if len(ids) != members:
            raise BatchGridError(f"{len(ids)} source ids for {members} batch members")
    if eligible is not None and (isinstance(eligible, bool) or not isinstance(eligible, int) or eligible < 0):
        raise BatchGridError(f"eligible must be a count >= 0, got {eligible!r}")
    total = members if eligible is None else eligible
    if total < len(set(ids)):
        raise BatchGridError(f"eligible={total} is below the {len(set(ids))} distinct sources in the batch")
    thumbs = None
    items = None
    if distance is None:
        thumbs = np.stack([np.concatenate([thumbnail(to_image(a[m]), qc_measures.THUMBNAIL).ravel()
                                           for a in inputs.values()]) for m in range(members)])
    else:
        items = [{role: a[m] for role, a in inputs.items()} for m in range(members)]
    return qc_measures.figure_measures(ids, eligible=total, thumbnails=thumbs, items=items, distance=distance)


def save_batch_grid(run_dir: Path, batch: Any, *, step: int, name: str = "inputs",
                    roles: Optional[Sequence[str]] = None, batch_id: Optional[str] = None,
                    rows_per_page: int = ROWS_PER_PAGE, sources: Optional[Sequence[Any]] = None,
                    eligible: Optional[int] = None, distance: Any = None) -> Path:
    """Render one complete batch and save it under ``run_dir/qc/batch_grid/<name>/``.

    Returns the path of the layout JSON (which lists the page PNGs, relative
    to the run directory). ``batch_id`` names the fixed QC batch (default: the
    grid name); the content digest is recorded too, so a batch that changes
    between QC points is visible. The JSON also holds the grid's health
    ``measures`` (:func:`grid_measures`, given ``sources``, ``eligible`` and
    ``distance``).
    """
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise BatchGridError(f"grid name {name!r}: use letters, digits, '_', '.', '-' (at most 64)")
    inputs = split_roles(batch, roles)
    members = next(iter(inputs.values())).shape[0]
    measures = grid_measures(inputs, sources=sources, eligible=eligible, distance=distance)
    ident = batch_id or name
    title = f"{name} · step {step} · batch {ident} · {members} members"
    cell = choose_cell(inputs)
    if min(members, rows_per_page) > ROWS_PER_BLOCK:
        cell = min(cell, BLOCK_CELL)  # several blocks side by side: smaller tiles, the same 7 pt labels
    layout = plan_grid(name, list(inputs), members, {k: tuple(v.shape) for k, v in inputs.items()},
                       cell=cell, rows_per_page=rows_per_page,
                       min_width=PAD + 6 * (len(title) + 14))  # ~6 px per character at 7 pt, + " page n/m"
    digest = batch_digest(inputs)
    pngs = render_pages(layout, inputs, title=title)
    folder = RunDir(run_dir).batch_grid / name
    folder.mkdir(parents=True, exist_ok=True)
    stem = free_stem(folder, step)
    files = []
    for page, data in enumerate(pngs, start=1):
        file = folder / (f"{stem}.png" if layout.pages == 1 else f"{stem}-p{page}of{layout.pages}.png")
        atomic.atomic_write_bytes(file, data, exclusive=True)
        files.append(file.relative_to(run_dir).as_posix())
    meta = {
        "renderer": RENDERER,
        "name": name,
        "step": int(step),
        "batch_id": ident,
        "batch_digest": digest,
        "created": time.time(),
        "files": files,
        "measures": measures,
        **{k: v for k, v in asdict(layout).items() if k != "name"},
    }
    meta_path = folder / f"{stem}.json"
    # the layout JSON is written last: its presence means every page is complete
    atomic.atomic_write_json(meta_path, meta, exclusive=True)
    return meta_path


def list_grids(run_dir: Path) -> list[dict]:
    """Every saved grid's layout JSON under a run directory, oldest step first."""
    from traceml_tui.core.jsonsafe import loads_bounded

    out = []
    for path in RunDir(run_dir).grid_files():
        try:
            meta = loads_bounded(path.read_bytes())
        except (OSError, ValueError):  # ValueError includes JSON nested deeper than jsonsafe.MAX_DEPTH
            continue
        if isinstance(meta, dict):
            meta["layout_file"] = path.relative_to(run_dir).as_posix()
            out.append(meta)
    return sorted(out, key=lambda m: (m.get("step", 0), m.get("layout_file", "")))
