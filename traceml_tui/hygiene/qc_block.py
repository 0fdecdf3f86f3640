"""The QC block of ``hygiene:`` (seed 004: "The launcher must bind the QC owner, roster, cadence,
and output root before submission") and the rule that judges its required items at the end of a run.

Shape (docs/qc.md, "The QC block")::

    qc:
      cadence: 100                   # QC points: initialization, then every 100 updates
      collapse_factor: 0.1           # optional: the predeclared field-collapse factor
      owner: vanguard-hal            # who owns this run's QC (a person, a lane)
      output: qc                     # the QC output root: always qc/ in the run directory
      roster:
        name: val-fixed-64           # the fixed QC roster's name
        members: [case-001, case-002]  # its source identities, in order …
        digest: sha256:…             # … or (and) their digest: sha256 of the members' canonical JSON
        size: 64                     # with a digest alone: the roster's size
        selection: "every 50th validation case by id, stratified by site"
        split: val                   # optional: the split the roster is drawn from
      items:                         # every base QC item, declared required or inapplicable
        batch_grid: required
        field_stats: required
        galleries: required
        worker_qc: required          # heavy QC drained from the QC backlog (or {inapplicable: <reason>})
      recipe: qc-heavy-v1          # with worker_qc required: the QC recipe and its worker command
      worker: [python, qc_worker.py, --checkpoint, "{checkpoint}"]

``owner``, ``output``, ``roster`` and ``items`` bind together: a block that
declares one declares all four. A block with ``cadence`` alone is still
accepted (it predates the binding) and the summary says the QC was not bound.
Pure functions; :func:`produced_counts` is the only one that reads files.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Mapping, Optional

from traceml_tui.guard.contract import show_key, show_value

#: The base QC items seed 004 asks every run to bind (each required, or inapplicable with a reason).
ITEMS = ("batch_grid", "field_stats", "galleries", "worker_qc")
BINDING_KEYS = ("owner", "output", "roster", "items")
#: The heavy QC worker of a required ``worker_qc`` (hygiene/config.py checks them; docs/qc.md).
WORKER_KEYS = ("recipe", "worker")
QC_OUTPUT = "qc"  # the QC output root, relative to the run directory (core/rundir.py places every QC figure there)
REQUIRED = "required"
#: The row states of the summary's ``qc.items`` (``not_passed``: worker QC requested but not every request has
#: its receipt — pending or failed QC is not passed QC).
PRODUCED, MISSING, INAPPLICABLE, NOT_PASSED = "produced", "missing", "inapplicable", "not_passed"
#: The summary's ``qc.status`` words.
OK, FAILED, NOT_RECORDED = "ok", "failed", "not_recorded"
MAX_ROSTER_MEMBERS = 4096  # a larger roster is bound by its digest (the manifest stays small)
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


class QcBlockError(ValueError):
    """A malformed ``hygiene.qc`` block: ``path`` and ``problem`` make the one-line refusal."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


