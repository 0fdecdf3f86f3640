"""The reproduction bundle node 0 writes before the first rank starts (docs/run.md, "Provenance bundle").

Seed 004 ("Save Training And Validation Together"): a runnable ``README.md``,
the complete effective config, the Git revision, status and diff, and the
environment and input identities, in the run root, preserved across resumes.
:func:`write_bundle` runs once, for a fresh run; every file is written
atomically and exclusively (``core/atomic.py``), so nothing here ever rewrites
a bundle. Nothing records an environment value, a host name or an absolute
path (docs/security.md); the README's reproduction line holds the script's
arguments as they were given.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from traceml_tui.core import atomic, inputs
from traceml_tui.core.rundir import DECLARED_INPUTS, GIT_DIFF, PROVENANCE, RunDir
from traceml_tui.core.signals import shielded
from traceml_tui.run.options import LaunchOptions

SCHEMA = 1
#: The diff of tracked files is cut (at a line end) past this many bytes; git.json says so.
DIFF_LIMIT_BYTES = 4 * 1024 * 1024
#: Changed paths listed in git.json (the count is always complete).
CHANGED_LIMIT = 1000
GIT_TIMEOUT_S = 30.0
#: Variables whose *presence* changes what training computes; environment.json lists the names set, never values.
REPRODUCIBILITY_VARIABLES = (
    "CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "CUDA_VISIBLE_DEVICES", "MKL_NUM_THREADS",
    "NCCL_ALGO", "NCCL_PROTO", "OMP_NUM_THREADS", "PYTHONHASHSEED", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "TORCH_DETERMINISTIC",
)
_DRIVER_RE = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+(?:\.\d+)+)")


def _warn(message: str) -> None:
    print(f"traceml run: warning: {message}", file=sys.stderr, flush=True)


# -- git -------------------------------------------------------------------------------------------
def _git_env() -> dict[str, str]:
    env = dict(os.environ)  # passed to git only; no value is recorded
    env.update(GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", LC_ALL="C", GIT_PAGER="cat")
    return env


def _git_cmd(*args: str) -> list[str]:
    return ["git", "--no-pager", "-c", "core.quotepath=off", "-c", "color.ui=false", *args]


def _git(cwd: Path, *args: str) -> tuple[int, bytes]:
    proc = subprocess.run(_git_cmd(*args), cwd=cwd, env=_git_env(), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=GIT_TIMEOUT_S, check=False)
    return proc.returncode, proc.stdout


def _git_capped(cwd: Path, limit: int, *args: str) -> tuple[int, bytes, bool]:
    """Run git and keep at most ``limit`` bytes of its output (cut at a line end); True when cut."""
    proc = subprocess.Popen(_git_cmd(*args), cwd=cwd, env=_git_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    timer = threading.Timer(GIT_TIMEOUT_S, proc.kill)
    with shielded():  # (core/signals.py: a signal sent to the launcher goes to the main thread)
        timer.start()
    try:
        assert proc.stdout is not None
        data = proc.stdout.read(limit + 1)
        cut = len(data) > limit
        if cut:
            proc.kill()
            data = data[: data.rfind(b"\n", 0, limit) + 1]
        proc.stdout.close()
        rc = proc.wait()
    finally:
        timer.cancel()
    return (0 if cut else rc), data, cut


def _status_entries(raw: bytes) -> tuple[list[dict], int]:
    """Tracked changes (``{path, status}``) and the untracked count from ``git status --porcelain=v1 -z``."""
    changed: list[dict] = []
    untracked = 0
    fields = raw.split(b"\0")
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        code, path = entry[:2].decode("ascii", "replace"), entry[3:].decode("utf-8", "surrogateescape")
        if code == "??":
            untracked += 1
            continue
        if "R" in code or "C" in code:
            i += 1  # the rename's source path follows
        changed.append({"path": path, "status": code.strip()})
    return changed, untracked


def git_state(cwd: Path) -> tuple[dict, Optional[bytes]]:
    """``git.json``'s content and the diff of tracked files against HEAD (None outside a repository).

    Never raises: git missing, not a repository, or git failing is recorded as
    ``{"git": false, "reason": …}`` (git's own messages are not copied: they
    name absolute paths). The remote URL is not recorded (it may carry a token).
    """
    if shutil.which("git") is None:
        return {"schema": SCHEMA, "git": False, "reason": "git not found"}, None
    try:
        rc, top = _git(cwd, "rev-parse", "--show-toplevel")
        if rc != 0 or not top.strip():
            return {"schema": SCHEMA, "git": False, "reason": "not a git repository"}, None
        root = Path(top.strip().decode("utf-8", "surrogateescape"))
        rc, head = _git(cwd, "rev-parse", "--verify", "-q", "HEAD")
        revision = head.strip().decode("ascii", "replace") if rc == 0 and head.strip() else None
        rc, branch = _git(cwd, "symbolic-ref", "-q", "--short", "HEAD")
        branch_name = branch.strip().decode("utf-8", "replace") if rc == 0 and branch.strip() else None
        rc, status = _git(cwd, "status", "--porcelain=v1", "-z", "--untracked-files=normal")
        if rc != 0:
            return {"schema": SCHEMA, "git": False, "reason": f"git status failed (exit {rc})"}, None
        changed, untracked = _status_entries(status)
        if revision is None:  # no commit yet: everything tracked is a change against the empty tree
            _, empty = _git(cwd, "hash-object", "-t", "tree", "/dev/null")
            against = empty.strip().decode("ascii", "replace")
        else:
            against = revision
        rc, diff, cut = _git_capped(cwd, DIFF_LIMIT_BYTES, "diff", "--no-ext-diff", "--no-textconv", "--binary",
                                    against, "--")
        if rc != 0:
            return {"schema": SCHEMA, "git": False, "reason": f"git diff failed (exit {rc})"}, None
    except (OSError, subprocess.SubprocessError) as exc:
        return {"schema": SCHEMA, "git": False, "reason": f"git failed ({type(exc).__name__})"}, None
    launch_dir, _ = inputs.relative_name(cwd, root)
    info = {
        "schema": SCHEMA,
        "git": True,
        "repo": root.name,
        "launch_dir": "." if Path(os.path.abspath(cwd)) == Path(os.path.abspath(root)) else launch_dir,
        "revision": revision,
        "branch": branch_name,
        "dirty": bool(changed),
        "changed": changed[:CHANGED_LIMIT],
        "changed_count": len(changed),
        "untracked_count": untracked,
        "diff": GIT_DIFF,
        "diff_bytes": len(diff),
        "diff_truncated": cut,
    }
    if cut:
        info["diff_limit_bytes"] = DIFF_LIMIT_BYTES
    return info, diff


# -- environment -------------------------------------------------------------------------------------
def _packages() -> dict[str, str]:
    """Installed distributions and their versions (the first of a name on the path wins, as import does)."""
    from importlib import metadata

    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name") if dist.metadata is not None else None
        if name and name not in out:
            out[name] = dist.version
    return dict(sorted(out.items(), key=lambda kv: kv[0].lower()))


def _driver_version() -> Optional[str]:
    """The NVIDIA kernel driver's version from ``/proc`` (no nvidia-smi, no CUDA context), else None."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as handle:
            match = _DRIVER_RE.search(handle.read(4096))
    except OSError:
        return None
    return match.group(1) if match else None


