"""The run directory: the only code that names or lists a run's paths.

```
<logs-dir>/<run-name>/
  manifest.json                         node 0, atomic
  README.md, provenance/                reproduction bundle: node 0, fresh runs only, never rewritten
    git.json, git.diff, environment.json, inputs.json
    declared_inputs.jsonl               appended by traceml.declare_input
    splits/<name>.json                  traceml.record_split: written once, checked on resume
  final_summary.json, final_summary.txt
  learning_curve.png, early_stopping.json
  nodes/node_<k>/guard_outcome.json     guarded runs
  nodes/node_<k>/launcher.lease         the node launcher's heartbeat (core/lease.py), atomic
  nodes/node_<k>/system.jsonl           ~1 Hz node samples
  nodes/node_<k>/training.stdout.log, training.stderr.log
  ranks/rank_<r>/steps-<attempt>.jsonl  one writer per file; a resume is a new attempt
  validation/requests|claims|receipts|failures/<checkpoint>….json
  checkpoints/                          published, immutable checkpoints
  recovery/rank_<r>/step-<n>.attempt-<a>.pt  rolling recovery saves (traceml.save_recovery)
  qc/batch_grid/<name>/step-<n>.json
  qc/gallery/<name>/step-<n>.json       exemplar galleries (sidecar; pages step-<n>[-p<k>of<m>].png)
```

Listing never follows a symbolic link and reports regular files only (see
docs/daemon.md, "what the daemon reads"): a link named ``rank_0`` or
``steps-0.jsonl`` is not a rank or a stream, wherever it points.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterator, NamedTuple, Optional

from traceml_tui.core import bounds

MANIFEST = "manifest.json"
SUMMARY_JSON = "final_summary.json"
SUMMARY_TXT = "final_summary.txt"
LEARNING_CURVE = "learning_curve.png"
EARLY_STOPPING = "early_stopping.json"
README = "README.md"
PROVENANCE = "provenance"
GIT_JSON = "git.json"
GIT_DIFF = "git.diff"
ENVIRONMENT_JSON = "environment.json"
INPUTS_JSON = "inputs.json"
DECLARED_INPUTS = "declared_inputs.jsonl"
NODES = "nodes"
RANKS = "ranks"
VALIDATION = "validation"
CHECKPOINTS = "checkpoints"
RECOVERY = "recovery"
SPLITS = "splits"
BATCH_GRID = "qc/batch_grid"
GALLERY = "qc/gallery"
OUTCOME = "guard_outcome.json"
LEASE = "launcher.lease"
SYSTEM = "system.jsonl"
STDOUT_LOG = "training.stdout.log"
STDERR_LOG = "training.stderr.log"
#: Backlog folders under ``validation/`` and the kind of file each holds.
BACKLOG_KINDS: dict[str, str] = {"requests": "request", "claims": "claim", "receipts": "receipt",
                                 "failures": "failure"}
#: The QC backlog's root (docs/qc.md, "Heavy QC through the backlog"): the same four folders as
#: ``validation/``, under the QC output root, handled by the same code with ``kind="qc"``.
QC_BACKLOG = "qc"
#: The two kinds of backlog and the folder each lives in (one implementation, two kinds).
BACKLOG_ROOTS: dict[str, str] = {VALIDATION: VALIDATION, QC_BACKLOG: QC_BACKLOG}
#: The index's side-file kind of each backlog file, by backlog and folder: validation's files are named by their
#: folder's kind (``request``…), the QC backlog's by the same kind after its root (``qc_request``…), so a query
#: of one backlog never sees the other's files (docs/daemon.md, "What the index stores").
BACKLOG_SIDE_KINDS: dict[str, dict[str, str]] = {
    VALIDATION: dict(BACKLOG_KINDS),
    QC_BACKLOG: {folder: f"{QC_BACKLOG}_{kind}" for folder, kind in BACKLOG_KINDS.items()},
}
#: Each backlog side-file kind's (backlog, folder): ``qc_receipt`` → (``qc``, ``receipts``).
BACKLOG_OF_SIDE_KIND: dict[str, tuple[str, str]] = {
    side: (backlog, folder) for backlog, kinds in BACKLOG_SIDE_KINDS.items() for folder, side in kinds.items()}

# ASCII digits only; the number must fit in 64 bits (core.bounds.parse_number), else the name is refused.
_STEPS_RE = re.compile(r"steps-([0-9]+)\.jsonl")
_RANK_RE = re.compile(r"rank_([0-9]+)")
_NODE_RE = re.compile(r"node_([0-9]+)")
#: A run name: one plain path component (no separators, no "..", no leading dot or dash).
_RUN_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_RUN_NAME_CHARS = 128
#: What makes a folder a run directory (not through links).
RUN_MARKERS = (MANIFEST, RANKS, NODES)
#: Folders inside a run that never hold another run (discovery does not descend into them).
RUN_SUBDIRS = frozenset({RANKS, NODES, VALIDATION, CHECKPOINTS, RECOVERY, PROVENANCE, "qc", "__pycache__"})


def validate_run_name(name: object) -> str:
    """Return ``name`` if it is a valid run name, else raise ``ValueError`` (one plain sentence).

    The one rule for run names, used by ``traceml run --run-name`` and
    ``traceml.init(run_name=...)`` alike: letters, digits, ``.``, ``_`` and
    ``-``, starting with a letter or digit, at most 128 characters — so a
    name is always exactly one folder under the logs folder (no ``/``, no
    ``..``, no trailing newline: the whole name must match).
    """
    if not isinstance(name, str) or _RUN_NAME_RE.fullmatch(name) is None:
        shown = (ascii(name[:80]) + ("…" if len(name) > 80 else "")) if isinstance(name, str) else type(name).__name__
        raise ValueError(
            f"run name {shown} is not a plain name (letters, digits, '.', '_', '-', starting with a letter "
            f"or digit; at most {MAX_RUN_NAME_CHARS} characters)"
        )
    return name


def middle_cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, cut in the middle (``guard-cand…-133543``): both ends stay readable."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    if width == 1:
        return "…"
    tail = (width - 1) // 2
    head = width - 1 - tail
    return f"{text[:head]}…{text[len(text) - tail:]}" if tail else text[:head] + "…"


def tail_cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, its end cut (``exit code 3: valid…``): the start is what reads."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[: width - 1] + "…"


def steps_file_name(attempt: int) -> str:
    """File name of one rank's step stream for one attempt."""
    return f"steps-{int(attempt)}.jsonl"


