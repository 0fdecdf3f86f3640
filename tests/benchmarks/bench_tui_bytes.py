"""Bytes `traceml watch` writes to the terminal, in a real tmux (``pipe-pane``), this tree against a baseline.

Two scenes, each measured for the baseline and for this tree side by side, at the same time, in the same
tmux server (so both see the same machine load and the same run):

* **idle Runs** at 160×48: the committed real runs (``tests/fixtures/runs``), nothing changing;
  budget ≤ 1 KB/s (docs/watch.md "Cheap over SSH");
* **live Run detail** at 80×24: a real 2-rank gloo DDP run through ``traceml run`` at about 5 steps/s
  (``examples/distributed/ddp_minimal.py --extra-step-ms``), its Run screen open; budget ≤ 10 KB/s.

The baseline is another revision of this repository (``--baseline``, default ``main``), exported with
``git archive`` and run from that copy; each watch has its own state directory (its own index and ingester).
Prints KB/s per scene and version and the ratio this tree / baseline.

    python tests/benchmarks/bench_tui_bytes.py [--seconds 20] [--baseline main] [--only idle,live]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURE_RUNS = REPO / "tests" / "fixtures" / "runs"
BUDGET_KBS = {"idle": 1.0, "live": 10.0}
SIZES = {"idle": (160, 48), "live": (80, 24)}
#: ddp_minimal's own step takes a few ms on a CPU; this much more makes ~5 steps/s.
EXTRA_STEP_MS = 195.0


def tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30).stdout


def wait_pane(sock: str, target: str, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = tmux(sock, "capture-pane", "-p", "-t", target)
        if re.search(pattern, text, re.MULTILINE):
            return text
        time.sleep(0.3)
    raise SystemExit(f"pane {target} never showed {pattern!r}; last screen:\n{text}")


def export(rev: str, dest: Path) -> Path:
    """The tree of revision ``rev`` of this repository, unpacked under ``dest``."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def watch_command(code: Path, cwd: Path, state: Path, root: str) -> str:
    env = {"PYTHONPATH": str(code), "XDG_STATE_HOME": str(state), "OMP_NUM_THREADS": "1",
           "PATH": os.environ.get("PATH", ""), "TERM": "xterm-256color", "COLORTERM": "truecolor"}
    assign = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"cd {shlex.quote(str(cwd))} && env {assign} {shlex.quote(sys.executable)} -m traceml_tui watch {root}"


def measure(sock: str, panes: dict[str, Path], seconds: float, out: Path) -> dict[str, float]:
    """KB/s each pane's program wrote during ``seconds`` (all panes piped over the same window)."""
    files = {}
    for name in panes:
        files[name] = out / f"{name}.bytes"
        tmux(sock, "pipe-pane", "-o", "-t", name, f"cat > {shlex.quote(str(files[name]))}")
    time.sleep(seconds)
    for name in panes:
        tmux(sock, "pipe-pane", "-t", name)  # no command: stop piping
    time.sleep(0.5)
    return {name: files[name].stat().st_size / 1024 / seconds if files[name].exists() else 0.0 for name in panes}


def start(sock: str, conf: Path, name: str, size: tuple[int, int], command: str) -> None:
    w, h = size
    subprocess.run(["tmux", "-L", sock, "-f", str(conf), "new-session", "-d", "-s", name, "-x", str(w),
                    "-y", str(h), command], check=True, timeout=30)


def scene_idle(sock: str, conf: Path, tmp: Path, versions: dict[str, Path], seconds: float) -> dict[str, float]:
    for label, code in versions.items():
        work = tmp / f"idle-{label}"
        shutil.copytree(FIXTURE_RUNS, work / "logs", ignore=shutil.ignore_patterns("*.md", "facts.json"))
        start(sock, conf, f"idle-{label}", SIZES["idle"], watch_command(code, work, work / "state", "logs"))
    for label in versions:
        wait_pane(sock, f"idle-{label}", r"runs · \d+ need attention", 90)
    time.sleep(5)  # past the first paints, the takeover notices and their toasts
    got = measure(sock, {f"idle-{label}": tmp for label in versions}, seconds, tmp)
    return {label: got[f"idle-{label}"] for label in versions}


def scene_live(sock: str, conf: Path, tmp: Path, versions: dict[str, Path], seconds: float) -> dict[str, float]:
    work = tmp / "live"
    (work / "logs").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "traceml.yaml", work / "traceml.yaml")
    env = dict(os.environ, OMP_NUM_THREADS="1", XDG_STATE_HOME=str(work / "train-state"), PYTHONPATH=str(REPO))
    env.pop("TRACEML_RUN_DIR", None)
    train = subprocess.Popen(
        [sys.executable, "-m", "traceml_tui", "run", str(REPO / "examples" / "distributed" / "ddp_minimal.py"),
         "--run-name", "bytes-live", "--nproc-per-node", "2", "--args", "--steps", "100000",
         "--extra-step-ms", str(EXTRA_STEP_MS)],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for label, code in versions.items():
            start(sock, conf, f"live-{label}", SIZES["live"],
                  watch_command(code, work, work / f"state-{label}", "logs"))
        for label in versions:
            wait_pane(sock, f"live-{label}", r"▶ running\s+bytes-live", 120)
            tmux(sock, "send-keys", "-t", f"live-{label}", "Enter")
        for label in versions:
            wait_pane(sock, f"live-{label}", r"RUNNING", 60)
        time.sleep(5)
        got = measure(sock, {f"live-{label}": tmp for label in versions}, seconds, tmp)
        return {label: got[f"live-{label}"] for label in versions}
    finally:
        os.killpg(train.pid, 2)  # SIGINT, as Ctrl-C: the launcher stops its ranks
        try:
            train.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(train.pid, 9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--baseline", default="main", help="git revision measured beside this tree")
    parser.add_argument("--only", default="idle,live")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is not installed")
        return 2
    scenes = [s for s in args.only.split(",") if s]
    sock = f"traceml-bytes-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="traceml-bytes-") as name:
        tmp = Path(name)
        conf = tmp / "tmux.conf"
        conf.write_text("set -g remain-on-exit on\nset -g status off\n")
        versions = {"baseline": export(args.baseline, tmp / "baseline-code"), "this": REPO}
        results = {}
        try:
            for scene in scenes:
                results[scene] = (scene_idle if scene == "idle" else scene_live)(sock, conf, tmp, versions,
                                                                                  args.seconds)
        finally:
            tmux(sock, "kill-server")
    print(f"bytes written to the terminal over {args.seconds:g} s (tmux pipe-pane), baseline = {args.baseline}")
    for scene, got in results.items():
        w, h = SIZES[scene]
        base, this = got["baseline"], got["this"]
        ratio = f"{this / base:.3f}×" if base else "–"
        verdict = "within" if this <= BUDGET_KBS[scene] else "OVER"
        print(f"  {scene:<5} {w}×{h}: baseline {base:8.2f} KB/s · this tree {this:8.2f} KB/s · ratio {ratio} · "
              f"budget ≤ {BUDGET_KBS[scene]:g} KB/s: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