def environment(packages: Optional[dict[str, str]] = None) -> dict:
    """``environment.json``: the summary's software fingerprint, CUDA, driver, packages; no host, no values."""
    from traceml_tui.summary.build import environment_section  # the one home of python/platform/torch

    packages = _packages() if packages is None else packages
    out = environment_section()
    torch_version = out.get("torch")
    build = torch_version.split("+", 1)[1] if isinstance(torch_version, str) and "+" in torch_version else None
    lowered = {name.lower(): version for name, version in packages.items()}
    runtime = next((lowered[n] for n in ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11",
                                         "nvidia-cuda-runtime") if n in lowered), None)
    out["cuda"] = {"torch_build": build, "runtime": runtime}
    out["driver"] = _driver_version()
    out["variables_set"] = [name for name in REPRODUCIBILITY_VARIABLES if name in os.environ]
    out["packages"] = packages
    return {"schema": SCHEMA, **out}


# -- inputs ------------------------------------------------------------------------------------------
def _config_files(config: Any, hygiene: Optional[dict]) -> list[tuple[str, Path]]:
    """(role, path) of the files the config names: traceml.yaml itself and the validation worker's files."""
    path = getattr(config, "path", None)
    if path is None:
        return []
    out = [("config", Path(path))]
    worker = ((hygiene or {}).get("validation") or {}).get("worker") or []
    for arg in worker:
        if "{" in arg or arg.startswith("-"):
            continue
        candidate = Path(path).parent / arg  # the worker runs from the folder of traceml.yaml
        if candidate.is_file():
            out.append(("hygiene.validation.worker", candidate))
    return out


