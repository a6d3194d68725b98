"""The declared source contract (runtime.sources) and how ingest and the topology use it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import TopologyError
from runtime.driver.source_adapters import source_iterator
from runtime.sources import AckingSource, PausableSource, PollSource, is_source
from runtime.topology import Topology


class Polled:
    def __init__(self) -> None:
        self.batches: list[list[int] | None] = [[1, 2], [], [3], None]
        self.opened = self.closed = False

    def open(self) -> None:
        self.opened = True

    def poll(self) -> list[int] | None:
        return self.batches.pop(0)

    def close(self) -> None:
        self.closed = True

    def ack(self, values: list[Any]) -> None:
        pass


def test_the_three_kinds_are_sources_and_other_things_are_not() -> None:
    assert is_source([1, 2]) and is_source(iter(range(3))) and is_source(lambda: None) and is_source(Polled())
    assert not is_source(42) and not is_source(object())
    assert isinstance(Polled(), PollSource) and isinstance(Polled(), AckingSource)
    assert not isinstance(Polled(), PausableSource)


def test_a_poll_source_is_opened_polled_to_none_and_closed() -> None:
    src = Polled()
    got = list(source_iterator(src, threading.Event()))
    assert got == [1, 2, None, 3]
    assert src.opened and src.closed


def test_topology_refuses_a_non_source_naming_it(ft_config: FTConfig) -> None:
    with pytest.raises(TopologyError, match=r"source 'events': 'int' is no source"):
        Topology("t", ft_config).source("events", 42)
