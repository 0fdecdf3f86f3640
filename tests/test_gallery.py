"""Exemplar galleries (hygiene/gallery.py, docs/qc.md "Exemplar galleries"), on real renders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from traceml_tui.hygiene import gallery
from traceml_tui.hygiene.gallery import GalleryError, save_gallery


def _examples(prefix: str, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    # each source a distinct picture: noise on a per-source brightness, so no tile is blank
    return [{"source": f"{prefix}-{i:03d}", "image": 0.2 + 0.6 * rng.random((3, 24, 20)), "score": i / 10,
             "coords": [i, 2 * i]} for i in range(n)]


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        img.verify()  # a valid PNG
    with Image.open(path) as img:
        assert img.format == "PNG"
        return np.asarray(img.convert("RGB"), dtype=np.int16)


def test_three_groups_of_40_16_and_0_sources(tmp_path: Path) -> None:
    groups = {"high": _examples("h", 40, 1), "mid": _examples("m", 16, 2), "none": []}
    sidecar_path = save_gallery(tmp_path, groups, step=7, name="attention", selection="top score per stratum")
    meta = json.loads(sidecar_path.read_text())
    assert sidecar_path == tmp_path / "qc/gallery/attention/step-00000007.json"

    # paging covers all 40 with 16 rows per page: 3 pages, and every page shows the 3 columns
    assert meta["pages"] == 3 and meta["rows"] == 16
    assert meta["files"] == [f"qc/gallery/attention/step-00000007-p{k}of3.png" for k in (1, 2, 3)]
    assert [(g["name"], g["column"], g["available"], g["shown"]) for g in meta["groups"]] == [
        ("high", 0, 40, 40), ("mid", 1, 16, 16), ("none", 2, 0, 0)]
    tiles = meta["tiles"]
    assert len(tiles) == 56
    sources = [t["source"] for t in tiles]
    assert len(set(sources)) == len(sources)  # no source repeated
    assert sorted(t["source"] for t in tiles if t["group"] == "high") == [f"h-{i:03d}" for i in range(40)]
    by_page = {p: [t for t in tiles if t["page"] == p and t["group"] == "high"] for p in (1, 2, 3)}
    assert [len(by_page[p]) for p in (1, 2, 3)] == [16, 16, 8]
    assert all(0 <= t["row"] < 16 for t in tiles)
    assert {t["page"] for t in tiles if t["group"] == "mid"} == {1}
    first = next(t for t in tiles if t["source"] == "h-003")
    assert first["score"] == pytest.approx(0.3) and first["coords"] == [3.0, 6.0] and first["column"] == 0
    assert meta["selection"] == "top score per stratum"

    # measures beside the figure: overall and per group; the empty group has no coverage (not 0)
    measures = meta["measures"]
    assert measures["overall"]["coverage"] == {"distinct": 56, "eligible": 56, "value": 1.0}
    assert measures["overall"]["concentration"]["gini"] == pytest.approx(0.0)
    assert 0.0 < measures["overall"]["diversity"]["value"] <= 1.0
    assert measures["groups"]["none"]["coverage"]["value"] is None
    assert measures["groups"]["mid"]["coverage"]["value"] == 1.0

    # the real renders: valid PNGs of the recorded size; a tile box holds its picture; the empty column is
    # blank below its header on every page, and every column (the empty one too) has its header on every page
    cell = meta["cell"]
    column_x = {}
    for tile in tiles:
        column_x.setdefault(tile["column"], tile["box"][0])
    empty_x0 = column_x[1] + gallery.column_width(cell)  # the third column, beside the second
    for page, rel in enumerate(meta["files"], start=1):
        px = _pixels(tmp_path / rel)
        assert px.shape == (meta["height"], meta["width"], 3)
        for tile in (t for t in tiles if t["page"] == page):
            x0, y0, x1, y1 = tile["box"]
            assert px[y0:y1, x0:x1].std() > 5, f"tile {tile['source']} is blank"
        body = px[gallery.TITLE_H + gallery.HEADER_H:, empty_x0:empty_x0 + cell]
        assert (body == 255).all(), "the empty column holds no tile"
        for column in range(3):
            x = gallery.LABEL_W + column * gallery.column_width(cell)
            header = px[gallery.TITLE_H:gallery.TITLE_H + gallery.HEADER_H, x:x + gallery.column_width(cell)]
            assert (header < 128).any(), f"page {page}: column {column} has no header"


def test_duplicates_short_groups_and_too_few_rows_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    dup = _examples("d", 16, 3)
    dup[9] = dict(dup[9], source="d-002")
    cases = [
        ({"g": dup}, {}, "source 'd-002' is given twice"),
        ({"g": _examples("s", 5, 4)}, {"eligible": {"g": 40}}, "give at least 16"),
        ({"g": _examples("s", 16, 4)}, {"rows": 8}, "rows must be an integer >= 16"),
        ({"g": _examples("s", 16, 4)}, {"eligible": {"g": 3}}, "eligible must be a count"),
        ({"g": _examples("s", 16, 4)}, {"eligible": {"other": 3}}, "not in the gallery"),
        ({}, {}, "at least one group"),
        ({"g": [("s-1", None)]}, {}, "no image"),
        ({"g": [{"source": "x", "image": np.zeros((4, 4)), "label": 1}]}, {}, "unknown key 'label'"),
        ({"g": [("x", np.zeros((4, 4)), np.array([0.1, 0.2]))]}, {}, "score must be a number"),
        ({"g": [{"source": "x", "image": np.zeros((4, 4)), "coords": [1.0, float("nan")]}]}, {}, "must be finite"),
    ]
    for groups, extra, said in cases:
        with pytest.raises(GalleryError, match=said):
            save_gallery(tmp_path, groups, step=0, name="g", **extra)
    assert not (tmp_path / "qc").exists()


def test_fewer_than_16_eligible_show_them_all_and_a_repeat_at_one_step_never_overwrites(tmp_path: Path) -> None:
    groups = {"rare": [(f"r{i}", np.full((8, 8), i / 10.0), i) for i in range(5)], "common": _examples("c", 20, 5)}
    first = save_gallery(tmp_path, groups, step=3, name="g", eligible={"common": 100})
    again = save_gallery(tmp_path, groups, step=3, name="g", eligible={"common": 100})
    assert first.name == "step-00000003.json" and again.name == "step-00000003-2.json"
    meta = json.loads(first.read_text())
    assert meta["pages"] == 2 and [g["available"] for g in meta["groups"]] == [5, 100]
    assert meta["measures"]["groups"]["common"]["coverage"]["value"] == pytest.approx(20 / 100)
    assert meta["measures"]["overall"]["coverage"] == {"distinct": 25, "eligible": 105, "value": pytest.approx(25 / 105)}
    assert "roster" not in meta  # no bound roster: nothing to check against
    assert gallery.roster_check({"name": "r", "digest": "sha256:x", "size": 9}, ["a"]) == {
        "name": "r", "digest": "sha256:x", "outside_roster": None}  # members unknown: not checked, not "none"
    assert gallery.roster_check({"name": "r", "members": ["a", "b"]}, ["b", "c", "a", "d"])["outside_roster"] == [
        "c", "d"]
    assert [m["sidecar_file"] for m in gallery.list_galleries(tmp_path)] == [
        "qc/gallery/g/step-00000003-2.json", "qc/gallery/g/step-00000003.json"]


SCRIPT = """
import numpy as np
import traceml_tui as traceml
traceml.init()
groups = {"a": [(f"a{i}", np.random.default_rng(i).random((6, 6))) for i in range(16)], "b": []}
print(traceml.log_gallery(groups, name="q", step=0) is not None)   # the first QC point: recorded
print(traceml.log_gallery(groups, name="q", step=3) is not None)   # off the declared cadence of 2: not
print(traceml.log_gallery(groups, name="q", step=4) is not None)   # on it: recorded
try:
    traceml.log_gallery({"a": [("x", np.zeros((2, 2))), ("x", np.ones((2, 2)))]}, name="dup", step=0)
except ValueError as exc:
    print("refused:", exc)
"""


def test_the_sdk_call_follows_the_declared_qc_cadence(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"run_name": "run", "hygiene": {"qc": {"cadence": 2}}}))
    script = tmp_path / "g.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TRACEML_RUN_DIR=str(run_dir), TRACEML_RUN_NAME="run")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:3] == ["True", "False", "True"]
    assert lines[3].startswith("refused: group 'a': source 'x' is given twice")
    saved = sorted(p.name for p in (run_dir / "qc/gallery/q").iterdir())
    assert saved == ["step-00000000.json", "step-00000000.png", "step-00000004.json", "step-00000004.png"]
    assert not (run_dir / "qc/gallery/dup").exists()