def input_identities(script: Path, config: Any, hygiene: Optional[dict], base: Path, in_repo: bool) -> dict:
    """``inputs.json``: the script's and the config's files, relative to ``base``, with their digests."""
    entries = []
    for role, path in [("script", script), *_config_files(config, hygiene)]:
        try:
            entries.append({"role": role, **inputs.identity(path, base)})
        except (OSError, ValueError) as exc:
            name, _ = inputs.relative_name(path, base)
            entries.append({"role": role, "path": name, "error": type(exc).__name__})
    return {
        "schema": SCHEMA,
        "relative_to": "repository" if in_repo else "launch directory",
        "inputs": entries,
        "declared": f"{PROVENANCE}/{DECLARED_INPUTS}",
    }


# -- README ------------------------------------------------------------------------------------------
def _shown_path(path: Path, cwd: Path, base: Path) -> tuple[str, bool]:
    """A path as the reproduction line writes it: relative to ``cwd`` when inside ``base`` or ``cwd``."""
    full = Path(os.path.abspath(cwd / path))
    for root in (base, cwd):
        _, inside = inputs.relative_name(full, root)
        if inside:
            return Path(os.path.relpath(full, os.path.abspath(cwd))).as_posix(), True
    return full.name, False


def reproduce_argv(options: LaunchOptions, config: Any, cwd: Path, base: Path) -> tuple[list[str], list[str]]:
    """The ``traceml run`` line of this run (node 0's) as argv, and notes on what it could not carry."""
    notes: list[str] = []
    script, inside = _shown_path(options.script, cwd, base)
    if not inside:
        notes.append(f"the script lies outside the repository and the launch directory: only its name `{script}` "
                     "is given (its digest is in provenance/inputs.json)")
    argv = ["traceml", "run", script, "--run-name", options.run_name]
    default_logs = Path(getattr(config, "logs_dir", None) or "logs")
    if options.logs_dir != default_logs:
        shown, inside = _shown_path(options.logs_dir, cwd, base)
        if inside:
            argv += ["--logs-dir", shown]
        else:
            notes.append("--logs-dir lay outside the repository and the launch directory; it is not recorded")
    if options.nproc_per_node != 1:
        argv.append(f"--nproc-per-node={options.nproc_per_node}")
    if options.nnodes > 1:
        argv += [f"--nnodes={options.nnodes}", "--node-rank=0", "--master-addr=$MASTER_ADDR",
                 f"--master-port={options.master_port}"]
        notes.append("every node runs this line with its own --node-rank; set MASTER_ADDR to node 0's address "
                     "(host names are not recorded)")
    if options.trace_max_steps is not None:
        argv.append(f"--trace-max-steps={options.trace_max_steps}")
    default_timeout = float(getattr(config, "finalize_timeout_sec", None) or 60.0)
    if options.finalize_timeout != default_timeout:
        argv.append(f"--finalize-timeout={options.finalize_timeout:g}")
    if options.script_args:
        argv += ["--args", *options.script_args]
    return argv, notes


def _shell_line(argv: list[str]) -> str:
    """argv as one shell line; the ``$MASTER_ADDR`` placeholder is left for the shell to expand."""
    return " ".join('--master-addr="$MASTER_ADDR"' if arg == "--master-addr=$MASTER_ADDR" else shlex.quote(arg)
                    for arg in argv)


def effective_config(options: LaunchOptions, config: Any, hygiene: Optional[dict], cwd: Path, base: Path) -> dict:
    """The config the launcher runs with: traceml.yaml as parsed, guard and hygiene as normalized."""
    logs, inside = _shown_path(options.logs_dir, cwd, base)
    out: dict[str, Any] = {
        "mode": config.mode,
        "history_enabled": config.history_enabled,
        "history_retention": config.history_retention,
        "logs_dir": logs if inside else "(outside the repository and the launch directory: not recorded)",
        "finalize_timeout_sec": options.finalize_timeout,
    }
    if config.guard is not None:
        out["guard"] = config.guard
    if hygiene is not None:
        out["hygiene"] = hygiene
    return out


