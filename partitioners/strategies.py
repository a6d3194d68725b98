"""The partitioning strategies of a source, each with a live and a replay form.

========== ==================================== ===================================
strategy   live (:meth:`select`)                replay (:meth:`select_replay`)
========== ==================================== ===================================
fields     ``pmod(key_hash, n)``                ``pmod(record.key_hash, n)``: same
rebalance  round robin from an offset           round robin: any channel, balanced
shuffle    uniform random                       uniform random
global     channel 0                            channel 0
========== ==================================== ===================================

``pmod(key_hash, n)`` is Python's ``%`` on the signed hash, which equals Spark
SQL's ``pmod(xxhash64(key), n)``. The random strategies are fork-safe: a copy
running in another process (a fork, or a Spark worker that unpickled it)
draws a fresh random state before its first use.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

from ftlayer.errors import PartitioningError
from partitioners.base import Partitioner, RoutedRecord


def _random_below(n: int) -> int:
    return int.from_bytes(os.urandom(8), "little") % n


class FieldsPartitioner(Partitioner):
    """Key-based routing: ``channel = pmod(key_hash, n)``. Pure and deterministic."""

    strategy = "fields"

    def select(
        self, key_hash: int | None = None, upstream_channel: int | None = None
    ) -> list[int]:
        """``[pmod(key_hash, n)]``; ``key_hash`` is required."""
        if key_hash is None:
            msg = "fields partitioner: select() needs the key hash of the record (key_hash=...)"
            raise PartitioningError(msg)
        return [key_hash % self._num_channels]

    def select_channels(self, key_hashes: Sequence[int]) -> list[int]:
        """``pmod(h, n)`` for each hash (``PartitioningError`` if one is None, as for select)."""
        n = self._num_channels
        try:
            return [h % n for h in key_hashes]
        except TypeError:
            return super().select_channels(key_hashes)  # raises select's own error for a None

    def select_channel_array(self, key_hashes: Any) -> Any:
        """``pmod(h, n)`` for each hash of an ``int64`` array, in one step (numpy's ``%`` of a signed
        integer by a positive one is non-negative, as Python's and Spark's ``pmod``)."""
        return key_hashes % self._num_channels

    def select_replay(self, record: RoutedRecord) -> list[int]:
        """``[pmod(record.key_hash, n)]``: the channel the live record went to."""
        return [record.key_hash % self._num_channels]


class RebalancePartitioner(Partitioner):
    """Round robin. Live and replay keep separate counters.

    Contract: any channel; over any ``k * n`` consecutive calls of one form,
    every channel is chosen exactly ``k`` times. Both counters start at
    ``offset`` if given (deterministic everywhere), else at a random channel that
    is drawn again in every other process and in every unpickled copy, so that
    parallel tasks do not all start on the same channel.
    """

    strategy = "rebalance"

    def __init__(self, num_channels: int, offset: int | None = None) -> None:
        super().__init__(num_channels)
        self._offset = None if offset is None else offset % self._num_channels
        self._pid = os.getpid()
        self._live_next = self._replay_next = 0
        self._restart()

    def _restart(self) -> None:
        self._pid = os.getpid()
        if self._offset is None:
            self._live_next = _random_below(self._num_channels)
            self._replay_next = _random_below(self._num_channels)
        else:
            self._live_next = self._replay_next = self._offset

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._offset is None:
            self._pid = -1  # redraw the start before the first use

    def select(
        self, key_hash: int | None = None, upstream_channel: int | None = None
    ) -> list[int]:
        """The next channel of the live round robin."""
        if self._offset is None and self._pid != os.getpid():
            self._restart()
        channel = self._live_next
        self._live_next = (channel + 1) % self._num_channels
        return [channel]

    def select_channels(self, key_hashes: Sequence[int]) -> list[int]:
        """The next ``len(key_hashes)`` channels of the live round robin (hashes not read)."""
        if self._offset is None and self._pid != os.getpid():
            self._restart()
        n, start = self._num_channels, self._live_next
        self._live_next = (start + len(key_hashes)) % n
        return [(start + i) % n for i in range(len(key_hashes))]

    def select_replay(self, record: RoutedRecord) -> list[int]:
        """The next channel of the replay round robin (the record is not read)."""
        if self._offset is None and self._pid != os.getpid():
            self._restart()
        channel = self._replay_next
        self._replay_next = (channel + 1) % self._num_channels
        return [channel]


class ShufflePartitioner(Partitioner):
    """Uniform random channel, live and replay, from one ``random.Random``.

    With ``seed`` the stream is reproducible in the process that created the
    instance (for tests). Otherwise, and in any other process (a fork, a Spark
    worker), the generator is seeded from ``os.urandom`` before its first draw;
    an unpickled unseeded copy reseeds too, so copies never share a stream.
    """

    strategy = "shuffle"

    def __init__(self, num_channels: int, seed: int | None = None) -> None:
        super().__init__(num_channels)
        self._seeded = seed is not None
        self._rng = random.Random(seed)
        self._pid = os.getpid()
        if seed is None:
            self._reseed()

    def _reseed(self) -> None:
        self._rng.seed(os.urandom(32))
        self._pid = os.getpid()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if not self._seeded:
            self._pid = -1

    def _draw(self) -> int:
        if self._pid != os.getpid():
            self._reseed()
        return self._rng.randrange(self._num_channels)

    def select(
        self, key_hash: int | None = None, upstream_channel: int | None = None
    ) -> list[int]:
        """One uniformly random channel."""
        return [self._draw()]

    def select_replay(self, record: RoutedRecord) -> list[int]:
        """One uniformly random channel (the record is not read)."""
        return [self._draw()]


class GlobalPartitioner(Partitioner):
    """Everything to channel 0."""

    strategy = "global"

    def select(
        self, key_hash: int | None = None, upstream_channel: int | None = None
    ) -> list[int]:
        """``[0]``."""
        return [0]

    def select_channels(self, key_hashes: Sequence[int]) -> list[int]:
        """Channel 0 for each."""
        return [0] * len(key_hashes)

    def select_channel_array(self, key_hashes: Any) -> Any:
        """Channel 0 for each (an ``int64`` array)."""
        import numpy as np

        return np.zeros(len(key_hashes), dtype=np.int64)

    def select_replay(self, record: RoutedRecord) -> list[int]:
        """``[0]``."""
        return [0]
