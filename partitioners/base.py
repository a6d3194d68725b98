"""The partitioner interfaces: a live form and a replay form per strategy.

A partitioner routes one record to one or more *channels* (partitions of one
successor), numbered ``0 .. num_channels - 1``; ``num_channels`` is fixed for
the lifetime of an instance.

- :class:`ReplayPartitioner` is the replay form, the counterpart of the original
  design's ReplayPartitioner: it routes a persisted record using only what the
  FT layer persisted with it, the record's ``key_hash`` and ``channel``
  (:class:`RoutedRecord`).
- :class:`Partitioner` adds the live form, :meth:`Partitioner.select`, used
  when the record is first emitted. Every concrete strategy implements both, so
  that the replay of a record goes where its strategy's contract allows: the
  same channel for ``fields``, ``global`` and ``forward``; every channel for
  ``broadcast``; any channel (balanced or uniform) for ``rebalance`` and
  ``shuffle``.

Every partitioner is picklable (it ships to Spark executors) and is *not*
thread-safe: use one instance per task or thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

from ftlayer.acker.channels import validate_num_channels


class RoutedRecord(Protocol):
    """What a replay partitioner reads from a persisted record.

    ``ftlayer.records.frames.SemiDeserializedRecord`` satisfies it. ``key_hash``
    is the signed 64-bit Spark ``xxhash64`` of the source's key (meaningful only
    if the source has a ``fields`` successor); ``channel`` is the partition the
    record was emitted from, or ``None`` if it was not recorded.
    """

    @property
    def key_hash(self) -> int: ...

    @property
    def channel(self) -> int | None: ...


class PersistedRoute(NamedTuple):
    """A minimal :class:`RoutedRecord`: just the two persisted routing fields."""

    key_hash: int
    channel: int | None


class ReplayPartitioner(ABC):
    """Routes replayed records from their persisted routing fields.

    Subclasses set the class attribute ``strategy`` (its name in the factory).
    """

    strategy: ClassVar[str]

    def __init__(self, num_channels: int) -> None:
        """Raise :class:`PartitioningError` unless ``num_channels`` is an integer >= 1."""
        self._num_channels = validate_num_channels(num_channels, f"{self.strategy} partitioner")

    @property
    def num_channels(self) -> int:
        """The number of channels ``n``; every selected channel is in ``[0, n)``."""
        return self._num_channels

    @abstractmethod
    def select_replay(self, record: RoutedRecord) -> list[int]:
        """Channels a replay of ``record`` goes to: one channel, or all for broadcast.

        Reads only ``record.key_hash`` and ``record.channel``.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_channels={self._num_channels})"


class Partitioner(ReplayPartitioner):
    """A strategy with both forms: live routing (:meth:`select`) and replay routing."""

    def select_channels(self, key_hashes: Sequence[int]) -> list[int]:
        """The channel of each of a batch of live records with these key hashes, in order:
        ``select(key_hash=h)[0]`` for each (ingest's hot path; strategies that can, do it
        without a call per record). For a strategy that selects one channel per record."""
        select = self.select
        return [select(key_hash=h)[0] for h in key_hashes]

    def select_channel_array(self, key_hashes: Any) -> Any:
        """:meth:`select_channels` over a numpy ``int64`` array of key hashes, as an ``int64``
        array (ingest's batches when their hashes are an array); strategies that can do it in one
        array step override it."""
        import numpy as np

        return np.asarray(self.select_channels(key_hashes.tolist()), dtype=np.int64)

    @abstractmethod
    def select(
        self, key_hash: int | None = None, upstream_channel: int | None = None
    ) -> list[int]:
        """Channels a live record goes to.

        ``key_hash`` is required by ``fields`` (the Spark ``xxhash64`` of the
        record's key, see :func:`ftlayer.records.keyhash.key_hash`); ``upstream_channel``
        (the partition the record is in now) is required by ``forward``. Other
        strategies ignore both. A missing required argument raises
        :class:`PartitioningError`.
        """
