"""``format("ftlayer")``'s ``DataSource`` classes, light to import: the readers come when asked for.

Why a module of their own. Spark pickles a Python data source's class by reference and
unpickles it in each Python process it starts to plan a read: one for ``load()``
(``create_data_source``: the class, its options and ``schema()``), one per query start
(``plan_data_source_read``: ``streamReader``), and the query's source runner. Only the last two
use a reader. Here the classes import nothing beyond pyspark's data-source API and
:mod:`runtime.spark.channel_source`; :class:`~runtime.spark.ft_source.FTStreamReader` and
:class:`~runtime.spark.typed_source.TypedStreamReader` (the Redis client, the acker, the payload
decoders: ~0.3 CPU-s of imports in a new process) are imported by ``streamReader``. So a ``load()``
costs Spark's planner process that much less; nothing else changes.

Contract: :class:`FTSource` reads the raw source schema (``SOURCE_ROW``, the Topology compiler);
:class:`FTDataSource`, what :func:`register` installs, reads the raw schema or a user schema (the
DataFrame path). :func:`register` and :func:`register_raw` are safe to repeat, and a session that
has the typed source keeps it. No module imported here imports this one back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from runtime.spark.channel_source import ChannelSource
from runtime.spark.option_names import FT_FORMAT
from runtime.spark.row_contract import SOURCE_ROW

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from ftlayer.config import FTConfig
    from runtime.spark.ft_source import FTStreamReader

__all__ = ["FORMAT", "REGISTERED_ATTR", "FTDataSource", "FTSource", "read_stream", "register", "register_raw"]

FORMAT = FT_FORMAT
REGISTERED_ATTR = "_ftlayer_format"  # set on a session once format "ftlayer" is registered in it


class FTSource(ChannelSource):
    """``format("ftlayer")``: the persisted records of one ftlayer source as a stream (raw schema)."""

    FORMAT = FORMAT
    LABEL = "FT source"

    def streamReader(self, schema: StructType) -> FTStreamReader:
        return cast("FTStreamReader", super().streamReader(schema))

    def open_reader(self) -> FTStreamReader:
        from runtime.spark.ft_options import FTSourceOptions
        from runtime.spark.ft_source import FTStreamReader

        return FTStreamReader(FTSourceOptions.parse(self.options))


class FTDataSource(FTSource):
    """``format("ftlayer")`` for both paths: the raw source schema (the Topology compiler) or a user schema."""

    def streamReader(self, schema: StructType) -> FTStreamReader:
        if SOURCE_ROW.same_struct(schema):
            return self.open_reader()
        from runtime.spark.ft_options import FTSourceOptions
        from runtime.spark.typed_source import TypedStreamReader

        return TypedStreamReader(FTSourceOptions.parse(self.options), schema)


def register(spark: SparkSession) -> None:
    """Register :class:`FTDataSource` as ``format("ftlayer")`` in the session; safe to repeat."""
    if getattr(spark, REGISTERED_ATTR, None) != "typed":
        spark.dataSource.register(FTDataSource)
        setattr(spark, REGISTERED_ATTR, "typed")


def register_raw(spark: SparkSession) -> None:
    """Register :class:`FTSource` (the raw schema only) unless the session has a ``format("ftlayer")``
    already: the typed source, a subclass that reads both schemas, is kept."""
    if getattr(spark, REGISTERED_ATTR, False):
        return
    spark.dataSource.register(FTSource)
    setattr(spark, REGISTERED_ATTR, True)


def read_stream(
    spark: SparkSession,
    config: FTConfig,
    topology: str,
    source: str,
    num_channels: int,
    *,
    max_records_per_batch: int | None = None,
    read_page_entries: int | None = None,
) -> DataFrame:
    """A streaming DataFrame of the source's persisted records (raw schema; registers the format first).

    ``config`` is resolved on the driver (an embedded server is started here if it
    has no URL), so executors connect to the same server by URL.
    """
    from ftlayer.servers.process_server import resolved
    from runtime.spark.ft_options import source_options

    cfg = resolved(config)
    register_raw(spark)
    options = source_options(cfg, topology, source, num_channels, max_records_per_batch=max_records_per_batch,
                             read_page_entries=read_page_entries)
    return spark.readStream.format(FORMAT).options(**options).load()
