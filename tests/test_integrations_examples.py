"""``examples_in`` (traceml_tui/integrations/support.py): its fast paths for the usual batches — a ``list`` or
``tuple`` of tensors, a Hugging Face collator's ``dict`` — give what its general path gives for the same
contents in any other sequence or mapping."""

from __future__ import annotations

from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from traceml_tui.integrations.support import examples_in

from support.lanes import examples


class Shaped:
    """What ``examples_in`` reads of a tensor: its ``shape``."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def __repr__(self) -> str:
        return f"Shaped{self.shape}"


class Seq(list):
    """A list, but not exactly ``list``: the general path."""


_leaves = st.one_of(
    st.builds(Shaped, st.lists(st.integers(0, 64), max_size=3).map(tuple)),  # () is a scalar: no examples
    st.none(), st.integers(), st.text(max_size=3),
)
_batches = st.recursive(_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
    st.dictionaries(st.text(max_size=3), inner, max_size=4),
), max_leaves=12)


def _general(batch):
    """The same contents in containers that take the general path, all the way down."""
    if type(batch) is dict:
        return MappingProxyType({k: _general(v) for k, v in batch.items()})
    if type(batch) in (list, tuple):
        return Seq(_general(v) for v in batch)
    return batch


@settings(max_examples=examples(300))
@given(_batches)
def test_fast_paths_equal_the_general_path(batch):
    assert examples_in(batch) == examples_in(_general(batch))


def test_a_dict_batch_reads_its_first_tensor_with_examples():
    assert examples_in({"mask": None, "scalar": Shaped(()), "input_ids": Shaped((4, 16)), "x": Shaped((6,))}) == 4
    assert examples_in({"ids": [Shaped(()), Shaped((3, 2))]}) == 3
    assert examples_in({"text": "abc", "n": 3}) is None
