"""iterable_batches: an iterable source cut into ingest batches by size, linger, idle and stop (injected clock)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from itertools import chain
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.driver.iterable_batches import iterable_batches


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_full_batches_then_the_rest_when_the_source_ends() -> None:
    got = list(iterable_batches(range(10), threading.Event(), 4, 60.0, clock=Clock()))
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_record_arriving_linger_after_the_first_hands_the_list_over() -> None:
    clock = Clock()

    def slow() -> Iterator[int]:
        for i in range(6):
            yield i
            clock.now += 0.4  # the next record comes 0.4 s later

    got = list(iterable_batches(slow(), threading.Event(), 100, 1.0, clock=clock))
    # records come at 0.0, 0.4, 0.8, 1.2, 1.6, 2.0 s: the one at 1.2 is 1.2 s after the list's first,
    # so the list goes with it; the next list starts at 1.6 and ends with the source
    assert got == [[0, 1, 2, 3], [4, 5]]


def test_an_idle_none_hands_over_what_is_held_then_an_empty_poll() -> None:
    got = list(iterable_batches([1, 2, None, None, 3], threading.Event(), 100, 60.0, clock=Clock()))
    assert got == [[1, 2], [], [], [3]]


def test_stop_hands_over_what_is_held_and_ends() -> None:
    stop = threading.Event()

    def source() -> Iterator[int]:
        yield 1
        yield 2
        stop.set()
        yield 3
        yield 4  # never pulled

    got = list(iterable_batches(source(), stop, 100, 60.0, clock=Clock()))
    assert got == [[1, 2, 3]]


def test_a_broken_source_hands_over_what_it_gave_before_the_error() -> None:
    def source() -> Iterator[int]:
        yield from range(5)
        msg = "socket closed"
        raise OSError(msg)

    gen = iterable_batches(source(), threading.Event(), 3, 60.0, clock=Clock())
    assert next(gen) == [0, 1, 2]
    assert next(gen) == [3, 4]
    with pytest.raises(OSError, match="socket closed"):
        next(gen)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | st.integers(0, 9) | st.tuples(st.just("wait"), st.floats(0, 2))), st.integers(1, 5),
       st.floats(0.1, 3))
def test_no_record_is_lost_or_reordered_and_every_rule_holds(steps: list[Any], batch_size: int,
                                                            linger_s: float) -> None:
    """Model check: records in order, none lost; each list at most batch_size, handed over
    when full, at linger, at an idle None or at the end; and the generator holds nothing
    whenever the caller has control."""
    clock = Clock()
    pulled: list[Any] = []
    arrived: list[float] = []  # when each pulled record came
    handed: list[Any] = []

    def source() -> Iterator[Any]:
        last = None
        for step in steps:
            if isinstance(step, tuple):
                clock.now += step[1]
                continue
            held = len(pulled) - len(handed)  # what the generator holds as it pulls the next
            assert held < batch_size  # a full list was handed over
            if held:
                assert last is not None  # an idle None handed everything over
                assert arrived[-1] - arrived[len(handed)] < linger_s  # a list past linger was handed over
            if step is not None:
                pulled.append(step)
                arrived.append(clock.now)
            last = step
            yield step

    for got in iterable_batches(source(), threading.Event(), batch_size, linger_s, clock=clock):
        assert handed + got == pulled  # all it pulled is handed over, in order
        assert len(got) <= batch_size
        handed += got
    assert handed == [s for s in steps if s is not None and not isinstance(s, tuple)]


def _no_clock() -> float:
    raise AssertionError("an in-memory list is sliced: no clock reading per record")


@pytest.mark.parametrize("kind", [list, tuple])
def test_a_list_or_tuple_is_sliced_without_a_step_per_record(kind: type) -> None:
    got = list(iterable_batches(kind(range(10)), threading.Event(), 4, 60.0, clock=_no_clock))
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(type(b) is list for b in got)  # lists the caller may keep, not slices of a tuple


def test_records_whose_equality_is_not_a_bool_are_sliced_too() -> None:
    import numpy as np

    arrays = [np.arange(3) + i for i in range(5)]  # array == None is an array: no bool, so `None in` would raise
    got = list(iterable_batches(arrays, threading.Event(), 2, 60.0, clock=_no_clock))
    assert [len(b) for b in got] == [2, 2, 1]
    assert all(a is b for a, b in zip(chain.from_iterable(got), arrays, strict=True))


def test_stop_between_slices_ends_a_list_source() -> None:
    stop = threading.Event()
    gen = iterable_batches(list(range(10)), stop, 4, 60.0, clock=_no_clock)
    assert next(gen) == [0, 1, 2, 3]
    stop.set()
    assert list(gen) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | st.integers(0, 9)), st.integers(1, 5))
def test_a_list_gives_what_its_iterator_gives_and_none_keeps_its_meaning(values: list[Any], batch_size: int) -> None:
    sliced = list(iterable_batches(values, threading.Event(), batch_size, 60.0, clock=Clock()))
    one_by_one = list(iterable_batches(iter(values), threading.Event(), batch_size, 60.0, clock=Clock()))
    assert [*chain.from_iterable(sliced)] == [*chain.from_iterable(one_by_one)] == [v for v in values if v is not None]
    assert all(len(b) <= batch_size for b in sliced)
    assert sliced.count([]) == values.count(None)  # each None: an empty poll, as the iterator's
    if None not in values:
        assert sliced == one_by_one
