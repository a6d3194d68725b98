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

Configuration, as on the Topology path: the config given, else ``FTConfig.load()``
(``ftlayer.toml`` < ``FTLAYER_*``), then the ``spark.ftlayer.*`` keys of the session
(the one passed, else the active one) for every option not set in code.

**Durable by default, one state model** (``ftlayer.servers.state_dir``): with no ``redis_url`` the
embedded server runs on the topology's state directory, ``<state_dir>/<topology>/redis/``
(its AOF), the same one a ``Topology`` of that name uses, with the same lock (one process
at a time) and the same die-with-the-driver rules: a re-run of the same program finds the
records a killed driver left pending. A non-local Spark master without ``redis_url`` is
refused (executors elsewhere cannot reach an embedded server on the driver).

**A server that is down at start** is waited for, with backoff, for up to
``outage_budget_s`` (as a running query waits), before :class:`RedisUnavailableError`.

Handles are cached per process by (namespace, topology, source) in
:func:`source`, so ``read_stream``, ``ingest`` and the acking helpers of the
same process share one config (and one embedded server when the config has no
``redis_url``). :func:`last_config` is the config of the most recent handle:
what :func:`runtime.dataframe.acking.acking` and the row functions use when
given none. :func:`read_stream` also attaches, once per session, the commit
listener (``runtime.dataframe.commits``: acks committed batches), the progress
log listener and, with ``metrics_port``, the Prometheus exporter
(``runtime.driver``), as a topology does.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from redis.backoff import ExponentialBackoff

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError, RedisUnavailableError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.facade.service import FTService
from ftlayer.logs import logger_for
from ftlayer.servers.state_dir import TopologyState
from runtime.dataframe.session_state import (
    active_session,
    config_or_last,
    last_config,
    remember_embedded,
    remember_last,
    session_config,
)
from runtime.driver.ingest import Ingestor, KeySelector
from runtime.spark.conf import check_reachable_redis
from runtime.spark.connect import check_server_reaches
from runtime.spark.ddl import parse_schema
from runtime.spark.ft_data_sources import FORMAT, register
from runtime.spark.ft_options import source_options
from runtime.spark.payload_columns import METADATA_COLUMN, metadata_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from runtime.driver.metrics import MetricsExporter

__all__ = [
    "SourceHandle", "active_session", "config_or_last", "ingest", "last_config", "open_waiting", "read_stream",
    "register_format", "session_config", "source", "stop_all", "with_metadata",
]

log = logger_for(__name__)
_lock = threading.Lock()
_handles: dict[tuple[str, str, str], SourceHandle] = {}


def with_metadata(schema: StructType | str) -> StructType:
    """``schema`` (a DDL string or StructType) with the ``_ftlayer`` metadata column appended."""
    from pyspark.sql.types import StructField, StructType

    st = parse_schema(schema)
    if METADATA_COLUMN in st.fieldNames():
        return st
    return StructType([*st.fields, StructField(METADATA_COLUMN, metadata_type(), nullable=False)])


class SourceHandle:
    """One ftlayer source on the driver (see the module notes). Not picklable: driver only."""

    def __init__(self, config: FTConfig, topology: str, name: str, num_channels: int) -> None:
        self.config = config
        self.topology = topology
        self.name = name
        self.num_channels = num_channels
        self.layer = open_waiting(FTLayer(config, topology, name, num_channels=num_channels), config)
        self.service: FTService | None = None
        self.ingestors: list[Ingestor] = []
        self.exporter: MetricsExporter | None = None
        self._observed: Any = None  # the session whose listeners watch this source

    def ingest(self, records: Any, *, key: KeySelector | None = None, partitioning: str | None = None,
               schema: StructType | str | None = None, keep_columns: bool = True) -> Ingestor:
        """Start persisting ``records`` (any ingest source) in a driver thread; returns the Ingestor.

        With ``schema`` (the columns the queries read, as ``read_stream`` takes them) each record is
        checked against it at ingest: one that does not fit is dead-lettered at once with the reason
        naming its column (``ingest: does not fit the schema: ...``), never persisted for processing,
        so no read fails it and no replay is spent on it (:mod:`runtime.spark.schema_check`). The
        records that fit are kept as Arrow columns too, which a query reading with the same schema
        takes without unpacking the payloads (:mod:`ftlayer.records.chunk_columns`; Redis holds both);
        ``keep_columns=False`` checks only. A DDL string is read by Spark's parser when a SparkSession
        exists, else by ftlayer's own (:func:`runtime.spark.ddl.parse_schema`)."""
        check = None
        if schema is not None:
            from runtime.spark.schema_check import SchemaCheck

            check = SchemaCheck(parse_schema(schema), keep_columns=keep_columns)
        elif not keep_columns:
            msg = "keep_columns=False says what to keep of the records a schema checks: give schema= too"
            raise ConfigError(msg)
        ingestor = Ingestor(self.layer, records, key=key, partitioning=partitioning, check=check).start()
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
        options = source_options(self.config, self.topology, self.name, self.num_channels,
                                 max_records_per_batch=max_records_per_batch)
        return spark.readStream.format(FORMAT).options(**options).schema(with_metadata(schema)).load()

    def observe(self, spark: SparkSession) -> None:
        """Attach the session's commit and progress listeners and, with ``metrics_port``, start the
        metrics exporter for this source (each once)."""
        from runtime.dataframe import commits
        from runtime.dataframe.observe import progress_listener

        if self._observed is None:
            commits.attach(spark, self.config)
            progress_listener(spark).add(self.layer)
            self._observed = spark
        if self.exporter is None:
            from runtime.driver.metrics import MetricsExporter  # driver-side: executors need no prometheus_client

            self.exporter = MetricsExporter([self.layer], self.config).start()

    def stats(self) -> dict[str, int]:
        return self.layer.stats()

    def stop(self) -> None:
        """Stop this handle's ingest threads, FT service and metrics exporter (Redis state stays)."""
        for ingestor in self.ingestors:  # all asked first: their stop graces run side by side
            ingestor.request_stop()
        for ingestor in self.ingestors:
            ingestor.stop()
        if self.service is not None:
            self.service.stop()
        if self.exporter is not None:
            self.exporter.stop()
            self.exporter = None
        if self._observed is not None:  # the session's listeners stop asking this server
            from runtime.dataframe import commits, observe
            from runtime.dataframe.observe import progress_listener

            listener = commits.listener_of(self._observed)
            if listener is not None:
                listener.unwatch(self.config)
            progress_listener(self._observed).remove(self.layer)
            try:  # the session's listeners go with the last open source
                commits.detach_if_idle(self._observed)
                observe.detach_if_idle(self._observed)
            except Exception as exc:  # a stopped session: nothing left to detach from
                log.debug("could not detach the DataFrame listeners: %s", exc)
            self._observed = None


