"""The input batch grid: every member and every role, labelled, paged, immutable per QC step."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from traceml_tui.hygiene import batch_grid


def _read_png(path: Path) -> np.ndarray:
    import matplotlib.image as mpimg

    return mpimg.imread(str(path))  # floats in [0, 1], shape (H, W, 3 or 4)


def test_eight_members_with_two_views_make_sixteen_labelled_tiles_with_their_own_pixels(tmp_path: Path):
    # member i, view v is a constant grey level unique to the tile; values in [0, 1] are shown as they are
    levels = np.array([[0.05 + 0.055 * (2 * i + v) for v in range(2)] for i in range(8)])
    batch = np.ones((8, 2, 1, 24, 32)) * levels[:, :, None, None, None]
    meta_path = batch_grid.save_batch_grid(tmp_path, batch, step=0, name="inputs", roles=["view_a", "view_b"],
                                           batch_id="qc-val-0")
    meta = json.loads(meta_path.read_text())
    assert meta_path == tmp_path / "qc/batch_grid/inputs/step-00000000.json"
    assert meta["batch_id"] == "qc-val-0" and len(meta["batch_digest"]) == 16
    assert meta["roles"] == ["view_a", "view_b"] and meta["members"] == 8 and meta["pages"] == 1
    tiles = meta["tiles"]
    assert len(tiles) == 16
    assert {(t["member"], t["role"]) for t in tiles} == {(i, r) for i in range(8) for r in ("view_a", "view_b")}
    assert all(t["label"] == f"#{t['member']} {t['role']}" for t in tiles)
    assert all(t["shape"] == [1, 24, 32] for t in tiles)

    png = tmp_path / meta["files"][0]
    assert meta["files"] == ["qc/batch_grid/inputs/step-00000000.png"]
    image = _read_png(png)
    assert image.shape[:2] == (meta["height"], meta["width"])
    for t in tiles:
        x0, y0, x1, y1 = t["box"]
        assert 0 <= x0 < x1 <= meta["width"] and 0 <= y0 < y1 <= meta["height"]
        # the tile's centre shows its own member/view (aspect kept: 24x32 is letterboxed, centre is image)
        centre = image[(y0 + y1) // 2, (x0 + x1) // 2, :3]
        expected = levels[t["member"], 0 if t["role"] == "view_a" else 1]
        assert centre == pytest.approx([expected] * 3, abs=1.5 / 255)
    # the title and label margins carry ink (role headers / member labels are drawn)
    assert image[: tiles[0]["box"][1], :, :3].min() < 0.5
    assert image[:, : tiles[0]["box"][0], :3].min() < 0.5


def test_a_batch_of_one_and_a_batch_of_a_hundred_paged_with_nothing_dropped(tmp_path: Path):
    one = batch_grid.save_batch_grid(tmp_path, np.random.rand(1, 3, 16, 16), step=5, name="single")
    meta = json.loads(one.read_text())
    assert len(meta["tiles"]) == 1 and meta["pages"] == 1 and (tmp_path / meta["files"][0]).stat().st_size > 0

    rng = np.random.default_rng(1)
    batch = {"image": rng.integers(0, 255, size=(100, 28, 28, 3), dtype=np.uint8),
             "mask": rng.integers(0, 2, size=(100, 28, 28)).astype(bool),
             "context": rng.normal(size=(100, 64))}  # a 1-D context signal per member
    meta = json.loads(batch_grid.save_batch_grid(tmp_path, batch, step=5, name="big").read_text())
    assert meta["pages"] == 2 and len(meta["files"]) == 2  # 64 members per image, paged beyond
    assert meta["files"][0].endswith("step-00000005-p1of2.png")
    assert len(meta["tiles"]) == 300
    assert {t["member"] for t in meta["tiles"]} == set(range(100))
    assert [sum(1 for t in meta["tiles"] if t["page"] == p) for p in range(1, 3)] == [64 * 3, 36 * 3]
    last = _read_png(tmp_path / meta["files"][-1])
    assert last.shape[:2] == (meta["height"], meta["width"])


@pytest.mark.parametrize("members", [20, 64])
def test_a_batch_of_up_to_64_members_is_one_image_with_every_tile_inside_and_apart(tmp_path: Path, members: int):
    """Seed 004: one image of one complete batch; past 16 rows the members continue in blocks side by side."""
    levels = (np.arange(members * 2) % 200 + 30) / 255.0  # a grey level per tile, all distinct within a block
    batch = np.ones((members, 2, 24, 24)) * levels.reshape(members, 2)[:, :, None, None]
    meta = json.loads(batch_grid.save_batch_grid(tmp_path, batch, step=3, name="b", roles=["view", "aug"]).read_text())
    assert meta["pages"] == 1 and meta["files"] == ["qc/batch_grid/b/step-00000003.png"]
    assert meta["blocks"] == -(-members // 16) and meta["cell"] <= batch_grid.BLOCK_CELL
    image = _read_png(tmp_path / meta["files"][0])
    assert image.shape[:2] == (meta["height"], meta["width"])
    boxes = [t["box"] for t in meta["tiles"]]
    assert len(boxes) == members * 2 and len(set(map(tuple, boxes))) == len(boxes)
    for t in meta["tiles"]:
        x0, y0, x1, y1 = t["box"]
        assert 0 <= x0 < x1 <= meta["width"] and 0 <= y0 < y1 <= meta["height"]
        expected = levels[t["member"] * 2 + (0 if t["role"] == "view" else 1)]
        assert image[(y0 + y1) // 2, (x0 + x1) // 2, :3] == pytest.approx([expected] * 3, abs=1.5 / 255)
    for t in meta["tiles"]:  # every block has ink left of its first column: the member labels
        if t["role"] == "view":
            x0, y0, _, y1 = t["box"]
            assert image[y0:y1, max(0, x0 - batch_grid.LABEL_W + batch_grid.PAD):x0, :3].min() < 0.5, t["member"]


def test_grids_are_immutable_per_qc_step(tmp_path: Path):
    first = batch_grid.save_batch_grid(tmp_path, np.zeros((2, 8, 8)), step=10)
    before = (tmp_path / json.loads(first.read_text())["files"][0]).read_bytes()
    again = batch_grid.save_batch_grid(tmp_path, np.ones((2, 8, 8)), step=10)  # e.g. a resume re-reaching step 10
    assert again.name == "step-00000010-2.json" and first.name == "step-00000010.json"
    assert (tmp_path / json.loads(first.read_text())["files"][0]).read_bytes() == before
    assert [g["step"] for g in batch_grid.list_grids(tmp_path)] == [10, 10]


def test_bad_batches_name_the_problem(tmp_path: Path):
    with pytest.raises(batch_grid.BatchGridError, match="batch size"):
        batch_grid.split_roles({"a": np.zeros((2, 4, 4)), "b": np.zeros((3, 4, 4))})
    with pytest.raises(batch_grid.BatchGridError, match=r"\(B, 3, \.\.\.\)"):
        batch_grid.split_roles(np.zeros((2, 4, 4)), roles=["x", "y", "z"])
    with pytest.raises(batch_grid.BatchGridError, match="grid name"):
        batch_grid.save_batch_grid(tmp_path, np.zeros((1, 4, 4)), step=0, name="../escape")
    assert not (tmp_path / "qc").exists()


def test_sdk_saves_cpu_tensor_batches_at_the_qc_cadence(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(
        """
        import sys, torch
        import traceml_tui as traceml

        traceml.init("grid", logs_dir=sys.argv[1])
        qc = (torch.rand(4, 3, 12, 12), torch.rand(4, 3, 12, 12))   # two augmented views of a fixed batch
        paths = [traceml.log_batch_grid(qc, roles=["aug1", "aug2"], name="train-inputs", batch_id="fixed-0", cadence=3)]
        for step in range(7):
            with traceml.trace_step():
                pass
            paths.append(traceml.log_batch_grid(qc, roles=["aug1", "aug2"], name="train-inputs", batch_id="fixed-0", cadence=3))
        print([p is not None for p in paths])
        """
    ))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "logs")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    # recorded at initialization (step 0) and at updates 3 and 6
    assert proc.stdout.strip().splitlines()[-1] == str([True, False, False, True, False, False, True, False])
    grids = batch_grid.list_grids(tmp_path / "logs" / "grid")
    assert [g["step"] for g in grids] == [0, 3, 6]
    assert len({g["batch_digest"] for g in grids}) == 1 and grids[0]["batch_id"] == "fixed-0"
    assert all(len(g["tiles"]) == 8 for g in grids)
