"""The reproduction bundle (docs/run.md, "Provenance bundle") on real one-process `traceml run` launches.

A temporary Git repository holds the script (committed, then changed), a
traceml.yaml and a data file the script declares with ``traceml.declare_input``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from traceml_tui.core.rundir import RunDir

pytestmark = pytest.mark.slow

SCRIPT = """\
import sys
import traceml_tui as traceml
traceml.init()
traceml.declare_input("data/train.csv")
for _ in range(3):
    with traceml.trace_step():
        traceml.log(loss=1.0)
print("ARGS=" + repr(sys.argv[1:]))
"""
CONFIG = "logs_dir: logs\nhistory_retention: 10m\n"
ARGS = ["--lr", "0.1 x", "--tag", "it's"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def _repo(tmp_path: Path) -> Path:
    """A repository ``proj`` with ``exp/train.py`` committed and then changed, ``exp/traceml.yaml``, data."""
    repo = tmp_path / "proj"
    (repo / "exp" / "data").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.invalid")
    _git(repo, "config", "user.name", "t")
    (repo / "exp" / "train.py").write_text(SCRIPT)
    (repo / "exp" / "traceml.yaml").write_text(CONFIG)
    (repo / "exp" / "data" / "train.csv").write_text("x,y\n1,2\n")
    _git(repo, "add", "exp/train.py", "exp/traceml.yaml")
    _git(repo, "commit", "-q", "-m", "init")
    with open(repo / "exp" / "train.py", "a") as handle:
        handle.write("# uncommitted change: lr warmup\n")
    return repo


def _launch(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_tui", "run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def _bundle_digests(run: RunDir) -> dict[str, str]:
    return {p.relative_to(run.path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in run.bundle_files()}


def _reproduce_block(readme: str) -> list[str]:
    block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    return block.strip().splitlines()


def test_bundle_of_a_dirty_repo_reproduces_and_survives_resume(tmp_path: Path, cli_env: dict[str, str]) -> None:
    repo = _repo(tmp_path)
    exp = repo / "exp"
    proc = _launch(exp, cli_env, "train.py", "--run-name", "prov", "--args", *ARGS)
    assert proc.returncode == 0, proc.stderr
    run = RunDir(exp / "logs" / "prov")

    git = json.loads(run.git_json.read_text())
    assert git["git"] is True and git["dirty"] is True
    assert git["revision"] == _git(repo, "rev-parse", "HEAD").strip() and git["branch"] == "main"
    assert git["repo"] == "proj" and git["launch_dir"] == "exp"
    assert {"path": "exp/train.py", "status": "M"} in git["changed"] and git["diff_truncated"] is False
    diff = run.git_diff.read_text()
    assert "+# uncommitted change: lr warmup" in diff
    _git(repo, "apply", "--check", "--reverse", str(run.git_diff))  # exactly the working tree's change

    inputs = json.loads(run.inputs_json.read_text())
    by_role = {e["role"]: e for e in inputs["inputs"]}
    assert inputs["relative_to"] == "repository"
    assert by_role["script"]["path"] == "exp/train.py"
    assert by_role["script"]["sha256"] == hashlib.sha256((exp / "train.py").read_bytes()).hexdigest()
    assert by_role["config"]["path"] == "exp/traceml.yaml"
    declared = [json.loads(line) for line in run.declared_inputs.read_text().splitlines()]
    assert [(d["path"], d["sha256"], d["rank"], d["attempt"]) for d in declared] == [
        ("exp/data/train.csv", hashlib.sha256(b"x,y\n1,2\n").hexdigest(), 0, 0)]

    environment = json.loads(run.environment_json.read_text())
    assert environment["python"] == ".".join(map(str, sys.version_info[:3]))
    packages = {name.lower(): version for name, version in environment["packages"].items()}
    assert packages["pyyaml"] == metadata.version("PyYAML") and packages["msgspec"] == metadata.version("msgspec")

    readme = run.readme.read_text()
    assert "history_retention: 600" in readme and "[learning_curve.png](learning_curve.png)" in readme
    cd, line = _reproduce_block(readme)
    assert shlex.split(cd) == ["cd", "exp"]
    argv = shlex.split(line)
    assert argv[:5] == ["traceml", "run", "train.py", "--run-name", "prov"]
    assert argv[argv.index("--args") + 1:] == ARGS
    # the line runs: from the repository root, in the launch folder, under a fresh name
    argv[argv.index("--run-name") + 1] = "prov-again"
    again = subprocess.run([sys.executable, "-m", "traceml_tui", *argv[1:]], cwd=repo / shlex.split(cd)[1],
                           env=cli_env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    assert f"ARGS={ARGS!r}" in again.stdout

    before = _bundle_digests(run)
    assert set(before) == {"README.md", "provenance/git.json", "provenance/git.diff", "provenance/environment.json",
                           "provenance/inputs.json", "provenance/declared_inputs.jsonl"}
    with open(exp / "train.py", "a") as handle:
        handle.write("# changed again before the resume\n")
    resumed = _launch(exp, cli_env, "train.py", "--run-name", "prov", "--resume", "--args", *ARGS)
    assert resumed.returncode == 0, resumed.stderr
    assert run.steps_file(0, 1).is_file()  # the resume ran as attempt 1 ...
    assert _bundle_digests(run) == before  # ... and left every bundle file byte-identical


def test_bundle_without_git_on_path(tmp_path: Path, cli_env: dict[str, str]) -> None:
    repo = _repo(tmp_path)
    bare = tmp_path / "bin"
    bare.mkdir()  # a PATH without git: the launcher runs python by its full path
    proc = _launch(repo / "exp", {**cli_env, "PATH": str(bare)}, "train.py", "--run-name", "nogit")
    assert proc.returncode == 0, proc.stderr
    run = RunDir(repo / "exp" / "logs" / "nogit")
    assert json.loads(run.git_json.read_text()) == {"schema": 1, "git": False, "reason": "git not found"}
    assert not run.git_diff.exists()
    assert "no Git state: git not found" in run.readme.read_text()
    assert json.loads(run.inputs_json.read_text())["inputs"][0]["path"] == "exp/train.py"  # the repository's root
    assert os.fspath(tmp_path) not in "".join(p.read_text() for p in run.bundle_files())


DECLARE = """\
import json, sys
import traceml_tui as traceml
traceml.init("plain")
for path in sys.argv[1:]:
    print(json.dumps(traceml.declare_input(path)))
