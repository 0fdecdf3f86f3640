"""Publish a run directory to Trackio as a derived index, incrementally and idempotently.

The run directory stays authoritative. :func:`plan_export` reads what is new
since the cursor (training steps, evaluations, receipts, field QC, the learning
curve, batch grids) into a :class:`Delivery`; :func:`export_run` sends it
through a :class:`Sink` and only then advances the cursor. Nothing new → the
sink is not even opened. A sink failure (server outage) raises
:class:`SinkUnavailable`; the cursor is unchanged and the next export retries.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

from traceml_tui.core import records
from traceml_tui.core.rundir import RunDir
from traceml_tui.core.state import BacklogState
from traceml_tui.export import cursor as cursor_mod
from traceml_tui.export import mapping, readback

#: Readout statuses counted as pending or failed: eval records' ``pending``/``failed`` and the backlog's words.
_PENDING = frozenset({BacklogState.PENDING.value, BacklogState.CLAIMED.value, BacklogState.STALE_CLAIM.value})
_FAILED = frozenset({BacklogState.FAILED.value, BacklogState.BLOCKED.value})


class SinkUnavailable(RuntimeError):
    """The tracking destination could not take the delivery; local results are untouched."""


class Sink(Protocol):
    """Where a delivery goes (Trackio, or a test double)."""

    def open(self, *, project: str, run: str, group: str, config: dict) -> None: ...
    def log(self, points: dict[str, Any], step: int) -> None: ...
    def table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None: ...
    def image(self, key: str, path: Path, step: int, caption: str) -> None: ...
    def close(self) -> None: ...


@dataclass
class Registration:
    project: str
    group: str
    description: str
    server_url: Optional[str] = None

    def config(self, run_dir: Path) -> dict:
        lane, manager = mapping.lane_and_manager(self.project)
        return {
            "description": self.description,
            "manager": manager,
            "lane": lane,
            # the seed asks for the experiment directory in the run config: it is the authoritative output root
            "experiment_dir": str(Path(run_dir).resolve()),
            "step_metric": mapping.STEP_METRIC,
            "metric_mapping": mapping.MAPPING,
            "exporter": "traceml export trackio",
        }

    def registered(self) -> dict:
        """What the cursor remembers of the registration: a change is published even with no new record."""
        return {"description": self.description, "group": self.group}


@dataclass
class Delivery:
    points: dict[int, dict[str, float]] = field(default_factory=dict)
    tables: list[tuple[str, list[str], list[list[Any]], int]] = field(default_factory=list)
    images: list[tuple[str, Path, int, str]] = field(default_factory=list)
    malformed: int = 0  # complete step-file lines that are not records: skipped, counted, never invented

    def add(self, step: int, values: dict[str, float]) -> None:
        if values:
            self.points.setdefault(int(step), {}).update(values)

    @property
    def empty(self) -> bool:
        return not (self.points or self.tables or self.images)

    def counts(self) -> dict[str, int]:
        return {"points": sum(len(v) for v in self.points.values()), "tables": len(self.tables),
                "images": len(self.images), "malformed": self.malformed}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


#: Columns of the readouts table; "examples evaluated" is the readout's denominator (seed 004).
READOUT_COLUMNS = ("checkpoint", "step", "role", "split", "status", "metrics", "examples evaluated")
#: The metric key a validation worker (or ``traceml.log_eval``) reports its denominator under.
DENOMINATOR_KEY = "examples"


def denominator(metrics: Optional[dict]) -> str:
    """Examples evaluated for one readout, when the worker reported them (``examples``); else ``unavailable``."""
    value = metrics.get(DENOMINATOR_KEY) if isinstance(metrics, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        return str(int(value)) if float(value).is_integer() else str(value)
    return "unavailable"


def _at(step: int, points: Any, *args: Any) -> dict[str, float]:
    """``points(*args)``, a key collision naming the step of the record it is in (the line says where to look)."""
    try:
        return points(*args)
    except mapping.KeyCollision as exc:
        raise mapping.KeyCollision(f"step {step}: {exc}; nothing of this run was published") from None


def plan_export(run_dir: Path, cur: cursor_mod.Cursor) -> tuple[Delivery, cursor_mod.Cursor]:
    """What to send since ``cur``, and the cursor to store once it is delivered."""
    from traceml_tui.hygiene import batch_grid, field_qc

    run_dir = Path(run_dir)
    layout = RunDir(run_dir)
    new = cur.copy()
    out = Delivery()
    files = list(cursor_mod.iter_step_files(run_dir))
    lead_rank = min((rank for rank, _ in files), default=0)  # charts follow one rank; others repeat it
    last_step = int(cur.counters.get("updates") or 0)
    examples: Optional[int] = cur.counters.get("examples")
    batch_sizes = set(cur.counters.get("batch_sizes") or ())
    for rank, path in files:
        rel = path.relative_to(run_dir).as_posix()
        lines, state = cursor_mod.read_new_lines(path, cur.files.get(rel))
        prev_examples: Optional[int] = None
        for line in lines:
            try:
                rec = records.decode(line)
            except (records.RecordError, RecursionError):  # RecursionError: a line nested too deeply
                out.malformed += 1  # an error to report (seed 004: malformed records remain errors), never a value
                continue
            if rank != lead_rank:
                continue
            if isinstance(rec, records.Step):
                if rec.step > new.train_step:
                    out.add(rec.step, _at(rec.step, mapping.step_points, rec))
                    new.train_step = rec.step
                last_step = max(last_step, rec.step)
                if rec.examples is not None:
                    if prev_examples is not None and rec.examples > prev_examples:
                        batch_sizes.add(rec.examples - prev_examples)
                    prev_examples = examples = rec.examples
            elif isinstance(rec, records.Eval):
                role = mapping.normalize_role(rec.role)
                if rec.status == "completed":
                    for key, value in _at(rec.step, mapping.eval_points, rec.metrics, role).items():
                        if f"{key}@{rec.step}" not in new.delivered:
                            out.add(rec.step, {key: value})
                            new.delivered.add(f"{key}@{rec.step}")
                new.readouts[f"{rec.checkpoint or ''}@{rec.step}/{role}/{rec.split or ''}"] = [
                    rec.checkpoint or "", rec.step, role, rec.split or "", rec.status,
                    ", ".join(f"{k}={'unavailable' if v is None else v}" for k, v in sorted(rec.metrics.items())),
                    denominator(rec.metrics),
                ]
            elif isinstance(rec, records.FieldStats):
                for key, value in mapping.field_points(rec).items():
                    if f"{key}@{rec.step}" not in new.delivered:
                        out.add(rec.step, {key: value})
                        new.delivered.add(f"{key}@{rec.step}")
        if state is not None:
            new.files[rel] = state
    malformed = int(cur.counters.get("malformed") or 0) + out.malformed
    new.counters = {"updates": last_step, "examples": examples, "batch_sizes": sorted(batch_sizes),
                    "malformed": malformed}
    readouts: dict[str, list[Any]] = dict(new.readouts)

    # validation backlog: each request's state is core.state.decide_backlog's word (hygiene.backlog.backlog_status);
    # only a receipt is a result
    from traceml_tui.hygiene import backlog

    for row in backlog.backlog_status(run_dir)["requests"]:
        ckpt = row["checkpoint"]
        step = row["step"] if isinstance(row["step"], int) else 0
        status = row["state"]
        if status == BacklogState.COMPLETED:
            metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
            for key, value in _at(step, mapping.eval_points, metrics, "eval").items():
                if f"{key}@{step}" not in new.delivered:
                    out.add(step, {key: value})
                    new.delivered.add(f"{key}@{step}")
            detail = ", ".join(f"{k}={'unavailable' if v is None else v}" for k, v in sorted(metrics.items()))
        else:
            detail = str(row.get("last_error") or "")[:200]
        readouts[f"{ckpt}@{step}/backlog"] = [ckpt, step, "eval", "validation", status, detail,
                                              denominator(row.get("metrics") if status == BacklogState.COMPLETED else None)]

    # counters and readouts: information tables, re-sent only when their content changes
    pending = sum(1 for row in readouts.values() if row[4] in _PENDING)
    failed = sum(1 for row in readouts.values() if row[4] in _FAILED)
    stopping = backlog.read_early_stopping(layout.early_stopping) or {}
    qc = field_qc.summarize_records(field_qc.load_field_records(run_dir)) if any(
        k.startswith("qc/field/") for k in new.delivered) else {"failed_fields": []}
    info_rows = [
        ["optimizer updates", last_step],
        ["examples seen", "unavailable" if examples is None else examples],
        ["batch size", "unavailable" if not batch_sizes else ", ".join(str(b) for b in sorted(batch_sizes))],
        ["epochs completed", "unavailable (not recorded)"],
        ["pending readouts", pending],
        ["failed readouts", failed],
        ["newest completed checkpoint", max((r[0] for r in readouts.values() if r[4] == "completed" and r[0]),
                                            default="none")],
        ["selected best checkpoint", stopping.get("best_checkpoint") or "none"],
        ["eval use", "validation drives checkpoint selection and early stopping: not an untouched test"],
        ["field QC failures", ", ".join(qc["failed_fields"]) or "none"],
        ["QC required items", _qc_items(layout)],
        ["worker QC", _worker_qc(layout)],
        ["malformed step lines skipped", malformed],
        ["step metric", mapping.STEP_METRIC],
    ]
    # rows from a cursor of an older exporter have no denominator column yet
    rows_readouts = [list(readouts[k]) + ["unavailable"] * (len(READOUT_COLUMNS) - len(readouts[k]))
                     for k in sorted(readouts, key=lambda k: (readouts[k][1], k))]
    for key, columns, rows in (("info/run", ["quantity", "value"], info_rows),
                               ("info/readouts", list(READOUT_COLUMNS), rows_readouts)):
        digest = _digest(rows)
        if rows and cur.tables.get(key) != digest:
            out.tables.append((key, columns, [[str(c) for c in r] for r in rows], last_step))
            new.tables[key] = digest

    curve = layout.learning_curve
    if curve.is_file():
        digest = hashlib.sha256(curve.read_bytes()).hexdigest()[:16]
        if digest != cur.curve:
            out.images.append(("curve/learning_curve", curve, last_step, "canonical learning curve"))
            new.curve = digest
    for grid in batch_grid.list_grids(run_dir):
        ident = grid["layout_file"]
        if ident in new.grids:
            continue
        for page, path in enumerate(_pages(run_dir, grid, ident), start=1):
            caption = f"batch {grid.get('batch_id')} ({grid.get('members')} members), page {page}/{grid.get('pages')}"
            out.images.append((f"qc/batch_grid/{grid.get('name')}", path, _step_of(grid), caption))
        _add_measures(out, new, "batch_grid", grid, grid.get("measures"))
        new.grids.add(ident)
    from traceml_tui.hygiene import gallery  # exemplar galleries: their pages, and their measures as qc metrics

    for shown in gallery.list_galleries(run_dir):
        ident = shown["sidecar_file"]
        if ident in new.grids:
            continue
        groups = shown.get("groups") if isinstance(shown.get("groups"), list) else []
        counts = ", ".join(f"{g.get('name')} {g.get('available')}" for g in groups if isinstance(g, dict))
        for page, path in enumerate(_pages(run_dir, shown, ident), start=1):
            out.images.append((f"qc/gallery/{shown.get('name')}", path, _step_of(shown),
                               f"available: {counts}; page {page}/{shown.get('pages')}"))
        measures = shown.get("measures") if isinstance(shown.get("measures"), dict) else {}
        _add_measures(out, new, "gallery", shown, measures.get("overall"))
        new.grids.add(ident)
    return out, new


def _qc_items(layout: RunDir) -> str:
    """The bound QC block's required items as the run's summary judged them (words: hygiene/qc_block.py)."""
    from traceml_tui.core import artifacts
    from traceml_tui.hygiene.qc_block import items_word

    def read(path: Path) -> Optional[bytes]:
        try:
            return path.read_bytes() if path.is_file() else None
        except OSError:
            return None

    summary = artifacts.decode_summary(read(layout.summary_json))
    manifest = artifacts.decode_manifest(read(layout.manifest))
    declared = manifest.hygiene_block.get("qc") if manifest is not None else None
    bound = isinstance(declared, dict) and isinstance(declared.get("items"), dict)
    return items_word(summary.qc if summary is not None else None, bound)


def _worker_qc(layout: RunDir) -> str:
    """The heavy QC backlog beside validation's readouts (docs/qc.md): its word and counts as every surface shows
    them (:func:`traceml_tui.hygiene.qc_backlog.worker_qc_report`), or why there is none."""
    from traceml_tui.hygiene import qc_backlog

    try:
        declared = qc_backlog.declared_worker(qc_backlog.manifest_qc(layout.path))
    except OSError:
        declared = None
    if declared is None:
        return "not required (hygiene.qc.items.worker_qc)"
    report = qc_backlog.worker_qc_report(layout.path)
    counts = f"{report['completed']}/{report['requested']} QC requests completed"
    line = qc_backlog.not_passed_line(report)
    return f"passed, {counts}" if line is None else f"{line}; {counts}"


def _pages(run_dir: Path, figure: dict, own: str) -> list[Path]:
    """The page PNGs a figure's JSON lists, kept only when each is a regular file in the JSON's own folder.

    The list is read back from a file in the run directory: a path out of that
    folder (absolute, ``..``, a link) is never linked into the store.
    """
    folder = (run_dir / own).parent
    files = figure.get("files")
    out = []
    for rel in files if isinstance(files, list) else ():
        if not isinstance(rel, str) or not rel.endswith(".png"):
            continue
        path = run_dir / rel
        if path.parent == folder and ".." not in Path(rel).parts and not path.is_symlink() and path.is_file():
            out.append(path)
    return out


def _step_of(figure: dict) -> int:
    step = figure.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else 0


def _add_measures(out: Delivery, new: cursor_mod.Cursor, kind: str, figure: dict, measures: Any) -> None:
    """A QC figure's health measures as ``qc``-role points at its step, each delivered once."""
    step = _step_of(figure)
    for key, value in _at(step, mapping.measure_points, kind, str(figure.get("name")), measures).items():
        if f"{key}@{step}" not in new.delivered:
            out.add(step, {key: value})
            new.delivered.add(f"{key}@{step}")


