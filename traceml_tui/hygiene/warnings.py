"""The warnings seed 004's rules imply at the end of a run: one home for their wording.

Each is one line, listed in ``final_summary.json`` ``hygiene_warnings``, printed by
``final_summary.txt`` and by the launcher at the end of the run (``traceml run:
warning: …``), from the same list (docs/hygiene.md, "Warnings at the end of a run"):

* validation is declared but early stopping was never applied (enabled, and no
  ``early_stopping.json``: the script never called ``EarlyStopping``);
* training ran past ``hygiene.early_stopping.max_budget``;
* a hygiene run never logged ``lr`` or ``grad_norm`` (seed 004 asks for both);
* a run logged a loss (it trains) with no validation declared: seed 004 makes
  validation mandatory for every learning experiment (``require_validation:
  true`` in ``traceml.yaml`` refuses such a launch instead).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

#: How a script adds the value, in the warning's parentheses. A Lightning fit computes no gradient norm, and a
#: user who wrote no traceml code (the trainers' automatic path) needs to know where one call goes
#: (docs/trainers.md, "What each step records, per rank").
_WHERE_TO_LOG = {
    "lr": "traceml.log(lr=...)",
    "grad_norm": "traceml.log(grad_norm=...); a Lightning fit computes none: call it in the LightningModule's "
                 "on_before_optimizer_step",
}


def step_facts(steps: Iterable[Any]) -> dict[str, Any]:
    """What the warnings need from rank 0's step records: the last update and which values were ever logged."""
    facts: dict[str, Any] = {"last_step": None, "loss": False, "lr": False, "grad_norm": False}
    for record in steps:
        step = getattr(record, "step", None)
        if isinstance(step, int) and (facts["last_step"] is None or step > facts["last_step"]):
            facts["last_step"] = step
        for name in ("loss", "lr", "grad_norm"):
            if not facts[name] and getattr(record, name, None) is not None:
                facts[name] = True
    return facts


def hygiene_warnings(hygiene: Optional[dict], validation: Optional[dict], facts: dict[str, Any]) -> list[str]:
    """The end-of-run warnings (module docstring), in a fixed order; ``hygiene``: the manifest's block."""
    out: list[str] = []
    if not isinstance(hygiene, dict):
        if facts.get("loss"):
            out.append("loss logged without validation: this run trains but declares no hygiene.validation "
                       "(seed 004: validation is mandatory for learning experiments; docs/hygiene.md)")
        return out
    early = (validation or {}).get("early_stopping") or {}
    declared = hygiene.get("early_stopping") if isinstance(hygiene.get("early_stopping"), dict) else {}
    if declared.get("enabled", True) is not False and early.get("state") == "not-recorded":
        out.append("early stopping never applied: hygiene.early_stopping is declared but the script never "
                   "consulted it (no early_stopping.json; call EarlyStopping.should_stop after each update)")
    budget = declared.get("max_budget")
    last = facts.get("last_step")
    if isinstance(budget, int) and isinstance(last, int) and last > budget:
        out.append(f"max_budget exceeded: training reached update {last}, "
                   f"hygiene.early_stopping.max_budget is {budget}")
    for name in ("lr", "grad_norm"):
        if last is not None and not facts.get(name):
            out.append(f"{name} never logged: no step record carries {name} ({_WHERE_TO_LOG[name]})")
    return out
