"""What keeps the fast lane cheap (tests/support/lanes.py; README, "test lanes"): no test module imports an
optional package while it is collected, and ``needs`` finds a package without importing it."""

from __future__ import annotations

import ast
from pathlib import Path

from support.lanes import needs

TESTS = Path(__file__).parent

#: The optional packages (pyproject.toml extras) that cost seconds to import; every worker collects every module.
OPTIONAL = {"torch", "transformers", "lightning", "pytorch_lightning", "accelerate", "trackio"}


def _top_level(body: list[ast.stmt]):
    """The statements a module runs when it is imported: its body, into ``if``/``try``/``with`` blocks but not
    into functions or classes."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []),
                          *[h.body for h in getattr(node, "handlers", [])]):
                yield from _top_level(block)


def optional_imports_at_top(source: str) -> list[str]:
    """``"<line>: <package>"`` for each optional package a module imports at its top, directly or through
    ``pytest.importorskip``."""
    found = []
    for node in _top_level(ast.parse(source).body):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign)):
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                        and call.func.attr == "importorskip" and call.args \
                        and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
                    names.append(call.args[0].value)
        found += [f"{node.lineno}: {name}" for name in names if name.split(".")[0] in OPTIONAL]
    return found


def test_the_scan_finds_an_import_and_an_importorskip_at_the_top_and_nothing_inside_a_test():
    source = ("import pytest\nimport torch.nn\ntorch = pytest.importorskip('torch')\n"
              "try:\n    from trackio import init\nexcept ImportError:\n    pass\n"
              "def test_x():\n    import torch\n    pytest.importorskip('lightning')\n")
    assert optional_imports_at_top(source) == ["2: torch.nn", "3: torch", "5: trackio"]


def test_no_test_module_imports_an_optional_package_at_its_top():
    modules = [*TESTS.rglob("test_*.py"), *TESTS.rglob("conftest.py"), *(TESTS / "support").glob("*.py")]
    offenders = {str(path.relative_to(TESTS)): found for path in sorted(modules)
                 if (found := optional_imports_at_top(path.read_text()))}
    assert offenders == {}, ("import it inside the tests that use it and mark the module with "
                             "support.lanes.needs (README, \"test lanes\")")


def test_needs_finds_a_package_without_importing_it(tmp_path, monkeypatch):
    package = tmp_path / "heavy_optional_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    there, missing = needs("heavy_optional_pkg"), needs("no_such_package_anywhere")
    assert there.name == missing.name == "skipif"
    assert there.args == (False,) and missing.args == (True,)
    assert missing.kwargs["reason"] == "no_such_package_anywhere is not installed"
    assert not (tmp_path / "imported").exists()


def test_examples_scale_with_the_sessions_profile(monkeypatch):
    """A property test's own count: whole in the suite (``ci``), a third in the fast lane (never under 10), ten
    times under ``long`` — the profile the session chose before the test modules were imported."""
    from support import lanes

    for profile, counts in {"ci": (60, 300, 20), "fast": (20, 100, 10), "long": (600, 3000, 200)}.items():
        monkeypatch.setattr(lanes, "session_profile", profile)
        assert (lanes.examples(60), lanes.examples(300), lanes.examples(20)) == counts
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    assert [lanes.hypothesis_profile(m) for m in ("not slow and not faults", "")] == ["fast", "ci"]
