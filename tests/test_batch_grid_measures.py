"""Health measures beside the batch grid (docs/qc.md "Health measures"), on real renders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from traceml_tui.hygiene.batch_grid import BatchGridError, save_batch_grid


def test_a_member_repeated_in_the_batch_counts_once_by_content(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    batch = rng.random((8, 3, 12, 12))
    batch[5] = batch[1]  # the loader served one example twice
    batch[6] = batch[1]
    meta = json.loads(save_batch_grid(tmp_path, batch, step=0).read_text())
    m = meta["measures"]
    assert m["coverage"] == {"distinct": 6, "eligible": 8, "value": pytest.approx(6 / 8)}
    assert m["concentration"]["top_k_share"] == pytest.approx(7 / 8)  # 3 + 1 + 1 + 1 + 1 of 8 tiles, k = 5
    assert m["concentration"]["gini"] > 0.0 and m["tiles"] == 8
    assert 0.0 < m["diversity"]["value"] < 1.0 and m["diversity"]["distance"] == "pixel_rms_16x16"

    distinct = json.loads(save_batch_grid(tmp_path, rng.random((8, 3, 12, 12)), step=1).read_text())["measures"]
    assert distinct["coverage"]["value"] == 1.0 and distinct["concentration"]["gini"] == 0.0
    same = json.loads(save_batch_grid(tmp_path, np.repeat(batch[:1], 8, axis=0), step=2).read_text())["measures"]
    assert same["coverage"]["distinct"] == 1 and same["diversity"]["value"] == pytest.approx(0.0, abs=1e-9)


def test_declared_sources_eligible_and_distance(tmp_path: Path) -> None:
    batch = {"image": np.arange(4 * 16, dtype=float).reshape(4, 4, 4), "mask": np.zeros((4, 4, 4))}

    def first_pixel(a: dict, b: dict) -> float:
        return abs(float(a["image"][0, 0]) - float(b["image"][0, 0]))

    meta = json.loads(save_batch_grid(tmp_path, batch, step=0, sources=["p1", "p1", "p2", "p3"], eligible=20,
                                      distance=first_pixel).read_text())
    m = meta["measures"]
    assert m["coverage"] == {"distinct": 3, "eligible": 20, "value": pytest.approx(3 / 20)}
    assert m["diversity"] == {"distance": "first_pixel", "value": pytest.approx((16 + 32 + 48 + 16 + 32 + 16) / 6)}
    for kwargs, said in (({"sources": ["a"]}, "1 source ids for 4 batch members"),
                         ({"eligible": 2}, "eligible=2 is below the 4 distinct sources"),
                         ({"eligible": -1}, "eligible must be a count")):
        with pytest.raises(BatchGridError, match=said):
            save_batch_grid(tmp_path, batch, step=5, name="refused", **kwargs)
    assert not (tmp_path / "qc/batch_grid/refused").exists()
