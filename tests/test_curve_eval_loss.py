"""The curve's top panel shows the validation loss beside the training loss; the task panel keeps task metrics only.

A real SDK run (steps with a scale-free `mse` component, completed evaluations
reporting `mse_ratio`, the physical `mse` and the task metric `r2`).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from traceml_tui.hygiene.curve import build_figure, is_loss_metric, load_curve_data, render_learning_curve

from support import realruns

TRAIN = textwrap.dedent(
    """
    import sys
    import traceml_tui as traceml

    traceml.init("curve", logs_dir=sys.argv[1])
    for step in range(1, 9):
        with traceml.trace_step():
            traceml.log(loss=1.0 / step, components={"mse": (1.0 / step, 2.0)}, metrics={"r2": 1.0 - 1.0 / step})
        if step % 4 == 0:
            traceml.log_eval({"mse_ratio": 0.9 / step, "mse": 1.8 / step, "r2": 0.9 - 1.0 / step},
                             checkpoint=f"step-{step:08d}", role="val")
    traceml.finish()
    """
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("curve")
    (work / "train.py").write_text(TRAIN)
    done = subprocess.run([sys.executable, "train.py", "logs"], cwd=work, env=realruns.subprocess_env(work / "state"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return work / "logs" / "curve"


def _labels(ax) -> list[str]:
    return [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]


def test_validation_ratio_is_a_distinct_series_beside_the_training_ratio(run_dir: Path) -> None:
    from matplotlib.figure import Figure

    data = load_curve_data(run_dir)
    top, task = build_figure(data, Figure).axes
    assert {"mse ratio", "mse trend", "mse eval ratio"} <= set(_labels(top))
    [line] = [line for line in top.get_lines() if line.get_label() == "mse eval ratio"]
    assert list(line.get_xdata()) == [4, 8]
    assert list(line.get_ydata()) == pytest.approx([0.9 / 4, 0.9 / 8])
    labels = set(_labels(task))
    assert "r2 eval" in labels and "r2 train" in labels
    assert not any(label.startswith(("mse", "loss")) for label in labels)  # losses never in the task panel
    assert render_learning_curve(run_dir).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_loss_metrics_are_told_from_task_metrics() -> None:
    components = {"mse", "kl"}
    assert all(is_loss_metric(n, components) for n in ("mse_ratio", "kl_ratio", "loss", "mse", "kl"))
    assert not any(is_loss_metric(n, components) for n in ("r2", "dice", "auc"))
