"""ftlayer: record-level at-least-once processing for PySpark Structured Streaming.

The public face, all importable from here::

    from ftlayer import Topology, FTConfig, FailRecord, JsonLinesSink, local_session

The core package (``ftlayer.*``) stands in floors (docs/architecture.md, "The house"):
``records`` (the record format and ids), ``keyspace`` and ``scripting`` (key names,
the server-side Lua), ``store`` (talking to Redis), ``acker`` and ``servers`` (the FT
components over a shard's store; the embedded servers and state directory),
``facade`` and ``status`` (one source as a whole; the read model), over ``config``,
``logs`` and ``errors``. It imports no other package of the distribution. The names that live higher up (the topology
API, the query handle, sinks, the testing helpers, the Spark session helper)
are resolved by name on first use (PEP 562), so importing the core never loads
the runtime or Spark.
"""

from __future__ import annotations

import importlib
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import FailRecord, FTLayerError
from ftlayer.records.ids import RecordId

__version__ = "0.1.0"

# name -> the module that defines it (imported on first access)
_LAZY: dict[str, str] = {
    "Topology": "runtime.topology",
    "Stream": "runtime.topology",
    "FTQuery": "runtime.query",
    "ExecutorSink": "runtime.sinks",
    "CallableSink": "runtime.sinks",
    "JsonLinesSink": "runtime.sinks",
    "RedisHashSink": "runtime.sinks",
    "ForeachBatchSink": "runtime.sinks",
    "SinkContext": "runtime.sinks",
    "local_session": "runtime.spark.session",
    "reset_timeout": "runtime.spark.current_record",
    # the DataFrame path (readStream ... writeStream with record-level fault tolerance)
    "read_stream": "runtime.dataframe",
    "ingest": "runtime.dataframe",
    "register_format": "runtime.dataframe",
    "acking": "runtime.dataframe",
    "acking_sink": "runtime.dataframe",
    "udf": "runtime.dataframe",
    "map_in_pandas": "runtime.dataframe",
    "with_metadata": "runtime.dataframe",
    "source": "runtime.dataframe",
    "stop_all": "runtime.dataframe",
    "stop_query": "runtime.driver.query_stop",
    # effectively-once sinks: writes keyed by lineage id (ftlayer.records.lineage), one per target
    "postgres_sink": "runtime.idempotent.postgres",
    "PostgresSink": "runtime.idempotent.postgres",
    "delta_sink": "runtime.idempotent.delta",
    "DeltaSink": "runtime.idempotent.delta",
    "redis_sink": "runtime.idempotent.redis_hash",
    "RedisOnceSink": "runtime.idempotent.redis_hash",
}

__all__ = [
    "CallableSink",
    "DeltaSink",
    "ExecutorSink",
    "FTConfig",
    "FTLayerError",
    "FTQuery",
    "FailRecord",
    "ForeachBatchSink",
    "JsonLinesSink",
    "PostgresSink",
    "RecordId",
    "RedisHashSink",
    "RedisOnceSink",
    "SinkContext",
    "Stream",
    "Topology",
    "__version__",
    "acking",
    "acking_sink",
    "delta_sink",
    "ingest",
    "local_session",
    "map_in_pandas",
    "postgres_sink",
    "read_stream",
    "redis_sink",
    "register_format",
    "reset_timeout",
    "source",
    "stop_all",
    "stop_query",
    "udf",
    "with_metadata",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module 'ftlayer' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
