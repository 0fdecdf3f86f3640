"""A QC figure's JSON is read back from the run directory: the export survives any content (property tests).

Contract (docs/export.md, docs/qc.md): whatever a batch grid's layout JSON or a
gallery's sidecar holds, planning an export never raises, sends only finite
numbers under `<kind>/<name>/<measure>/qc`, and links only PNG files of the
figure's own folder — never a path out of it.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceml_tui.export import cursor as cursor_mod
from traceml_tui.export import mapping
from traceml_tui.export.trackio_export import plan_export
from traceml_tui.hygiene.gallery import save_gallery

from support.lanes import examples

LOADED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
                  max_examples=examples(60))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                    max_leaves=20)
PATHS = st.sampled_from(["qc/gallery/g/step-00000000.png", "qc/gallery/g/../../outside.png", "/tmp/outside.png",
                         "qc/gallery/other/step-00000000.png", "qc/gallery/g/missing.png", "outside.png", ""])
MEASURE = st.fixed_dictionaries({}, optional={
    "coverage": st.one_of(JSON, st.fixed_dictionaries({"value": SCALARS})),
    "concentration": st.one_of(JSON, st.fixed_dictionaries({"top_k_share": SCALARS, "gini": SCALARS,
                                                            "entropy": SCALARS})),
    "diversity": st.one_of(JSON, st.fixed_dictionaries({"value": SCALARS})),
})
SIDECAR = st.fixed_dictionaries({}, optional={
    "name": JSON, "step": JSON, "pages": JSON, "groups": JSON,
    "files": st.one_of(JSON, st.lists(st.one_of(PATHS, JSON), max_size=5)),
    "measures": st.one_of(JSON, st.fixed_dictionaries({"overall": st.one_of(MEASURE, JSON)})),
})

_RUN = None


def _run(tmp: Path) -> Path:
    """One real gallery (a real page PNG in its folder) and a PNG outside the run, built once."""
    global _RUN
    if _RUN is None:
        base = tmp / "base"
        save_gallery(base, {"a": [(f"s{i}", np.full((4, 4), i / 16)) for i in range(16)]}, step=0, name="g")
        (tmp / "outside.png").write_bytes((base / "qc/gallery/g/step-00000000.png").read_bytes())
        _RUN = base
    return _RUN


@LOADED
@given(gallery=SIDECAR, grid=SIDECAR)
def test_any_figure_json_plans_an_export_without_error_or_escape(tmp_path_factory, gallery: dict, grid: dict) -> None:
    tmp = tmp_path_factory.getbasetemp() / "sidecars"
    tmp.mkdir(exist_ok=True)
    base = _run(tmp)
    run_dir = tmp / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(base, run_dir)
    (run_dir / "qc/gallery/g/step-00000000.json").write_text(json.dumps(gallery))
    (run_dir / "qc/batch_grid/inputs").mkdir(parents=True)
    (run_dir / "qc/batch_grid/inputs/step-00000000.json").write_text(json.dumps(grid))
    (run_dir / "qc/gallery/other").mkdir()
    (run_dir / "qc/gallery/other/step-00000000.png").write_bytes(b"\x89PNG\r\n")

    out, _ = plan_export(run_dir, cursor_mod.Cursor())
    for points in out.points.values():
        for key, value in points.items():
            assert isinstance(value, float) and math.isfinite(value), (key, value)
            assert key.endswith(f"/{mapping.QC_ROLE}") and key.split("/")[0] in ("gallery", "batch_grid")
    for key, path, _step, _caption in out.images:
        assert key.startswith(("qc/gallery/", "qc/batch_grid/")), key
        # only the gallery's own page is ever linked: nothing out of its folder
        assert path == run_dir / "qc/gallery/g/step-00000000.png", path
