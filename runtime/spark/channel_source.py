"""What every ftlayer streaming source shares: partition ``i`` reads channel ``i``, rows of one contract.

The FT source (``runtime.spark.ft_source``, channel streams in Redis), the FT-off feed source
(``runtime.spark.feed_source``, a driver-side feed over TCP) and the typed FT source
(``runtime.spark.typed_source``) are one kind of source, and this module holds what they have
in common; each source module holds only what differs (its options, what an offset is, how a
channel range is read and committed):

- :class:`ChannelSource`: the ``DataSource``: its fixed schema is
  :data:`runtime.spark.row_contract.SOURCE_ROW`, and a schema other than that is refused
  naming the source (the typed source overrides :meth:`ChannelSource.streamReader` to accept a
  user schema).
- :class:`ChannelPartition`: input partition ``channel`` of a micro-batch, the range
  ``(start, end]`` of that channel. ``partitions(start, end)`` returns one per channel, always,
  empty ranges included, so ``TaskContext.partitionId()`` is the channel in ``read()`` and
  anywhere downstream before a shuffle.
- :class:`ChannelStreamReader`: the reader's shared state and plumbing: the options, the
  channels, the ``Trigger.AvailableNow`` target (the tails when the query started), the tails
  the last ``latestOffset`` saw (for progress reports), and the default read limit
  (``ReadMaxRows(max_records_per_batch)`` if that option is set; see
  :mod:`runtime.spark.admission`). A source gives :meth:`ChannelStreamReader.tails`.

Which process runs what (pyspark 4.3): ``initialOffset``, ``latestOffset``, ``partitions``
and ``commit`` run in the query's long-lived ``python_streaming_source_runner`` process on the
driver machine; ``read`` runs in executor Python workers on a pickled reader. Neither is the
user's driver process, so every connection is created lazily where it is used and never pickled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ftlayer.errors import ConfigError
from runtime.spark.admission import AvailableNowBase, read_all, read_max_rows
from runtime.spark.row_contract import SOURCE_ROW

__all__ = ["ChannelOptions", "ChannelPartition", "ChannelSource", "ChannelStreamReader", "Offset"]

#: An offset: one position per channel stream, by key (the sources say what key and position are).
Offset = dict[str, Any]


class ChannelOptions(Protocol):
    """What the shared plumbing reads of a source's parsed options."""

    @property
    def num_channels(self) -> int: ...

    @property
    def max_records_per_batch(self) -> int | None: ...


class ChannelPartition(InputPartition):
    """Input partition ``channel`` of a micro-batch: positions ``(start, end]`` of that channel."""

    def __init__(self, channel: int, start: Any, end: Any) -> None:
        super().__init__(channel)
        self.channel = channel
        self.start = start
        self.end = end


class ChannelStreamReader(DataSourceStreamReader, AvailableNowBase):  # type: ignore[misc]
    """A stream reader whose partition ``i`` reads channel ``i`` (see the module notes)."""

    def __init__(self, options: ChannelOptions) -> None:
        self.opts = options
        self._target: Offset | None = None  # Trigger.AvailableNow: tails when the query started
        self._last_tails: Offset | None = None  # seen by the last latestOffset, for progress reports

    @property
    def channels(self) -> range:
        return range(self.opts.num_channels)

    def tails(self, *, trim_upto: Mapping[str, Any] | None = None) -> Offset:
        """Every channel's newest position, in one round trip; with ``trim_upto`` (an offset the
        query has completed), the same round trip first drops what lies up to it."""
        raise NotImplementedError

    def getDefaultReadLimit(self) -> Any:
        """``ReadMaxRows(max_records_per_batch)`` if that option is set, else read all available."""
        n = self.opts.max_records_per_batch
        return read_all() if n is None else read_max_rows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: remember the current tails; no batch reads past them."""
        self._target = self.tails()

    def reportLatestOffset(self) -> Offset:
        """The tails, for the query's progress report (those the last ``latestOffset`` saw)."""
        return dict(self._last_tails) if self._last_tails is not None else self.tails()


class ChannelSource(DataSource):
    """A channel source's ``DataSource``: format :attr:`FORMAT`, the fixed schema ``SOURCE_ROW``."""

    FORMAT: ClassVar[str]
    LABEL: ClassVar[str]  # how errors name the source: "FT source", "feed source"

    @classmethod
    def name(cls) -> str:
        return cls.FORMAT

    def schema(self) -> StructType:
        return SOURCE_ROW.struct_type()

    def streamReader(self, schema: StructType) -> ChannelStreamReader:
        if not SOURCE_ROW.same_struct(schema):
            msg = f"the {self.LABEL} has the fixed schema {SOURCE_ROW.ddl!r}; got {schema.simpleString()!r}"
            raise ConfigError(msg)
        return self.open_reader()

    def open_reader(self) -> ChannelStreamReader:
        """A new reader of this source, from its options (parsed and validated)."""
        raise NotImplementedError