def open_waiting(layer: FTLayer, config: FTConfig) -> FTLayer:
    """``layer.open()``, waiting out an unreachable server with backoff for up to ``outage_budget_s``."""
    backoff = ExponentialBackoff(cap=2.0, base=0.1)
    start, failures = time.monotonic(), 0
    while True:
        try:
            return layer.open()
        except RedisUnavailableError as exc:
            failures += 1
            waited = time.monotonic() - start
            if waited >= config.outage_budget_s:
                msg = (f"Redis stayed unreachable for {waited:.0f} s (outage_budget_s={config.outage_budget_s:g}) "
                       f"while opening source {layer.keys.topology}/{layer.keys.source}: {exc}")
                raise RedisUnavailableError(msg) from exc
            if failures == 1:
                log.warning("Redis is unreachable (%s); waiting up to outage_budget_s=%g s",
                            exc, config.outage_budget_s)
            time.sleep(backoff.compute(failures))


def _resolve(config: FTConfig, topology: str, spark: Any) -> FTConfig:
    """``config`` with a URL: its own, or the topology's embedded server on its state directory."""
    if config.redis_url:
        return config
    if spark is not None:
        check_reachable_redis(str(spark.conf.get("spark.master", "local") or "local"), config)
        check_server_reaches(spark, config)
    server = TopologyState.open(config, topology).embedded_server(config)
    remember_embedded(config.namespace, server.url)
    return config.replace(redis_url=server.url)


def source(topology: str, name: str, *, config: FTConfig | None = None, num_channels: int | None = None,
           spark: Any = None) -> SourceHandle:
    """The process's handle of a source (created on first use; see the module notes for the config)."""
    session = spark if spark is not None else active_session()
    base = session_config(config, session)
    channels = num_channels or base.num_channels
    key = (base.namespace, topology, name)
    with _lock:
        handle = _handles.get(key)
        if handle is not None and handle.num_channels != channels:
            msg = (f"source {topology}/{name} is open with num_channels={handle.num_channels}; "
                   f"asked for {channels}")
            raise ConfigError(msg)
        if handle is None or (base.redis_url and handle.config.redis_url != base.redis_url):
            handle = _handles[key] = SourceHandle(_resolve(base, topology, session), topology, name, channels)
        remember_last(handle.config)
    return handle


def read_stream(spark: SparkSession, topology: str, source_name: str, *, schema: StructType | str,
                config: FTConfig | None = None, num_channels: int | None = None,
                max_records_per_batch: int | None = None) -> DataFrame:
    """``spark.readStream`` over an ftlayer source, typed by ``schema``, with its FT service started
    and the session's listeners attached."""
    handle = source(topology, source_name, config=config, num_channels=num_channels, spark=spark)
    handle.start_service()
    handle.observe(spark)
    return handle.read_stream(spark, schema, max_records_per_batch=max_records_per_batch)


def register_format(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("ftlayer")`` available in ``spark`` now; safe to repeat.

    :func:`read_stream` registers it too, and is the usual way in: it also starts the source's
    FT service (timeouts, replays, dead letters) and the session's listeners. A query that reads
    the format directly takes the source's options (``redisUrl``, ``namespace``, ``topology``,
    ``source``, ``numChannels``, optional ``maxRecordsPerBatch``; snake_case spellings are the
    same options) and needs that service running in some process, for example
    ``ftlayer.source(topology, name).start_service()`` on the driver.
    """
    register(spark)


def ingest(topology: str, source_name: str, records: Any, *, config: FTConfig | None = None,
           num_channels: int | None = None, key: KeySelector | None = None,
           partitioning: str | None = None, spark: Any = None, schema: StructType | str | None = None,
           keep_columns: bool = True) -> Ingestor:
    """Persist ``records`` into a source from a driver thread, independent of any query; with ``schema``,
    a record that does not fit it is dead-lettered at ingest, and the others are kept as Arrow columns
    too unless ``keep_columns=False`` (:meth:`SourceHandle.ingest`)."""
    handle = source(topology, source_name, config=config, num_channels=num_channels, spark=spark)
    return handle.ingest(records, key=key, partitioning=partitioning, schema=schema, keep_columns=keep_columns)


def stop_all() -> None:
    """Stop every handle's threads and forget the handles (tests, shutdown)."""
    with _lock:
        handles = list(_handles.values())
        _handles.clear()
    for handle in handles:
        handle.stop()
