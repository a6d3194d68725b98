"""The DataFrame path: record-level fault tolerance inside a readStream ... writeStream pipeline.

Five names do the work (all also importable from ``ftlayer``)::

    df = ftlayer.read_stream(spark, "clicks", "events", schema="user string, page string, ts timestamp")
    ftlayer.ingest("clicks", "events", records)            # persist before visible, on the driver
    parse = ftlayer.udf(fn, "string")                      # a raising row fails its record only
    out = ftlayer.map_in_pandas(df, fn, schema)            # same, for a pandas batch function
    df.writeStream.foreachBatch(ftlayer.acking(write))     # ack the batch's records after write
    df.writeStream.format(ftlayer.acking_sink(spark, fn))  # or a per-task writer; ack at its commit

Modules: ``sources`` (driver handles: ingest, FT service, reading), ``acking``
(the foreachBatch acking point), ``writer`` (the per-task acking stream writer), ``rowfn`` (row
functions). The typed Spark data source
itself is ``runtime.spark.typed_source``; the batch ack bookkeeping is
``ftlayer.acker.batch_acks``. docs/guarantees.md states what is per record and what
is per batch on this path.
"""

from __future__ import annotations

from runtime.dataframe.acking import acking, settle_batch
from runtime.dataframe.rowfn import map_in_pandas, udf
from runtime.dataframe.sources import (
    SourceHandle,
    ingest,
    read_stream,
    register_format,
    source,
    stop_all,
    with_metadata,
)
from runtime.dataframe.writer import acking_sink

__all__ = [
    "SourceHandle",
    "acking",
    "acking_sink",
    "ingest",
    "map_in_pandas",
    "read_stream",
    "register_format",
    "settle_batch",
    "source",
    "stop_all",
    "udf",
    "with_metadata",
]
