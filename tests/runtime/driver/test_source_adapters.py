"""The kinds of user source as ingest sees them (runtime/driver/source_adapters.py)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from runtime.driver.source_adapters import is_plain_iterable, source_iterator, source_polls


class _Polls:
    def __init__(self, polls: list[list[Any]]) -> None:
        self.polls = polls
        self.opened = self.closed = False

    def open(self) -> None:
        self.opened = True

    def poll(self) -> list[Any] | None:
        return self.polls.pop(0) if self.polls else None

    def close(self) -> None:
        self.closed = True


def test_a_poll_source_hands_over_whole_polls_without_its_nones() -> None:
    source = _Polls([[1, None, 2], [], [3]])
    assert list(source_polls(source, threading.Event())) == [[1, 2], [], [3]]
    assert source.opened and source.closed and not is_plain_iterable(source)


def test_records_whose_equality_is_not_a_bool_pass_a_poll() -> None:
    arrays = [np.arange(3), np.arange(2)]  # array == None is an array: `None in` would raise
    got = list(source_polls(_Polls([[arrays[0], None, arrays[1]]]), threading.Event()))
    assert len(got) == 1 and [a is b for a, b in zip(got[0], arrays, strict=True)] == [True, True]


def test_a_callable_source_gives_records_none_when_idle_and_ends_on_stop_iteration() -> None:
    calls = iter([[1, 2], None, 3])

    def source() -> Any:
        return next(calls)  # StopIteration once they are out

    assert not is_plain_iterable(source)
    assert list(source_iterator(source, threading.Event())) == [1, 2, None, 3]
    assert list(source_polls(iter([4, None, 5]), threading.Event())) == [[4], [], [5]]