def export_run(run_dir: Path, registration: Registration, sink: Sink, *,
               cursor_dir: Optional[Path] = None, run_name: Optional[str] = None) -> dict[str, int]:
    """Deliver what is new in one run; return the counts sent (all zero when nothing was new).

    ``run_name`` is the Trackio run (default: the folder's name). Raises
    :class:`IdentityCollision` before sending anything when that Trackio run or
    its cursor belongs to another run directory, :class:`SinkUnavailable` when
    the destination fails (the cursor then stays where it was, so nothing is
    lost and nothing is skipped), :class:`DescriptionMismatch` when the
    description or group read back is not the one given, :class:`MeasurementMismatch`
    when the first measurements read back differ from those sent, and
    :class:`mapping.KeyCollision` (before sending anything) when two source keys
    of one record would publish one key.
    """
    run_dir = Path(run_dir)
    here = str(run_dir.resolve())
    name = run_name or run_dir.resolve().name
    path = cursor_mod.cursor_path(run_dir, registration.project, cursor_dir, name)
    fresh = not path.exists()
    cur = cursor_mod.load(path)
    _check_cursor(cur, path, here, name, registration.project, shared=cursor_dir is not None)
    registered = registration.registered()
    base = cur
    if cur.registration != registered:
        # Trackio stores a run's config (description, group) with a logged entry, never alone: re-sending
        # the information table carries the new one, so a changed role reaches the tooltip (docs/export.md).
        base = cur.copy()
        base.tables.pop("info/run", None)
    delivery, new = plan_export(run_dir, base)
    new.experiment_dir, new.run_name, new.registration = here, name, cur.registration
    if delivery.empty:
        if new.to_json() != cur.to_json():
            cursor_mod.save(path, new)  # e.g. offsets past lines that held nothing to publish
        return {**delivery.counts(), "registration": 0}
    if fresh or (cursor_dir is not None and cur.experiment_dir is None):
        # a cursor inside the run directory is that run's own; a new or shared one may meet another's Trackio run
        _check_store(sink, registration.project, name, here)
    try:
        sink.open(project=registration.project, run=name, group=registration.group,
                  config=registration.config(run_dir))
        for step in sorted(delivery.points):
            sink.log(delivery.points[step], step)
        for key, columns, rows, step in delivery.tables:
            sink.table(key, columns, rows, step)
        for key, file, step, caption in delivery.images:
            sink.image(key, file, step, caption)
        sink.close()
    except SinkUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the destination is an outage to retry
        raise SinkUnavailable(f"{type(exc).__name__}: {exc}") from None
    cursor_mod.save(path, new)  # what was delivered stays delivered, whatever the read-back says
    # the first measurements: the first delivery that holds points (a --follow pass before the first step
    # sends only tables, and the steps come later)
    first = cur.train_step == 0 and not cur.delivered
    verified, differ = _read_back(sink, registration, name, delivery, first=first)
    new.registration = registered  # read back: a later export need not send the registration again
    cursor_mod.save(path, new)
    if differ:  # said once, after the first publish; what was delivered stays delivered
        raise MeasurementMismatch(differ)
    counts = delivery.counts()
    counts["registration"] = int(cur.registration is not None and cur.registration != registered)
    counts["verified"] = verified
    return counts


