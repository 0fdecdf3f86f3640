"""JUnit XML for CI systems that display test results (``--junit PATH``).

One test case, ``step_time_regression``: it fails on SLOWER_IN_THIS_PAIR or
INCONCLUSIVE, passes on WITHIN/FASTER, and is skipped for an exploratory
comparison (no threshold, no CI result).
"""

from __future__ import annotations

import re
from typing import Any

FAILING = ("SLOWER_IN_THIS_PAIR", "INCONCLUSIVE")

# XML 1.0 cannot carry most control characters, even escaped.
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    return _INVALID_XML.sub("?", text)


# Hand-rolled rather than xml.sax.saxutils, which drags in urllib (~20 ms of start-up).
def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def quoteattr(text: str) -> str:
    return '"' + escape(text).replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;") + '"'


def render_junit(report: dict[str, Any], text_report: str) -> str:
    """A JUnit XML document for one comparison."""
    ci = report.get("ci")
    name = f"{report['reference']['label']} vs {report['candidate']['label']}"
    failures = skipped = 0
    body = ""
    if ci is None:
        skipped = 1
        body = '<skipped message="exploratory comparison: no threshold given"/>'
    elif ci["result"] in FAILING:
        failures = 1
        message = f"{ci['result']}: {ci['reason'] or ''}".strip()
        body = f"<failure message={quoteattr(_clean(message))} type={quoteattr(ci['result'])}>{escape(_clean(text_report))}</failure>"
    else:
        body = f"<system-out>{escape(_clean(text_report))}</system-out>"
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuites tests="1" failures="{failures}" errors="0" skipped="{skipped}">\n'
        f'  <testsuite name="traceml.compare" tests="1" failures="{failures}" errors="0" skipped="{skipped}">\n'
        f"    <testcase classname=\"traceml.compare\" name={quoteattr(_clean('step_time_regression: ' + name))}>"
        f"{body}</testcase>\n"
        "  </testsuite>\n"
        "</testsuites>\n"
    )