def rank_dir_name(rank: int) -> str:
    return f"rank_{int(rank)}"


def node_dir_name(node_rank: int) -> str:
    return f"node_{int(node_rank)}"


def _number_of(pattern: re.Pattern, name: str) -> Optional[int]:
    m = pattern.fullmatch(name)
    return bounds.parse_number(m.group(1)) if m else None


def parse_steps_name(name: str) -> Optional[int]:
    """The attempt number of a ``steps-<n>.jsonl`` file name, else None (also for a number beyond 64 bits)."""
    return _number_of(_STEPS_RE, name)


def parse_rank_name(name: str) -> Optional[int]:
    """The rank of a ``rank_<r>`` folder name, else None (also for a number beyond 64 bits)."""
    return _number_of(_RANK_RE, name)


def parse_node_name(name: str) -> Optional[int]:
    """The node of a ``node_<k>`` folder name, else None (also for a number beyond 64 bits)."""
    return _number_of(_NODE_RE, name)


_NAME_KINDS = {"attempt": _STEPS_RE, "rank": _RANK_RE, "node": _NODE_RE}


def name_problem(name: str, kind: str) -> Optional[str]:
    """Why a name shaped like a stream (``kind`` ``attempt``), rank or node name is refused (its number is
    beyond 64 bits); None for every other name: ``steps-99999999999999999999.jsonl`` is a damaged name of
    ours, ``notes.txt`` is not one of ours at all."""
    m = _NAME_KINDS[kind].fullmatch(name)
    if m and bounds.parse_number(m.group(1)) is None:
        return f"{kind} number {middle_cut(m.group(1), 24)} is beyond the 64-bit range the index stores; not read"
    return None


class StepFile(NamedTuple):
    """One rank's step stream of one attempt."""

    rank: int
    attempt: int
    path: Path


class StreamFile(NamedTuple):
    """A JSONL stream of a run, relative to the run directory."""

    rel: str
    stream: str  # "steps" (a rank file) or "system" (a node file)
    rank: Optional[int]
    attempt: Optional[int]
    node: Optional[int]