def _read_back(sink: Sink, registration: Registration, name: str, delivery: Delivery, *,
               first: bool) -> tuple[int, str]:
    """Check, through Trackio's API, the stored description and group, and (``first``) the first measurements.

    Returns how many measurements were read back equal, and the one line that
    says how they differ ("" when they do not). Raises :class:`DescriptionMismatch`
    when Trackio stored another description or group, :class:`SinkUnavailable`
    when it could not be asked (the cursor then keeps the old registration, so
    the next export asks again). A sink that cannot be read back (a test double)
    is not checked.
    """
    read_config = getattr(sink, "saved_config", None)
    read_values = getattr(sink, "stored_values", None)
    if read_config is None:
        return 0, ""
    project = registration.project
    try:
        saved = read_config(project, name)
        wrong = [f"{what} {str(saved.get(key))[:80]!r}" for what, key, want in
                 (("description", "description", registration.description), ("group", GROUP_KEY, registration.group))
                 if saved.get(key) != want]
        if wrong:  # the cursor keeps the old registration: the next export sends it again
            raise DescriptionMismatch(f"Trackio stored the {' and the '.join(wrong)}, not the one given; "
                                      "the run's config was not updated")
        if not (first and read_values is not None and delivery.points):
            return 0, ""
        step = min(delivery.points)  # the first measurements this run published (seed 004: verify them)
        sent = delivery.points[step]
        differ = readback.differences(sent, read_values(project, name, step))
    except readback.ReadBackUnavailable as exc:
        raise SinkUnavailable(f"delivered, but Trackio could not be read back ({exc})") from None
    if differ:
        more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
        return 0, f"Trackio's first measurements (step {step}) differ from those sent: {differ[0]}{more}"
    return len(sent), ""


