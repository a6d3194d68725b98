"""Acking points of the DataFrame path: settle a micro-batch's source records after its write.

``writeStream.foreachBatch(acking(fn))``: ``fn(df, batch_id)`` gets the
micro-batch as a DataFrame and may use any writer. Then, for every ftlayer
source the batch read (the ``dfq`` set the read tasks filled):

- ``fn`` returned: every record the batch's read tasks emitted that is still
  pending is acked (by default on a driver thread, overlapping the next batch:
  :mod:`runtime.dataframe.settler`) (:meth:`ftlayer.batch_acks.BatchAcks.settle`), including
  records whose rows were all filtered out, and records folded into
  aggregation state (Spark checkpoints that state with the batch). Records
  failed earlier by a row function or by the decoder are no longer pending
  and are not acked;
- ``fn`` raised: the batch acks nothing; every record it emitted that is
  still pending fails (replayed under a new id with backoff, then
  dead-lettered after ``max_replays``). With ``on_error="replay"`` (the
  default) the exception is logged and the query goes on: Spark commits the
  batch, and ftlayer replays only its records. With ``on_error="raise"`` the
  records are failed the same way and the exception is re-raised, which stops
  the query (Spark's own behaviour).

A Redis error while settling is logged, never raised: unsettled records stay
pending, time out and are replayed (at-least-once holds; the cost is a
duplicate write). The acking point runs in the driver's Python process, where
Spark's local property ``sql.streaming.queryId`` names the query.

Rows of a record that a row function failed in this batch can still reach
``fn`` (with null in that function's column): the record is replayed anyway,
so a sink sees it again (at-least-once); filter on the column if needed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ftlayer.batch_acks import query_sources
from ftlayer.config import FTConfig
from ftlayer.connection import client_for
from ftlayer.errors import ConfigError, FTLayerError
from ftlayer.layer import FTLayer
from runtime.dataframe.settler import settler
from runtime.dataframe.sources import config_or_last
from runtime.spark.typed_source import QUERY_ID_PROPERTY

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["acking", "settle_batch"]

log = logging.getLogger(__name__)

BatchFn = Callable[["DataFrame", int], Any]


def settle_batch(config: FTConfig, query_id: str, batch_id: int, mode: Literal["ack", "fail"],
                 reason: str = "") -> int:
    """Ack or fail the still-pending records of one batch of one query, over every source it read."""
    client = client_for(config.redis_url, config.connect_timeout_s)
    total = 0
    for name in query_sources(client, config.namespace, query_id):
        topology, _, source = name.partition("/")
        total += FTLayer(config, topology, source).settle_batch(query_id, batch_id, mode, reason)
    return total


def _settle_logged(config: FTConfig, query_id: str, batch_id: int, mode: Literal["ack", "fail"],
                   reason: str = "") -> None:
    try:
        settle_batch(config, query_id, batch_id, mode, reason)
    except FTLayerError:
        log.exception("could not %s batch %d of query %s; its records will time out and replay",
                      mode, batch_id, query_id)


def acking(fn: BatchFn, *, config: FTConfig | None = None, on_error: Literal["replay", "raise"] = "replay",
           background: bool = True) -> Callable[[DataFrame, int], None]:
    """Wrap a ``foreachBatch`` function so that each batch's records are acked after it returns.

    ``background`` (default): the ack runs on a driver thread while Spark goes on with the next
    batch (:mod:`runtime.dataframe.settler`); False acks before returning to Spark. Failing a
    batch's records (``fn`` raised) is always done before returning.
    """
    if on_error not in ("replay", "raise"):
        msg = f"acking(on_error={on_error!r}): expected 'replay' or 'raise'"
        raise ConfigError(msg)

    def run(df: DataFrame, batch_id: int) -> None:
        cfg = config_or_last(config)
        query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            msg = "ftlayer.acking must wrap a writeStream.foreachBatch function (no streaming query id)"
            raise ConfigError(msg)
        try:
            fn(df, batch_id)
        except Exception as exc:
            reason = f"batch {batch_id} write failed: {type(exc).__name__}: {exc}"[:1000]
            _settle_logged(cfg, query_id, batch_id, "fail", reason)
            if on_error == "raise":
                raise
            log.exception("foreachBatch function failed on batch %d; its records are replayed", batch_id)
            return
        if background:
            settler().submit(lambda: _settle_logged(cfg, query_id, batch_id, "ack"))
        else:
            _settle_logged(cfg, query_id, batch_id, "ack")

    return run
