"""``traceml.yaml`` loaders against damaged files (docs/security.md, "Fuzzing").

Start: the repository's own example configs (the guard block of the CI example, the hygiene block of the
hygiene example). Each example damages one line. Contract: :func:`load_config` (and, for a hygiene block,
:func:`parse_hygiene`, as ``traceml run`` calls them) returns a config or raises one ``ConfigError`` /
``HygieneConfigError`` whose text is one line naming the file and, when one is at fault, the item —
never any other exception.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traceml_tui.guard.config import ConfigError, load_config
from traceml_tui.hygiene.config import HygieneConfigError, parse_hygiene

from support.fuzz_mutations import yaml_mutation

EXAMPLES = Path(__file__).parents[2] / "examples"
CONFIGS = {name: (EXAMPLES / name / "traceml.yaml").read_text() for name in (".", "hygiene")}  # guard, hygiene
CORPUS = Path(__file__).parent / "corpus" / "config"


def _check(tmp_path: Path, text: str) -> None:
    path = tmp_path / "traceml.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        config = load_config(path)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{path}: "), message
        return
    if config.hygiene is not None:
        try:
            parse_hygiene(config.hygiene)
        except HygieneConfigError as exc:
            assert "\n" not in str(exc) and str(exc).startswith("hygiene"), str(exc)


@st.composite
def damaged_config(draw):
    return draw(yaml_mutation(CONFIGS[draw(st.sampled_from(sorted(CONFIGS)))]))


@given(text=damaged_config())
def test_config_loaders_say_one_line_for_any_damage(tmp_path, text):
    _check(tmp_path, text)


@pytest.mark.parametrize("found", sorted(p.name for p in CORPUS.glob("*.yaml")), ids=str)
def test_config_corpus(tmp_path, found):
    """Cases found by fuzzing (and the R5 repros), kept as regression inputs."""
    _check(tmp_path, (CORPUS / found).read_text(encoding="utf-8"))
