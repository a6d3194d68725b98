"""Id math over columns agrees with the one-record functions bit for bit."""

from __future__ import annotations

import functools
import operator

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.records.id_arrays import child_ids, xor_by_group
from ftlayer.records.ids import child_id

_I64 = st.integers(-(1 << 63), (1 << 63) - 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(_I64, max_size=64), _I64, st.integers(0, (1 << 32) - 1))
def test_child_ids_equal_child_id_for_every_parent(parents: list[int], op: int, index: int) -> None:
    got = child_ids(np.array(parents, dtype=np.int64), op, index)
    assert got.dtype == np.int64
    assert got.tolist() == [child_id(p, op, index) for p in parents]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_I64, st.integers(0, (1 << 32) - 1)), max_size=64), _I64)
def test_child_ids_take_an_index_per_parent(pairs: list[tuple[int, int]], op: int) -> None:
    parents = np.array([p for p, _ in pairs], dtype=np.int64)
    index = np.array([i for _, i in pairs], dtype=np.int64)
    assert child_ids(parents, op, index).tolist() == [child_id(p, op, i) for p, i in pairs]


def test_child_ids_leave_their_input_alone() -> None:
    parents = np.array([1, -2, 3], dtype=np.int64)
    child_ids(parents, 7, 0)
    assert parents.tolist() == [1, -2, 3]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(_I64, min_size=1, max_size=5), max_size=20))
def test_xor_by_group_is_the_xor_of_each_group(groups: list[list[int]]) -> None:
    flat = [v for g in groups for v in g]
    starts = np.cumsum([0] + [len(g) for g in groups[:-1]]) if groups else np.array([], dtype=np.int64)
    got = xor_by_group(np.array(flat, dtype=np.int64), starts)
    assert got.tolist() == [functools.reduce(operator.xor, g, 0) for g in groups]