def _text(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip() or "\n" in value.strip():
        raise QcBlockError(path, "must be a nonempty line of text")
    return value.strip()


def roster_digest(members: list[str]) -> str:
    """``sha256:`` of the members' canonical JSON (a list of strings, in roster order): the roster's identity."""
    canonical = json.dumps(list(members), separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _roster(raw: Any, path: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise QcBlockError(path, "must be a mapping with name, members or digest, and selection")
    allowed = ("name", "members", "digest", "size", "selection", "split")
    for key in raw:
        if key not in allowed:
            raise QcBlockError(f"{path}.{show_key(key)}", f"unknown key (allowed: {', '.join(allowed)})")
    out: dict[str, Any] = {"name": _text(raw.get("name"), f"{path}.name")}
    members = raw.get("members")
    digest = raw.get("digest")
    if members is None and digest is None:
        raise QcBlockError(f"{path}.members", "required (the roster's source identities, or its digest)")
    if members is not None:
        if not isinstance(members, list) or not members:
            raise QcBlockError(f"{path}.members", "must be a nonempty list of source ids")
        if len(members) > MAX_ROSTER_MEMBERS:
            raise QcBlockError(f"{path}.members", f"{len(members)} members: bind a roster over "
                               f"{MAX_ROSTER_MEMBERS} by its digest and size")
        ids = []
        for i, member in enumerate(members):
            if isinstance(member, bool) or not isinstance(member, (str, int)):
                raise QcBlockError(f"{path}.members[{i}]", f"must be a source id (string), got {show_value(member)}")
            ids.append(_text(str(member), f"{path}.members[{i}]"))
        seen: dict[str, int] = {}
        for i, member in enumerate(ids):
            if member in seen:
                raise QcBlockError(f"{path}.members[{i}]", f"{show_value(member)} is listed twice "
                                   f"(also members[{seen[member]}])")
            seen[member] = i
        computed = roster_digest(ids)
        if digest is not None and digest != computed:
            raise QcBlockError(f"{path}.digest", f"{show_value(digest)} is not the digest of the members listed "
                               f"({computed})")
        out.update(members=ids, digest=computed, size=len(ids))
        if raw.get("size") is not None and raw["size"] != len(ids):
            raise QcBlockError(f"{path}.size", f"{show_value(raw['size'])} but {len(ids)} members are listed")
    else:
        if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
            raise QcBlockError(f"{path}.digest", f"must be sha256:<64 lowercase hex digits>, got {show_value(digest)}")
        size = raw.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise QcBlockError(f"{path}.size", "required with a digest: the roster's member count (an integer >= 1)")
        out.update(digest=digest, size=size)
    out["selection"] = _text(raw.get("selection"), f"{path}.selection")
    if raw.get("split") is not None:
        out["split"] = _text(raw["split"], f"{path}.split")
    return out


def _items(raw: Any, path: str) -> dict[str, dict[str, Any]]:
    if not isinstance(raw, dict):
        raise QcBlockError(path, f"must be a mapping of every base QC item ({', '.join(ITEMS)}) to required "
                           "or {inapplicable: <reason>}")
    for key in raw:
        if key not in ITEMS:
            raise QcBlockError(f"{path}.{show_key(key)}", f"unknown QC item (items: {', '.join(ITEMS)})")
    out: dict[str, dict[str, Any]] = {}
    for item in ITEMS:
        where = f"{path}.{item}"
        value = raw.get(item)
        if value is None:
            # seed 004: make an inapplicable diagnostic explicit rather than silently omitting it
            raise QcBlockError(where, "required: declare it required, or {inapplicable: <reason>}")
        if value == REQUIRED:
            out[item] = {"required": True}
        elif isinstance(value, dict) and set(value) == {"inapplicable"}:
            out[item] = {"required": False, "inapplicable": _text(value["inapplicable"], f"{where}.inapplicable")}
        else:
            raise QcBlockError(where, f"must be required or {{inapplicable: <reason>}}, got {show_value(value)}")
    return out


def parse_binding(block: Mapping[str, Any], path: str = "hygiene.qc") -> dict[str, Any]:
    """The bound part of a QC block (``owner``, ``output``, ``roster``, ``items``), normalized; ``{}`` if none.

    Raises :class:`QcBlockError` naming the first bad field; a block that
    declares one binding key and not another is refused naming the missing one.
    """
    declared = [key for key in BINDING_KEYS if block.get(key) is not None]
    if not declared:
        return {}
    for key in BINDING_KEYS:
        if block.get(key) is None:
            raise QcBlockError(f"{path}.{key}", f"required (a QC block that binds {declared[0]} binds "
                               f"{', '.join(BINDING_KEYS)})")
    output = _text(block["output"], f"{path}.output").rstrip("/")
    if output != QC_OUTPUT:
        raise QcBlockError(f"{path}.output", f"must be {QC_OUTPUT} (every QC figure is written under qc/ in the run "
                           f"directory), got {show_value(block['output'])}")
    return {
        "owner": _text(block["owner"], f"{path}.owner"),
        "output": output,
        "roster": _roster(block["roster"], f"{path}.roster"),
        "items": _items(block["items"], f"{path}.items"),
    }


def produced_counts(run_dir: Path, field_summary: Optional[Mapping[str, Any]] = None) -> dict[str, int]:
    """How many of each QC item a run directory holds: saved batch grids, fields with QC records, galleries."""
    from traceml_tui.hygiene import batch_grid, gallery

    fields = (field_summary or {}).get("fields") if isinstance(field_summary, Mapping) else None
    return {
        "batch_grid": len(batch_grid.list_grids(run_dir)),
        "field_stats": len(fields) if isinstance(fields, Mapping) else 0,
        "galleries": len(gallery.list_galleries(run_dir)),
        "worker_qc": 0,
    }


def judge_items(items: Mapping[str, Mapping[str, Any]], produced: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """Each declared item's row: ``produced`` / ``missing`` (required, none saved) / ``inapplicable`` (its reason)."""
    rows: dict[str, dict[str, Any]] = {}
    for item, declared in items.items():
        count = int(produced.get(item, 0))
        if declared.get("required"):
            rows[item] = {"state": PRODUCED if count > 0 else MISSING, "required": True, "count": count}
        else:
            rows[item] = {"state": INAPPLICABLE, "required": False, "count": count,
                          "reason": declared.get("inapplicable")}
    return rows


def qc_status(field_status: str, missing: list[str], bound: bool) -> str:
    """The summary's ``qc.status``: ``failed`` for a collapsed field or a missing required item.

    Otherwise ``ok`` when something was judged (a field, or a bound block whose
    required items were all produced), else ``not_recorded``.
    """
    if field_status == FAILED or missing:
        return FAILED
    if field_status == OK or bound:
        return OK
    return NOT_RECORDED


def qc_report(run_dir: Path, qc_declared: Optional[Mapping[str, Any]], field_summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's ``qc`` section: the field verdicts plus, for a bound block, each required item's row.

    ``qc_declared``: the manifest's normalized ``hygiene.qc`` (or None);
    ``field_summary``: :func:`traceml_tui.hygiene.field_qc.summarize_records`.
    A required item never produced is a named failure (``missing_items``).
    """
    out = dict(field_summary)
    declared = qc_declared if isinstance(qc_declared, Mapping) else {}
    items = declared.get("items") if isinstance(declared.get("items"), Mapping) else None
    if items is None:
        out["bound"] = False
        return out
    rows = judge_items(items, produced_counts(Path(run_dir), field_summary))
    missing = [item for item, row in rows.items() if row["state"] == MISSING]
    roster = declared.get("roster") if isinstance(declared.get("roster"), Mapping) else {}
    out.update(
        bound=True,
        owner=declared.get("owner"),
        cadence=declared.get("cadence"),
        output=declared.get("output"),
        roster={k: roster.get(k) for k in ("name", "digest", "size", "selection", "split") if k in roster},
        items=rows,
        missing_items=missing,
        status=qc_status(str(field_summary.get("status")), missing, True),
    )
    return with_worker_qc(out, run_dir, declared)


def with_worker_qc(section: dict[str, Any], run_dir: Path, declared: Mapping[str, Any]) -> dict[str, Any]:
    """``section`` (a bound ``qc`` summary section) with its required worker QC judged from the QC backlog now.

    The row's state is ``produced`` only when the QC backlog passed (every request has its receipt:
    :func:`traceml_tui.hygiene.qc_backlog.worker_qc_report`), ``missing`` when nothing was requested and
    ``not_passed`` while a request waits or is blocked — pending or failed QC is not passed QC. The report sits
    in ``worker_qc``; ``not_passed_items`` names the item, and ``status`` is ``failed`` as for a missing item.
    Called again when a drainer refreshes an ended run (``summary/store.py``).
    """
    from traceml_tui.hygiene import qc_backlog

    items = section.get("items") if isinstance(section.get("items"), dict) else {}
    row = items.get("worker_qc")
    if not isinstance(row, dict) or not row.get("required") or qc_backlog.declared_worker(declared) is None:
        return section
    report = qc_backlog.worker_qc_report(Path(run_dir))
    word = report["state"]
    row.update(state=PRODUCED if word == qc_backlog.PASSED else MISSING if word == qc_backlog.NOT_REQUESTED
               else NOT_PASSED, count=report["completed"])
    missing = [item for item, r in items.items() if r.get("state") == MISSING]
    not_passed = [item for item, r in items.items() if r.get("state") == NOT_PASSED]
    section.update(worker_qc=report, missing_items=missing, not_passed_items=not_passed,
                   status=qc_status(FAILED if section.get("failed_fields") else OK, missing + not_passed, True))
    return section


def items_word(section: Optional[Mapping[str, Any]], declared: bool) -> str:
    """One phrase for the required QC items of a run, for tables (the Trackio export's ``info/run``).

    ``section``: the summary's ``qc`` (None before the run ends); ``declared``:
    whether the manifest binds items. Before the end nothing is judged missing yet.
    """
    if isinstance(section, Mapping) and section.get("bound"):
        missing = [str(m) for m in section.get("missing_items") or []]
        not_passed = [str(m) for m in section.get("not_passed_items") or []]
        report = section.get("worker_qc") if isinstance(section.get("worker_qc"), Mapping) else {}
        said = []
        if missing:
            said.append(f"never produced: {', '.join(missing)}")
        if not_passed:  # pending or failed worker QC is not passed QC (hygiene/qc_backlog.py)
            said.append(f"not passed: {', '.join(not_passed)} ({report.get('state')}, "
                        f"{report.get('completed')}/{report.get('requested')} QC requests completed)")
        return f"FAILED, {'; '.join(said)}" if said else "all required items produced"
    if declared:
        return "pending: judged when the run ends"
    return "not bound (hygiene.qc declares no items)"


def report_lines(section: Optional[Mapping[str, Any]]) -> list[str]:
    """The lines ``final_summary.txt`` prints for a bound QC block's items (a presentation of ``qc``)."""
    if not section or not section.get("bound"):
        return []
    from traceml_tui.hygiene import qc_backlog

    lines = []
    for item in section.get("missing_items") or []:
        lines.append(f"QC FAILED: required item {item} was never produced "
                     f"(declared in hygiene.qc.items; owner {section.get('owner')})")
    report = section.get("worker_qc")
    if isinstance(report, Mapping) and (line := qc_backlog.not_passed_line(report)) is not None:
        lines.append(f"QC FAILED: {line}")
    roster = section.get("roster") or {}
    states = ", ".join(f"{item} {row.get('state')}" for item, row in (section.get("items") or {}).items())
    lines.append(f"QC: {section.get('status')} · owner {section.get('owner')} · roster {roster.get('name')} "
                 f"({roster.get('size')} sources, {roster.get('digest', '')[:19]}…) · {states}")
    return lines
