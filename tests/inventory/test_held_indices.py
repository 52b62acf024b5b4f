"""inventory.devices.held_indices: the one reading of which GPUs a holder names, for every reader of shards."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inventory.devices import GPU_NUMBER_LIMIT, held_indices
from inventory.reads.nodes import NodeUsage

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=2),
    max_leaves=8,
)


@pytest.mark.parametrize(
    ("entries", "held"),
    [
        ([0, 3, 1003], [0, 3, 1003]),
        ([True, False, 1], [1]),  # JSON true is no GPU 1
        (["3", 2.0, None, [4], {"i": 5}], []),
        ([-1, GPU_NUMBER_LIMIT - 1, GPU_NUMBER_LIMIT], [GPU_NUMBER_LIMIT - 1]),
        ({"0": 1}, []),
        ("0,1", []),
        (None, []),
    ],
)
def test_only_whole_numbers_from_zero_in_a_list_name_a_gpu(entries, held):
    assert held_indices(entries) == held


@given(JSON)
def test_any_json_a_shard_could_hold_is_read_without_error_and_node_usage_agrees(entries):
    held = held_indices(entries)
    assert all(type(i) is int and 0 <= i < GPU_NUMBER_LIMIT for i in held)
    assert NodeUsage([(1, entries, "r1")]).used[1] == set(held)