#: Where Trackio keeps a run's group inside its stored config (trackio 0.43 ``Run.__init__``).
GROUP_KEY = "_Group"


def _check_cursor(cur: cursor_mod.Cursor, path: Path, here: str, name: str, project: str, *, shared: bool) -> None:
    """Refuse a cursor that belongs to another run directory, or a run published under another name."""
    if shared and cur.experiment_dir is not None and cur.experiment_dir != here:
        raise IdentityCollision(f"Trackio run {name!r} of {project} is already published from {cur.experiment_dir} "
                                f"(cursor {path.name}), not from {here}: pass --run-name to publish this one "
                                "under another name")
    if cur.run_name is not None and cur.run_name != name:
        raise IdentityCollision(f"{here} is published to {project} as Trackio run {cur.run_name!r}, not {name!r}: "
                                f"pass --run-name {cur.run_name}")


def _check_store(sink: Sink, project: str, name: str, here: str) -> None:
    """Refuse to publish into a Trackio run that another run directory already fills (read through Trackio's API)."""
    read_back = getattr(sink, "saved_config", None)
    try:
        saved = read_back(project, name) if read_back is not None else None
    except readback.ReadBackUnavailable as exc:
        raise SinkUnavailable(str(exc)) from None
    owner = saved.get("experiment_dir") if isinstance(saved, dict) else None
    if isinstance(owner, str) and owner != here:
        raise IdentityCollision(f"Trackio run {name!r} of {project} is already published from {owner}, not from "
                                f"{here}: pass --run-name to publish this one under another name")


