"""The typed FT source: ``format("ftlayer")`` with a user schema (the DataFrame path).

``spark.readStream.format("ftlayer").options(...).schema(s).load()`` with ``s``
other than the raw source schema gives one row per persisted source record in
``s``'s columns (decoded by :mod:`runtime.spark.payload_columns`), plus the
metadata struct ``_ftlayer`` if ``s`` declares it (``ftlayer.read_stream``
always does). Offsets, partitions, paging and commit are those of
:class:`~runtime.spark.ft_source.FTStreamReader`.

What ``read()`` adds, per page of a channel:

- the values come from the page's chunks' columns sections when the source was ingested with
  this schema (``ftlayer.records.chunk_columns``, :mod:`runtime.spark.stored_columns`): no
  payload is unpacked; otherwise from the payloads;
- records whose value does not fit the schema are failed at once (one flush
  call, reason naming the column): they are replayed with backoff and then
  dead-lettered, and never reach Spark; the query goes on;
- the ids of the records it emits are filed for the micro-batch
  (:meth:`ftlayer.acker.batch_acks.BatchAcks.record`: one round trip, before the
  rows are handed to Spark) under the batch's tag (its partition carries it),
  and the tag is listed under the query id and batch id that Spark puts in the
  task's local properties (``sql.streaming.queryId``, ``streaming.sql.batchId``),
  or, when they are missing (Spark Connect runs the jobs of a ``foreachBatch``
  function outside the query's thread), under the batch token among the task's
  job tags (``runtime.spark.connect``).

**Acked at Spark's commit.** A read task never acks. Once Spark has written the
batch's commit log entry, it calls this reader's ``latestOffset(start)`` (or
``commit(end)``) with the batch's end, and the reader acks every record the
batch emitted that is still pending (:meth:`TypedStreamReader.settle`); the
DataFrame path's commit listener does the same from the driver
(``runtime.dataframe.commits``). So whatever the sink (``foreachBatch``, the
acking writer, Spark's own file or Kafka sinks) a record is acked only once
its batch's output and state are committed, and a batch that Spark re-runs
(it failed before its commit log entry) reads its records again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.types import StructType

from ftlayer.errors import ConfigError
from runtime.spark.connect import JOB_TAGS_PROPERTY, token_from_job_tags
from runtime.spark.ft_source import FTPartition, FTSourceOptions, FTStreamReader
from runtime.spark.payload_columns import METADATA_COLUMN, decode_batch, metadata_type

__all__ = [
    "BATCH_ID_PROPERTY", "QUERY_ID_PROPERTY", "TypedStreamReader", "batch_identity",
]

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # stable across restarts from the same checkpoint
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def batch_identity(get: Any) -> tuple[str, int] | None:
    """``(query id, batch id)`` from a ``getLocalProperty`` callable, or None outside a streaming batch."""
    qid, bid = get(QUERY_ID_PROPERTY), get(BATCH_ID_PROPERTY)
    if not qid or bid is None or bid == "":
        return None
    return str(qid), int(bid)


class TypedStreamReader(FTStreamReader):
    """FT stream reader that decodes payloads into ``schema`` and files emitted ids per batch."""

    NOTES_SKIPS = True  # a record a re-read of the batch skipped must not complete late (BATCH_SETTLE)

    def __init__(self, options: FTSourceOptions, schema: StructType) -> None:
        super().__init__(options)
        meta = [f for f in schema.fields if f.name == METADATA_COLUMN]
        if meta and meta[0].dataType != metadata_type():
            msg = (f"column {METADATA_COLUMN!r} of an FT source schema must be "
                   f"{metadata_type().simpleString()!r}; got {meta[0].dataType.simpleString()!r}")
            raise ConfigError(msg)
        if len(schema.fields) == len(meta):
            msg = "an FT source schema needs at least one column besides _ftlayer"
            raise ConfigError(msg)
        self.schema = schema

    def read(self, partition: FTPartition) -> Iterator[Any]:  # type: ignore[override]
        from pyspark import TaskContext

        ctx = TaskContext.get()
        ident = batch_identity(ctx.getLocalProperty) if ctx is not None else None
        token = None
        if ctx is not None and ident is None:  # no query id from Spark (a foreachBatch job on Spark Connect)
            token = token_from_job_tags(ctx.getLocalProperty(JOB_TAGS_PROPERTY))
        tag = getattr(partition, "tag", None)
        layer = self.layer
        source = f"{self.opts.topology}/{self.opts.source}"
        for raw, sections in self.pages(partition):
            batch, emitted, bad = decode_batch(raw, self.schema, source, sections)
            if bad:
                layer.xor({}, fails=bad)
            if tag is not None:
                layer.record_batch_reads(tag, emitted, ident, token)
            if batch.num_rows:
                yield batch

    def settle(self, tag: str) -> None:
        """Spark committed the batch ``tag``: ack every record it emitted that is still pending."""
        self.layer.settle_batch(tag, "ack")