"""


def test_declare_input_names_folders_and_outside_files_without_absolute_paths(tmp_path: Path,
                                                                               cli_env: dict[str, str]) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    (work / "shards" / "b").mkdir(parents=True)
    elsewhere.mkdir()
    (work / "shards" / "a.bin").write_bytes(b"\x00" * 10)
    (work / "shards" / "b" / "c.bin").write_bytes(b"\x01" * 5)
    (elsewhere / "vocab.txt").write_text("a\nb\n")
    (work / "declare.py").write_text(DECLARE)

    def declare(*paths: str) -> list[dict]:
        proc = subprocess.run([sys.executable, "declare.py", *paths], cwd=work, env=cli_env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines()]

    folder, outside = declare("shards", str(elsewhere / "vocab.txt"))
    assert (folder["path"], folder["kind"], folder["files"], folder["size"]) == ("shards", "directory", 2, 15)
    assert (outside["path"], outside["outside"]) == ("vocab.txt", True)
    log = RunDir(work / "logs" / "plain").declared_inputs
    assert os.fspath(tmp_path) not in log.read_text() and len(log.read_text().splitlines()) == 2
    # a second attempt declaring the same inputs appends nothing; a changed folder is a new line
    declare("shards", str(elsewhere / "vocab.txt"))
    assert len(log.read_text().splitlines()) == 2
    (work / "shards" / "b" / "c.bin").rename(work / "shards" / "b" / "d.bin")
    (renamed,) = declare("shards")
    assert renamed["sha256"] != folder["sha256"] and renamed["attempt"] == 2
    assert len(log.read_text().splitlines()) == 3
