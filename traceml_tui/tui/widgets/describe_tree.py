"""The Describe screen's tree: a run's manifest, guard contract, hygiene block, telemetry and environment.

:func:`describe_sections` lays a :class:`DescribeSnapshot` out as titled
sections of plain ``(label, value or children)`` pairs (pure, testable);
:class:`DescribeTree` shows them as a Textual ``Tree``, every branch open.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from rich.text import Text
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from traceml_tui.tui import textplot
from traceml_tui.tui.keys import list_bindings
from traceml_tui.tui.snapshots import DescribeSnapshot

#: A section: its title and its rows; a row's value is a scalar, a nested dict/list, or a note string.
Section = tuple[str, Any]


def _when(ts: Any) -> Optional[str]:
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
    return None


def _pick(d: Optional[dict], *keys: str) -> dict:
    return {k: d[k] for k in keys if d and k in d}


def describe_sections(snap: DescribeSnapshot) -> list[Section]:
    """The sections the Describe screen shows, in order (absent parts say why they are absent)."""
    m = snap.manifest or {}
    run: dict[str, Any] = {"status": snap.status, "folder": snap.folder}
    if m:
        started, ended = m.get("started_at"), m.get("ended_at")
        run["started"] = _when(started)
        run["ended"] = _when(ended)
        if snap.duration_s is not None:
            run["duration"] = textplot.duration(snap.duration_s)  # the reader's, as the Runs table shows it
        run.update(_pick(m, "exit_code", "mode", "attempts", "history_enabled", "history_retention_s",
                         "trace_max_steps", "schema_version"))
    sections: list[Section] = [("Run", run)]
    if not m:
        sections.append(("Manifest", "(none in the index yet: the launcher writes manifest.json at the start)"))
        topology: Any = "(unknown without a manifest)"
    else:
        topology = dict(m.get("topology") or {})
        topology["launch"] = (m.get("launch") or {}).get("kind")
    sections.append(("Topology", topology))
    guard = m.get("guard") if isinstance(m.get("guard"), dict) else None
    contract = guard.get("contract") if guard else None
    if contract:
        body: dict[str, Any] = {"declaration": contract}
        if guard.get("contract_digest"):
            body["digest"] = guard["contract_digest"]
        if guard.get("training"):
            body["training"] = guard["training"]
        sections.append(("Guard contract", body))
    elif snap.declaration:
        sections.append(("Guard contract", {"declaration": snap.declaration}))
    else:
        sections.append(("Guard contract", "(unguarded run: no guard block declared)"))
    hygiene = m.get("hygiene")
    sections.append(("Hygiene", hygiene if hygiene else "(no hygiene block)"))
    telemetry = m.get("telemetry")
    sections.append(("Telemetry", telemetry if telemetry else "(not written yet: node 0 writes it at the end)"))
    if snap.environment:
        sections.append(("Environment", snap.environment))
    else:
        sections.append(("Environment", "(final summary without versions)" if snap.has_summary
                         else "(no final summary yet: the launcher writes the versions when the run ends)"))
    return sections


def _scalar(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"  # the value as written (30, 1800, 0.25), not rounded for a table
    return str(value)


def _leaf(label: str, value: str) -> Text:
    """``label: value`` as plain text (never read as markup: values may hold brackets)."""
    return Text.assemble((f"{label}: ", "bold"), value)


def _add(node: TreeNode, label: str, value: Any) -> None:
    if isinstance(value, dict):
        if not value:
            node.add_leaf(_leaf(label, "(empty)"))
            return
        branch = node.add(Text(label, style="bold"), expand=True)
        for key, item in value.items():
            _add(branch, str(key), item)
    elif isinstance(value, (list, tuple)):
        if not value:
            node.add_leaf(_leaf(label, "(none)"))
        elif all(not isinstance(v, (dict, list, tuple)) for v in value):
            node.add_leaf(_leaf(label, ", ".join(_scalar(v) for v in value)))
        else:
            branch = node.add(Text(label, style="bold"), expand=True)
            for i, item in enumerate(value):
                _add(branch, f"[{i}]", item)
    else:
        node.add_leaf(_leaf(label, _scalar(value)))


class DescribeTree(Tree):
    """The run's facts as an open tree (arrow keys or j/k move, Enter or Space folds a branch)."""

    # Tree's own home/end already move the cursor to the first/last line (tui/keys.py).
    BINDINGS = list_bindings(first="scroll_home", last="scroll_end")

    def __init__(self, **kwargs) -> None:
        super().__init__(Text("run"), **kwargs)
        self.show_root = True

    def show(self, snap: Optional[DescribeSnapshot], problem: Optional[str] = None) -> None:
        self.clear()
        if snap is None:
            self.root.set_label(Text(problem or "this run is no longer in the index"))
            return
        self.root.set_label(Text(snap.name, style="bold"))
        for title, body in describe_sections(snap):
            if isinstance(body, str):
                self.root.add_leaf(_leaf(title, body))
                continue
            branch = self.root.add(Text(title, style="bold underline"), expand=True)
            for key, value in body.items():
                _add(branch, str(key), value)
        self.root.expand()
