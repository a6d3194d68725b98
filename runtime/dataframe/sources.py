"""Driver-side handles of ftlayer sources for the DataFrame path: ingest, timeouts, replay, reading.

A :class:`SourceHandle` is one source of one topology in one namespace:

- :meth:`SourceHandle.ingest` runs an :class:`~runtime.driver.ingest.Ingestor`
  thread on the driver (persist before visible; see that module's contract),
  independent of any query: records wait in Redis until a query reads them;
- :meth:`SourceHandle.start_service` runs the FT service (timeout rotation and
  replay of failed records, with backoff, then dead letters). Some driver must
  run it while records are consumed; :func:`read_stream` starts it, and the
  rotator lease keeps two drivers from rotating the same source;
- :meth:`SourceHandle.read_stream` gives the streaming DataFrame (typed
  columns plus ``_ftlayer``; see ``runtime.spark.typed_source``).

Handles are cached per process by (namespace, topology, source) in
:func:`source`, so ``read_stream``, ``ingest`` and the acking helpers of the
same process share one config (and one embedded server when the config has no
``redis_url``). :func:`last_config` is the config of the most recent handle:
what :func:`runtime.dataframe.acking.acking` and the row functions use when
given none.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ftlayer.config import FTConfig
from ftlayer.connection import resolved
from ftlayer.errors import ConfigError
from ftlayer.layer import FTLayer
from ftlayer.service import FTService
from runtime.driver.ingest import Ingestor, KeySelector
from runtime.spark.ft_source import FORMAT, FTSourceOptions
from runtime.spark.payload_columns import METADATA_COLUMN, metadata_type
from runtime.spark.typed_source import register

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "SourceHandle", "config_or_last", "ingest", "last_config", "read_stream", "source", "stop_all", "with_metadata",
]

_lock = threading.Lock()
_handles: dict[tuple[str, str, str], SourceHandle] = {}
_last: list[FTConfig] = []


def with_metadata(schema: StructType | str) -> StructType:
    """``schema`` (a DDL string or StructType) with the ``_ftlayer`` metadata column appended."""
    from pyspark.sql.types import StructField, StructType

    st = parse_schema(schema)
    if METADATA_COLUMN in st.fieldNames():
        return st
    return StructType([*st.fields, StructField(METADATA_COLUMN, metadata_type(), nullable=False)])


def parse_schema(schema: StructType | str) -> StructType:
    """A DDL string or StructType as a StructType; ConfigError for a DDL that is not a struct."""
    from pyspark.sql.types import StructType

    st = StructType.fromDDL(schema) if isinstance(schema, str) else schema
    if not isinstance(st, StructType):
        msg = f"an ftlayer schema must be a struct of columns; got {schema!r}"
        raise ConfigError(msg)
    return st


class SourceHandle:
    """One ftlayer source on the driver (see the module notes). Not picklable: driver only."""

    def __init__(self, config: FTConfig, topology: str, name: str, num_channels: int) -> None:
        self.config = config
        self.topology = topology
        self.name = name
        self.num_channels = num_channels
        self.layer = FTLayer(config, topology, name, num_channels=num_channels).open()
        self.service: FTService | None = None
        self.ingestors: list[Ingestor] = []

    def ingest(self, records: Any, *, key: KeySelector | None = None, partitioning: str | None = None) -> Ingestor:
        """Start persisting ``records`` (any ingest source) in a driver thread; returns the Ingestor."""
        ingestor = Ingestor(self.layer, records, key=key, partitioning=partitioning).start()
        self.ingestors.append(ingestor)
        return ingestor

    def start_service(self) -> FTService:
        """Start (once) the FT service of this source: timeouts, replays, dead letters."""
        if self.service is None or not self.service.alive:
            self.service = FTService([self.layer]).start()
        return self.service

    def read_stream(self, spark: SparkSession, schema: StructType | str, *,
                    max_records_per_batch: int | None = None) -> DataFrame:
        """The streaming DataFrame of this source in ``schema``'s columns plus ``_ftlayer``."""
        register(spark)
        options = {
            "redis_url": self.config.redis_url,
            "namespace": self.config.namespace,
            "topology": self.topology,
            "source": self.name,
            "num_channels": str(self.num_channels),
            "num_shards": str(self.config.num_shards),
            "connect_timeout_s": repr(self.config.connect_timeout_s),
        }
        if max_records_per_batch is not None:
            options["max_records_per_batch"] = str(max_records_per_batch)
        FTSourceOptions.parse(options)  # refuse bad values here, not in a Spark worker
        return spark.readStream.format(FORMAT).options(**options).schema(with_metadata(schema)).load()

    def stats(self) -> dict[str, int]:
        return self.layer.stats()

    def stop(self) -> None:
        """Stop this handle's ingest threads and FT service (Redis state stays)."""
        for ingestor in self.ingestors:
            ingestor.stop()
        if self.service is not None:
            self.service.stop()


def source(topology: str, name: str, *, config: FTConfig | None = None,
           num_channels: int | None = None) -> SourceHandle:
    """The process's handle of a source (created on first use; config resolved to a URL once)."""
    cfg = resolved(config if config is not None else FTConfig.load())
    channels = num_channels or cfg.num_channels
    key = (cfg.namespace, topology, name)
    with _lock:
        handle = _handles.get(key)
        if handle is not None and handle.num_channels != channels:
            msg = (f"source {topology}/{name} is open with num_channels={handle.num_channels}; "
                   f"asked for {channels}")
            raise ConfigError(msg)
        if handle is None or handle.config.redis_url != cfg.redis_url:
            handle = _handles[key] = SourceHandle(cfg, topology, name, channels)
        _last[:] = [handle.config]
    return handle


def read_stream(spark: SparkSession, topology: str, source_name: str, *, schema: StructType | str,
                config: FTConfig | None = None, num_channels: int | None = None,
                max_records_per_batch: int | None = None) -> DataFrame:
    """``spark.readStream`` over an ftlayer source, typed by ``schema``, with its FT service started."""
    handle = source(topology, source_name, config=config, num_channels=num_channels)
    handle.start_service()
    return handle.read_stream(spark, schema, max_records_per_batch=max_records_per_batch)


def ingest(topology: str, source_name: str, records: Any, *, config: FTConfig | None = None,
           num_channels: int | None = None, key: KeySelector | None = None,
           partitioning: str | None = None) -> Ingestor:
    """Persist ``records`` into a source from a driver thread, independent of any query."""
    handle = source(topology, source_name, config=config, num_channels=num_channels)
    return handle.ingest(records, key=key, partitioning=partitioning)


def config_or_last(config: FTConfig | None) -> FTConfig:
    """``config`` with its Redis URL resolved (the embedded server's, as :func:`source` resolves
    it), or :func:`last_config` when None. Every acking point and row function goes through it:
    a config without a URL must never reach an executor or a settle call."""
    return resolved(config) if config is not None else last_config()


def last_config() -> FTConfig:
    """The config of the most recently opened source handle; ConfigError if none was opened."""
    if not _last:
        msg = "no ftlayer source was opened in this process: pass config= (or call ftlayer.read_stream first)"
        raise ConfigError(msg)
    return _last[0]


def stop_all() -> None:
    """Stop every handle's threads and forget the handles (tests, shutdown)."""
    with _lock:
        handles = list(_handles.values())
        _handles.clear()
    for handle in handles:
        handle.stop()