def readme_text(run_name: str, argv: list[str], notes: list[str], effective: dict, git: dict, config_name: Optional[str],
                started: float) -> str:
    """The runnable README of the run root."""
    import yaml

    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
    lines = [f"# {run_name}", "",
             f"Launched by `traceml run` on {when}. This README and `provenance/` were written before the first",
             "rank started and are never rewritten (a `--resume` keeps them as they are).", "",
             "## Reproduce", ""]
    if git.get("git"):
        rev = git.get("revision") or "(no commit yet)"
        lines.append(f"From the root of a checkout of `{git['repo']}` at revision `{rev}`"
                     + (f" (branch `{git['branch']}`)" if git.get("branch") else "")
                     + (", with `provenance/git.diff` applied (`git apply <run>/provenance/git.diff`)"
                        if git.get("dirty") else " (the tracked files were clean)") + ":")
        lines += ["", "```sh"]
        if git.get("launch_dir") not in (None, "."):
            lines.append(f"cd {shlex.quote(git['launch_dir'])}")
    else:
        lines += [f"From the launch directory (no Git state: {git.get('reason', 'unknown')}):", "", "```sh"]
    lines += [_shell_line(argv), "```", ""]
    lines.append("Choose a fresh `--run-name` to run it again: an existing run is never overwritten.")
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    lines += ["", "## Effective config", "",
              f"`{config_name}` as `traceml run` parsed it (guard and hygiene blocks normalized, defaults filled in):"
              if config_name else "No `traceml.yaml` was found: the defaults.",
              "", "```yaml", yaml.safe_dump(effective, sort_keys=False, default_flow_style=False,
                                             allow_unicode=True).rstrip("\n"), "```", "",
              "## Files", "",
              "- [learning_curve.png](learning_curve.png): the learning curve (runs with a `hygiene:` block)",
              "- [final_summary.txt](final_summary.txt), [manifest.json](manifest.json)",
              "- [provenance/git.json](provenance/git.json): revision, branch, dirty flag, changed tracked files"
              + (" ([provenance/git.diff](provenance/git.diff): their diff against the revision)" if git.get("git") else ""),
              "- [provenance/environment.json](provenance/environment.json): Python, torch, CUDA, driver, "
              "installed packages",
              "- [provenance/inputs.json](provenance/inputs.json): the script's and the config's files with "
              "their SHA-256; `provenance/declared_inputs.jsonl`: inputs declared with `traceml.declare_input`",
              ""]
    return "\n".join(lines)


# -- the bundle ----------------------------------------------------------------------------------------
def _write_once(path: Path, data: bytes) -> None:
    try:
        atomic.atomic_write_bytes(path, data, exclusive=True)
    except FileExistsError:
        pass  # a bundle is never rewritten


def write_bundle(layout: RunDir, options: LaunchOptions, config: Any, hygiene: Optional[dict],
                 cwd: Optional[Path] = None) -> None:
    """Write ``README.md`` and ``provenance/`` into a fresh run's root; never raises (a problem warns)."""
    cwd = Path(os.path.abspath(cwd or Path.cwd()))
    try:
        git, diff = git_state(cwd)
        base = inputs.identity_base(cwd)
        in_repo = inputs.find_repo_root(cwd) is not None
        argv, notes = reproduce_argv(options, config, cwd, base)
        config_path = getattr(config, "path", None)
        config_name = inputs.relative_name(config_path, base)[0] if config_path is not None else None
        readme = readme_text(options.run_name, argv, notes, effective_config(options, config, hygiene, cwd, base),
                             git, config_name, time.time())
        _write_once(layout.git_json, atomic.dumps_json(git))
        if diff is not None:
            _write_once(layout.git_diff, diff)
        _write_once(layout.environment_json, atomic.dumps_json(environment()))
        _write_once(layout.inputs_json,
                    atomic.dumps_json(input_identities(cwd / options.script, config, hygiene, base, in_repo)))
        _write_once(layout.readme, readme.encode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - the bundle never costs the run its launch
        _warn(f"could not write the provenance bundle: {type(exc).__name__}: {exc}")