def name_not_utf8(name: str) -> Optional[str]:
    """Why a file or folder name cannot be kept as text (its bytes are not UTF-8: ``os`` hands them over as
    lone surrogates, which no index, JSON or terminal takes); None for a name that is fine."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "the name is not valid UTF-8; not read"
    return None


def shown_name(name: str) -> str:
    """``name`` as text that can always be stored and printed: bytes that are not UTF-8 as ``\\xNN``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class RefusedName(NamedTuple):
    """A stream file or a rank/node folder whose name traceml cannot use (:func:`name_problem`)."""

    rel: str
    problem: str


class Listing(NamedTuple):
    """What :meth:`RunDir.scan` found: streams and side files to read, and names refused."""

    streams: list[StreamFile]
    sides: list[SideFile]
    refused: list[RefusedName]


class SideFile(NamedTuple):
    """A JSON side file of a run, relative to the run directory."""

    rel: str
    kind: str  # manifest | summary | early_stopping | outcome | lease | request | claim | receipt | failure
    key: Optional[str]  # checkpoint id (backlog) or node rank (outcome, lease)
    size: int
    mtime_ns: int


def _scandir(path: os.PathLike[str] | str) -> list[os.DirEntry]:
    """Entries of a real folder; a link in its place (or anything else) lists nothing."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return []
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _regular_stat(entry: os.DirEntry) -> Optional[os.stat_result]:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _real_dir(base: Path, *parts: str) -> Optional[Path]:
    """``base/parts…`` when every component below ``base`` is a real folder (no link on the way), else None."""
    path = base
    for part in parts:
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return None
        except OSError:
            return None
    return path


def _numbered_dirs(parent: Path, parse, refused: Optional[list] = None,
                   kind: str = "") -> list[tuple[int, os.DirEntry]]:
    """``(number, entry)`` of the numbered folders under ``parent``, by number; a folder whose name's
    number is out of range goes to ``refused`` (as a :class:`RefusedName` under ``kind``'s folder)."""
    out = []
    for entry in _scandir(parent):
        n = parse(entry.name)
        if n is not None and _is_dir(entry):
            out.append((n, entry))
        elif n is None and refused is not None and (problem := name_problem(entry.name, kind)) is not None:
            refused.append(RefusedName(f"{parent.name}/{entry.name}", problem))
    return sorted(out, key=lambda t: t[0])


def is_run_dir(path: os.PathLike[str] | str) -> bool:
    """A run directory holds a manifest or a ``ranks``/``nodes`` folder (not through links)."""
    for name in RUN_MARKERS:
        try:
            st = os.lstat(os.path.join(path, name))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            return True
    return False


def run_dir_problem(path: os.PathLike[str] | str, *, backlog: bool = False) -> Optional[str]:
    """Why ``path`` cannot be used as a run directory, in one line; None when it can.

    Commands that act on one run (``traceml curve``, ``traceml validate``) refuse
    anything else: an empty or unrelated folder (a mistyped logs dir) would
    otherwise get a curve of nothing or a backlog that reports success forever.
    ``backlog``: a folder holding only a ``validation/`` backlog (the SDK's
    ``publish_checkpoint`` without a run) counts too.
    """
    if not os.path.isdir(path):
        return f"run directory {os.fspath(path)} {'is not a folder' if os.path.exists(path) else 'does not exist'}"
    if is_run_dir(path) or (backlog and os.path.isdir(os.path.join(path, VALIDATION, "requests"))):
        return None
    markers = "manifest.json, ranks/ or nodes/" + (" or validation/requests/" if backlog else "")
    return f"{os.fspath(path)} is not a run directory (no {markers})"


@dataclass(frozen=True)
class RunDir:
    """Every path of one run, and the listings of its ranks, nodes and backlog."""

    path: Path

    def __init__(self, path: os.PathLike[str] | str) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def name(self) -> str:
        return self.path.name

    # -- run-level files
    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST

    @property
    def summary_json(self) -> Path:
        return self.path / SUMMARY_JSON

    @property
    def summary_txt(self) -> Path:
        return self.path / SUMMARY_TXT

    @property
    def learning_curve(self) -> Path:
        return self.path / LEARNING_CURVE

    @property
    def early_stopping(self) -> Path:
        return self.path / EARLY_STOPPING

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    # -- reproduction bundle (docs/run.md, "Provenance bundle")
    @property
    def readme(self) -> Path:
        return self.path / README

    @property
    def provenance(self) -> Path:
        return self.path / PROVENANCE

    @property
    def git_json(self) -> Path:
        return self.provenance / GIT_JSON

    @property
    def git_diff(self) -> Path:
        return self.provenance / GIT_DIFF

    @property
    def environment_json(self) -> Path:
        return self.provenance / ENVIRONMENT_JSON

    @property
    def inputs_json(self) -> Path:
        return self.provenance / INPUTS_JSON

    @property
    def declared_inputs(self) -> Path:
        """Appended by ``traceml.declare_input`` (core/inputs.py), one line per declared input."""
        return self.provenance / DECLARED_INPUTS

    @property
    def splits(self) -> Path:
        """``traceml.record_split``'s records, one write-once ``<name>.json`` per split (sdk/split.py)."""
        return self.provenance / SPLITS

    def recovery_dir(self, rank: int) -> Path:
        """One rank's rolling recovery saves (sdk/recovery.py)."""
        return self.path / RECOVERY / rank_dir_name(rank)

    def bundle_files(self) -> list[Path]:
        """The reproduction bundle's files that exist (regular files only, no links), by path."""
        out = [self.readme] if _is_regular(self.readme) else []
        real = _real_dir(self.path, PROVENANCE)
        for entry in _scandir(real) if real is not None else ():
            if not entry.name.startswith(".") and _regular_stat(entry) is not None:
                out.append(Path(entry.path))
        return sorted(out)

    @property
    def batch_grid(self) -> Path:
        return self.path / BATCH_GRID

    def checkpoint_file(self, checkpoint: str, suffix: str = ".pt") -> Path:
        """A published checkpoint's file (immutable once published)."""
        return self.checkpoints / f"{checkpoint}{suffix}"

    @property
    def gallery(self) -> Path:
        return self.path / GALLERY

    def grid_files(self) -> list[Path]:
        """Every batch-grid page description (``qc/batch_grid/<name>/step-<n>.json``), by path; no links."""
        return self._figure_files(BATCH_GRID)

    def gallery_files(self) -> list[Path]:
        """Every exemplar gallery's sidecar (``qc/gallery/<name>/step-<n>.json``), by path; no links."""
        return self._figure_files(GALLERY)

    def _figure_files(self, folder: str) -> list[Path]:
        out = []
        grid = _real_dir(self.path, *folder.split("/"))
        for name in _scandir(grid) if grid is not None else ():
            if not _is_dir(name):
                continue
            for f in _scandir(name.path):
                if f.name.startswith("step-") and f.name.endswith(".json") and _regular_stat(f) is not None:
                    out.append(Path(f.path))
        return sorted(out)

    def export_cursor(self, destination: str, project: str) -> Path:
        """Where an export to ``destination`` (e.g. ``trackio``) keeps its cursor for ``project``."""
        return self.path / "export" / f"{destination}-{project}.json"

    # -- nodes
    @property
    def nodes(self) -> Path:
        return self.path / NODES

    def node_dir(self, node_rank: int) -> Path:
        return self.nodes / node_dir_name(node_rank)

    def outcome(self, node_rank: int) -> Path:
        return self.node_dir(node_rank) / OUTCOME

    def lease(self, node_rank: int) -> Path:
        """The node launcher's heartbeat file (core/lease.py): replaced atomically every few seconds."""
        return self.node_dir(node_rank) / LEASE

    def system(self, node_rank: int) -> Path:
        return self.node_dir(node_rank) / SYSTEM

    def stdout_log(self, node_rank: int) -> Path:
        return self.node_dir(node_rank) / STDOUT_LOG

    def stderr_log(self, node_rank: int) -> Path:
        return self.node_dir(node_rank) / STDERR_LOG

    def node_ranks(self) -> list[int]:
        """Node numbers that have a folder (sorted; links are not nodes)."""
        return [n for n, _ in _numbered_dirs(self.nodes, parse_node_name)]

    def system_files(self) -> list[tuple[int, Path]]:
        """(node, ``system.jsonl``) for each node that has one (regular files only)."""
        out = []
        for node, entry in _numbered_dirs(self.nodes, parse_node_name):
            path = Path(entry.path) / SYSTEM
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    out.append((node, path))
            except OSError:
                continue
        return out

    # -- ranks
    @property
    def ranks(self) -> Path:
        return self.path / RANKS

    def rank_dir(self, rank: int) -> Path:
        return self.ranks / rank_dir_name(rank)

    def steps_file(self, rank: int, attempt: int) -> Path:
        return self.rank_dir(rank) / steps_file_name(attempt)

    def step_files(self, rank: Optional[int] = None) -> list[StepFile]:
        """Every rank's step streams (or one rank's), by rank then attempt; regular files only."""
        out = []
        for r, entry in _numbered_dirs(self.ranks, parse_rank_name):
            if rank is not None and r != rank:
                continue
            for f in _scandir(entry.path):
                attempt = parse_steps_name(f.name)
                if attempt is not None and _regular_stat(f) is not None:
                    out.append(StepFile(r, attempt, Path(f.path)))
        out.sort(key=lambda s: (s.rank, s.attempt))
        return out

    def rank_numbers(self) -> list[int]:
        return [r for r, _ in _numbered_dirs(self.ranks, parse_rank_name)]

    # -- validation backlog
    @property
    def validation(self) -> Path:
        return self.path / VALIDATION

    def backlog_dir(self, folder: str, kind: str = VALIDATION) -> Path:
        """One backlog folder: ``requests``, ``claims``, ``receipts`` or ``failures`` of ``kind``
        (``validation``, or ``qc`` for the QC backlog: :data:`BACKLOG_ROOTS`)."""
        if folder not in BACKLOG_KINDS:
            raise ValueError(f"unknown backlog folder {folder!r}")
        if kind not in BACKLOG_ROOTS:
            raise ValueError(f"unknown backlog kind {kind!r}")
        return self.path / BACKLOG_ROOTS[kind] / folder

    def request(self, checkpoint: str, kind: str = VALIDATION) -> Path:
        return self.backlog_dir("requests", kind) / f"{checkpoint}.json"

    def claim(self, checkpoint: str, kind: str = VALIDATION) -> Path:
        return self.backlog_dir("claims", kind) / f"{checkpoint}.json"

    def receipt(self, checkpoint: str, kind: str = VALIDATION) -> Path:
        return self.backlog_dir("receipts", kind) / f"{checkpoint}.json"

    def failure(self, checkpoint: str, attempt: int, kind: str = VALIDATION) -> Path:
        return self.backlog_dir("failures", kind) / f"{checkpoint}-{int(attempt)}.json"

    @property
    def drainer_log(self) -> Path:
        """The log of the drainer the launcher or training dispatches."""
        return self.validation / "drainer.log"

    def drainer_log_of(self, kind: str = VALIDATION) -> Path:
        """The dispatched drainer's log of a backlog ``kind`` (``validation/drainer.log``, ``qc/drainer.log``)."""
        return self.path / BACKLOG_ROOTS[kind] / "drainer.log"

    @property
    def record_lock(self) -> Path:
        """The lock taken while a drainer brings an ended run's record up to date (hidden: never a backlog file)."""
        return self.validation / ".record.lock"

    def claim_lock(self, checkpoint: str, kind: str = VALIDATION) -> Path:
        """The lock taken while a stale claim of ``checkpoint`` is broken (hidden: never a backlog file)."""
        return self.backlog_dir("claims", kind) / f".{checkpoint}.break"

    def backlog_files(self, folder: str, kind: str = VALIDATION, skip: Collection[str] = ()) -> list[Path]:
        """The JSON files of one backlog folder of ``kind`` (regular files, no hidden temp files), by name,
        but those whose name without ``.json`` is in ``skip`` (not even looked at: early stopping asks every
        update, and a long run's folder holds thousands)."""
        out = []
        real = _real_dir(self.path, BACKLOG_ROOTS[kind], folder) if folder in BACKLOG_KINDS else None
        for entry in _scandir(real) if real is not None else ():
            name = entry.name
            if not name.endswith(".json") or name.startswith(".") or (skip and name[:-5] in skip):
                continue
            if _regular_stat(entry) is not None:
                out.append((name, entry.path))
        out.sort()  # by name: one folder's paths sort as their names do
        return [Path(path) for _, path in out]

    # -- one listing of everything the daemon ingests
    def scan(self) -> Listing:
        """The run's JSONL streams and JSON side files, relative to it (regular files only, no links), and
        the stream, rank and node names it refuses (:func:`name_problem`)."""
        streams: list[StreamFile] = []
        sides: list[SideFile] = []
        refused: list[RefusedName] = []

        def side(entry: os.DirEntry, rel: str, kind: str, key: Optional[str]) -> None:
            st = _regular_stat(entry)
            if st is not None:
                sides.append(SideFile(rel, kind, key, st.st_size, st.st_mtime_ns))

        for entry in _scandir(self.path):
            if entry.name == MANIFEST:
                side(entry, MANIFEST, "manifest", None)
            elif entry.name == SUMMARY_JSON:
                side(entry, SUMMARY_JSON, "summary", None)
            elif entry.name == EARLY_STOPPING:
                side(entry, EARLY_STOPPING, "early_stopping", None)
        for rank, rank_entry in _numbered_dirs(self.ranks, parse_rank_name, refused, "rank"):
            for f in _scandir(rank_entry.path):
                attempt = parse_steps_name(f.name)
                if attempt is not None and _regular_stat(f) is not None:
                    streams.append(StreamFile(f"{RANKS}/{rank_entry.name}/{f.name}", "steps", rank, attempt, None))
                elif attempt is None and (problem := name_problem(f.name, "attempt")) is not None:
                    refused.append(RefusedName(f"{RANKS}/{rank_entry.name}/{f.name}", problem))
        for node, node_entry in _numbered_dirs(self.nodes, parse_node_name, refused, "node"):
            for f in _scandir(node_entry.path):
                rel = f"{NODES}/{node_entry.name}/{f.name}"
                if f.name == SYSTEM and _regular_stat(f) is not None:
                    streams.append(StreamFile(rel, "system", None, None, node))
                elif f.name == OUTCOME:
                    side(f, rel, "outcome", str(node))
                elif f.name == LEASE:
                    side(f, rel, "lease", str(node))
        for backlog, kinds in BACKLOG_SIDE_KINDS.items():  # the validation and the QC backlog, by one rule
            root = BACKLOG_ROOTS[backlog]
            for folder, kind in kinds.items():
                real = _real_dir(self.path, root, folder)
                for f in _scandir(real) if real is not None else ():
                    if f.name.endswith(".json") and not f.name.startswith("."):
                        rel = f"{root}/{folder}/{f.name}"
                        problem = name_not_utf8(f.name)
                        if problem is None:
                            side(f, rel, kind, f.name[: -len(".json")])
                        else:
                            refused.append(RefusedName(rel, problem))
        return Listing(streams, sides, refused)


def discover_runs(root: os.PathLike[str] | str, max_depth: int = 4) -> Iterator[str]:
    """Run directories at most ``max_depth`` levels below ``root`` (the root itself included); no links."""
    stack = [(os.fspath(root), 0)]
    while stack:
        path, depth = stack.pop()
        if is_run_dir(path):
            yield path
            continue  # runs do not nest
        if depth >= max_depth:
            continue
        for entry in _scandir(path):
            if entry.name.startswith(".") or entry.name in RUN_SUBDIRS:
                continue
            if _is_dir(entry):
                stack.append((entry.path, depth + 1))


def run_dir_of(path: str, run_dirs) -> Optional[str]:
    """The known run directory (a key of ``run_dirs``) that holds ``path``, if any."""
    probe = path
    while probe and probe != os.path.dirname(probe):
        if probe in run_dirs:
            return probe
        probe = os.path.dirname(probe)
    return None


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def open_under(root: os.PathLike[str] | str, path: os.PathLike[str] | str) -> int:
    """Open ``path`` for reading only if no component between ``root`` and it is a link; return the descriptor.

    Each folder below ``root`` is opened relative to its parent's descriptor
    with ``O_NOFOLLOW|O_DIRECTORY``, and the file itself with ``O_NOFOLLOW|O_NONBLOCK``
    (a FIFO never blocks; the caller checks ``fstat`` for a regular file). A
    folder swapped for a link after discovery raises ``OSError`` instead of
    leading outside the root (docs/security.md). ``root`` itself is trusted as given.
    """
    rel = os.path.relpath(os.fspath(path), os.fspath(root))
    parts = rel.split(os.sep)
    if rel.startswith("..") or os.path.isabs(rel) or "" in parts:
        raise OSError(f"{path} is not under {root}")
    fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)

