"""DeltaArrays: combining per id, and ``having`` (membership) against numpy's own ``isin``."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.records.delta_arrays import DeltaArrays

_ID = st.integers(-(1 << 63), (1 << 63) - 1)
_SMALL = st.integers(-5, 5)  # few distinct ids: repeats and hits are common


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(_ID, _SMALL), _ID)), st.lists(st.one_of(_ID, _SMALL)))
def test_having_is_isin(pairs: list[tuple[int, int]], ids: list[int]) -> None:
    deltas = DeltaArrays.combine([p[0] for p in pairs], [p[1] for p in pairs])
    assert list(deltas.sids) == sorted(set(deltas.sids.tolist()))  # sorted, distinct: what having relies on
    assert deltas.having(ids).tolist() == np.isin(deltas.sids, np.asarray(ids, dtype=np.int64)).tolist()
    assert deltas.having(deltas.sids).all()


def test_having_on_empty_arrays() -> None:
    empty = DeltaArrays.combine([], [])
    assert empty.having([1, 2]).tolist() == []
    assert DeltaArrays.combine([3, 1], [7, 7]).having([]).tolist() == [False, False]
    assert DeltaArrays.combine([3, 1], [7, 7]).having([(1 << 63) - 1, 3]).tolist() == [False, True]