def destination_problem(server_url: Optional[str]) -> Optional[str]:
    """Why the destination cannot be written at all (a configuration error, not an outage); None when it can.

    A self-hosted server takes writes only with its write token, in the URL or
    ``TRACKIO_WRITE_TOKEN`` (Trackio's own rule, read by Trackio's own URL parser).
    """
    if server_url is None:
        return None
    if not server_url.startswith(("http://", "https://")):
        return f"--server-url {server_url[:80]!r} is not an http:// or https:// URL"
    from trackio import utils

    _, token = utils.parse_trackio_server_url(server_url)
    if not (token or os.environ.get("TRACKIO_WRITE_TOKEN")):
        return ("--server-url needs the server's write token: set TRACKIO_WRITE_TOKEN "
                "(or add write_token to the URL)")
    return None


class TrackioSink:
    """The Trackio destination: the local store (``TRACKIO_DIR``) or ``server_url``.

    Trackio's own console messages are kept off stdout (the CLI's report stays
    readable); they are shown on stderr only when something fails.
    """

    def __init__(self, server_url: Optional[str] = None) -> None:
        self.server_url = server_url
        self.reader = readback.TrackioReader(server_url)
        self._run: Any = None
        self._chatter = io.StringIO()
        self._warnings: Optional[contextlib.ExitStack] = None
        self._caught: list = []

    def _quiet(self):
        return contextlib.redirect_stdout(self._chatter)

    def open(self, *, project: str, run: str, group: str, config: dict) -> None:
        # Trackio reports a failed write as a warning and carries on ("this batch could not be
        # persisted"); the exporter must see it, or the cursor would move past lost points.
        self._warnings = contextlib.ExitStack()
        self._caught = self._warnings.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        try:
            self._init(project=project, run=run, group=group, config=config)
        except BaseException:
            self._warnings.close()
            self._warnings = None
            raise

    def _init(self, *, project: str, run: str, group: str, config: dict) -> None:
        with self._quiet():
            import trackio

            self._trackio = trackio
            self._run = trackio.init(project=project, name=run, group=group, config=config, resume="allow",
                                     server_url=self.server_url, auto_log_cpu=False, auto_log_gpu=False,
                                     embed=False)

    def log(self, points: dict[str, Any], step: int) -> None:
        with self._quiet():
            self._run.log(dict(points), step=int(step))

    def table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        with self._quiet():
            self._run.log({key: self._trackio.Table(columns=columns, data=rows)}, step=int(step))

    def image(self, key: str, path: Path, step: int, caption: str) -> None:
        with self._quiet():
            self._run.log({key: linked_image(self._trackio, path, caption)}, step=int(step))

    def saved_config(self, project: str, run: str) -> dict:
        """The config Trackio stored for the run, read back through Trackio's API (``{}``: no such run).

        Raises :class:`readback.ReadBackUnavailable` when Trackio cannot be asked.
        """
        return self.reader.run_config(project, run)

    def stored_values(self, project: str, run: str, step: int) -> dict[str, Any]:
        """The metrics Trackio stored for the run at ``step``, read back through Trackio's API."""
        return self.reader.values_at(project, run, step)

    def close(self) -> None:
        try:
            if self._run is not None:
                with self._quiet():
                    # trackio.finish() also forgets the current run: left set, Trackio finishes it again at
                    # interpreter exit, outside this capture, and prints its own warning after our one line
                    self._trackio.finish()
                self._run = None
        finally:
            if self._warnings is not None:
                self._warnings.close()
                self._warnings = None
        failures = [str(w.message) for w in self._caught if _is_failure(str(w.message))]
        failures += [line for line in self._chatter.getvalue().splitlines()
                     if "Trackio warning" in line and _is_failure(line)]
        if failures:
            raise SinkUnavailable(failures[0].splitlines()[0][:300])


