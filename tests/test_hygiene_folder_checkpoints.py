"""Folder checkpoints (docs/hygiene.md, "Folder checkpoints"): Hugging Face saves ``checkpoint-N/`` folders.

``publish_checkpoint`` copies a folder write-once into ``checkpoints/<id>/`` with read-only files; links
and special files inside are refused before anything is written (docs/security.md); what the script does
to its own folder afterwards changes nothing published; a real ``traceml validate drain`` process hands
the published folder's path to its worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_tui.core.rundir import RunDir
from traceml_tui.hygiene import backlog, folders
from traceml_tui.hygiene.checkpoints import publish_checkpoint

from support.lanes import IMPORTS_TORCH

pytestmark = IMPORTS_TORCH  # the folders are written by torch in this process

DIGEST = "sha256:test"


def _hf_like_folder(path: Path, seed: float) -> Path:
    """A checkpoint folder shaped like a Hugging Face ``checkpoint-N/``, written by the real libraries."""
    import torch

    path.mkdir(parents=True)
    torch.save({"w": torch.full((4, 4), seed)}, path / "pytorch_model.bin")
    torch.save({"state": {}, "param_groups": [{"lr": 0.1}]}, path / "optimizer.pt")
    (path / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden": 4}))
    (path / "trainer_state.json").write_text(json.dumps({"global_step": int(seed)}))
    (path / "extra").mkdir()
    (path / "extra" / "rng_state.pth").write_bytes(os.urandom(64))
    return path


def _tree_digest(root: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file below ``root`` (folders by their files)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_folder_is_copied_once_with_read_only_files(tmp_path, monkeypatch):
    run_dir = tmp_path / "logs" / "run"
    monkeypatch.chdir(tmp_path)
    own = _hf_like_folder(tmp_path / "out" / "checkpoint-10", 10.0)
    before = _tree_digest(own)
    first = publish_checkpoint(run_dir, "out/checkpoint-10", step=10, config_digest=DIGEST)

    # The script goes on with its own folder: rewrites a file, deletes one, adds one, renames the folder.
    import torch

    torch.save({"w": torch.zeros(4, 4)}, own / "pytorch_model.bin")
    (own / "optimizer.pt").unlink()
    (own / "new.bin").write_bytes(b"later")
    own.rename(own.with_name("checkpoint-10-old"))

    layout = RunDir(run_dir)
    request = backlog.read_json(layout.request(first))
    assert request["path"] == f"checkpoints/{first}"  # a folder, relative to the run directory
    published = run_dir / request["path"]
    assert published.is_dir() and not published.is_symlink()
    assert _tree_digest(published) == before  # what was published stays what it was
    for path in published.rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o222 == 0, path
    assert not [p for p in layout.checkpoints.iterdir() if p.name.startswith(".")]  # no temp folder left

    # The same step published again (a resume) gets a new id; nothing is replaced.
    again_src = _hf_like_folder(tmp_path / "out" / "checkpoint-10", 11.0)
    second = publish_checkpoint(run_dir, again_src, step=10, config_digest=DIGEST)
    assert second == f"{first}-2"
    assert _tree_digest(run_dir / "checkpoints" / first) == before
    assert _tree_digest(run_dir / "checkpoints" / second) == _tree_digest(again_src)


@pytest.mark.parametrize("what", ["file-link", "folder-link", "fifo", "empty"])
def test_a_folder_that_cannot_be_published_is_one_clear_error_and_writes_nothing(tmp_path, what):
    run_dir = tmp_path / "logs" / "run"
    src = tmp_path / "checkpoint-5"
    outside = tmp_path / "secret.txt"
    outside.write_text("not part of any checkpoint")
    if what == "empty":
        (src / "sub").mkdir(parents=True)
        expected = f"publish_checkpoint: the checkpoint folder has no files: {src}"
    else:
        _hf_like_folder(src, 5.0)
        if what == "file-link":
            (src / "extra" / "tokenizer.json").symlink_to(outside)
            expected = f"publish_checkpoint: {src}/extra/tokenizer.json is a symbolic link: "
        elif what == "folder-link":
            (src / "linked").symlink_to(tmp_path)
            expected = f"publish_checkpoint: {src}/linked is a symbolic link: "
        else:
            os.mkfifo(src / "pipe")
            expected = f"publish_checkpoint: {src}/pipe is not a regular file or a folder"
    with pytest.raises(ValueError) as info:
        publish_checkpoint(run_dir, src, step=5, config_digest=DIGEST)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)
    assert not run_dir.exists()  # nothing written: no backlog folders, no checkpoint, no request


def test_an_entry_swapped_for_a_link_after_the_check_is_refused_and_nothing_is_left(tmp_path):
    """The copy re-checks every entry through descriptors (O_NOFOLLOW): a swap after scan() is caught."""
    src = _hf_like_folder(tmp_path / "checkpoint-7", 7.0)
    tree = folders.scan(src, "checkpoint-7")
    assert tree.files == 5
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    (src / "config.json").unlink()
    (src / "config.json").symlink_to(outside)
    target = tmp_path / "run" / "checkpoints" / "step-00000007"
    with pytest.raises(ValueError, match=r"^publish_checkpoint: checkpoint-7/config.json is a symbolic link"):
        folders.copy_once(tree, target)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # the partial copy is gone


def test_the_drainer_hands_the_published_folder_to_its_worker(tmp_path, traceml_cmd, cli_env):
    """A real `traceml validate drain` process: the worker's {checkpoint} is the published folder."""
    run_dir = tmp_path / "run"
    src = _hf_like_folder(tmp_path / "checkpoint-20", 20.0)
    ckpt = publish_checkpoint(run_dir, src, step=20, config_digest=DIGEST)
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import json, sys, torch\n"
        "from pathlib import Path\n"
        "folder = Path(sys.argv[1])\n"
        "w = torch.load(folder / 'pytorch_model.bin')['w']\n"
        "files = sum(1 for p in folder.rglob('*') if p.is_file())\n"
        "print(json.dumps({'w_mean': float(w.mean()), 'files': files, 'is_dir': int(folder.is_dir())}))\n"
    )
    done = subprocess.run([*traceml_cmd, "validate", "drain", str(run_dir), "--no-curve", "--",
                           sys.executable, str(worker), "{checkpoint}"],
                          env=cli_env, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    receipt = backlog.read_json(RunDir(run_dir).receipt(ckpt))
    assert receipt["metrics"] == {"w_mean": 20.0, "files": 5, "is_dir": 1}