def linked_image(trackio: Any, path: Path, caption: str) -> Any:
    """A Trackio image whose stored file is a link to the run's PNG, not a copy (seed 004: pixels live once).

    Trackio's own ``Image(path)`` copies the file into its media store. This one
    is the same image type (read back by Trackio as any image) but stores a hard
    link to the run directory's file — the same inode, so a curve replaced later
    (``os.replace``) keeps the version that was published — or, across
    filesystems, a symlink to it.
    """

    class LinkedImage(trackio.Image):
        def _save_media(self, file_path: Path) -> None:
            source = Path(self._value).resolve()
            try:
                os.link(source, file_path)
            except OSError:  # another filesystem (EXDEV) or no hard links there: point at the file instead
                os.symlink(source, file_path)

    return LinkedImage(str(path), caption=caption)


class DescriptionMismatch(ValueError):
    """The description or group Trackio stored differs from the one registered (the tooltip would mislead)."""


class MeasurementMismatch(ValueError):
    """The first measurements Trackio stored differ from those sent (read back through Trackio's API)."""


class IdentityCollision(ValueError):
    """The Trackio run (or its cursor) belongs to another run directory: publishing would merge two runs."""


def _is_failure(message: str) -> bool:
    text = message.lower()
    return any(word in text for word in ("could not", "failed", "error", "unable"))
