"""The foreachBatch acking point of the DataFrame path: ``writeStream.foreachBatch(acking(fn))``.

``fn(df, batch_id)`` gets the micro-batch as a DataFrame and may use any writer. What
``acking`` adds:

- **Acks at Spark's commit, not here.** When ``fn`` returns, nothing is acked yet: Spark then
  writes the batch's commit log entry, and only after that the FT source acks every record the
  batch's read tasks emitted that is still pending (``runtime.spark.typed_source``; the commit
  listener, ``runtime.dataframe.commits``, does the same from the driver). A batch that fails
  after ``fn`` returned (a driver crash, a checkpoint store error) is re-run by Spark on
  restart and reads its records again, so stateful plans lose nothing.
- **A failed write is retried in place** (``runtime.dataframe.sink_retry``): with backoff, for
  up to ``sink_retry_budget_s``, on the same batch. Meanwhile the batch's records do not time
  out (it holds them, ``ftlayer.holds``), the query reads nothing new and the sources' sink
  breaker keeps replays paused (``ftlayer.breaker``): a sink outage costs no replay budget.
- **When the retries are spent**, ``on_error`` decides:

  - ``"auto"`` (default): ``"raise"`` for a stateful plan, ``"replay"`` for a stateless one
    (``runtime.dataframe.plan``; ``stateful=`` overrides the detection);
  - ``"replay"``: every record the batch emitted that is still pending fails (replayed under a
    new id with backoff, then dead-lettered after ``max_replays``), the error is logged and
    Spark commits the batch: the query goes on. Safe only for stateless plans, where a replay
    is written again and counted once;
  - ``"raise"``: the error is re-raised, Spark does not commit the batch and the query stops
    (Spark's own behaviour). Nothing is acked or failed: restarted on its checkpoint, the
    query re-runs the batch on its still-pending records, so state counts each record once.

Rows of a record that a row function failed in this batch can still reach ``fn`` (with null in
that function's column) when the function is used as a column: the record is replayed anyway, so a
sink sees it again (at-least-once). ``ftlayer.udf(...).with_column(df, name, *cols)`` drops such rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ftlayer.batch_acks import batch_tags
from ftlayer.config import FTConfig
from ftlayer.connection import client_for
from ftlayer.errors import ConfigError
from ftlayer.holds import CARRY_PREFIX
from ftlayer.keys import query_batch_key
from ftlayer.layer import FTLayer
from runtime.dataframe.plan import is_stateful
from runtime.dataframe.sink_retry import SinkRetry
from runtime.dataframe.sources import config_or_last
from runtime.spark.typed_source import QUERY_ID_PROPERTY

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["OnError", "acking", "batch_sources", "settle_batch"]

log = logging.getLogger(__name__)

BatchFn = Callable[["DataFrame", int], Any]
OnError = Literal["auto", "replay", "raise"]


def batch_sources(config: FTConfig, query_id: str, batch_id: int) -> list[str]:
    """``topology/source`` of every source the micro-batch's read tasks read (so far)."""
    client = client_for(config.redis_url, config.connect_timeout_s)
    return sorted({name for name, _ in batch_tags(client, config.namespace, query_id, batch_id)})


def settle_batch(config: FTConfig, query_id: str, batch_id: int, mode: Literal["ack", "fail"],
                 reason: str = "") -> int:
    """Ack or fail the still-pending records of one batch of one query, over every source it read.

    Acking ends the batch's holds too (it is done), and the carry holds of the batches before
    it. Idempotent; returns the records settled.
    """
    client = client_for(config.redis_url, config.connect_timeout_s)
    total = 0
    tags = batch_tags(client, config.namespace, query_id, batch_id)
    for name, tag in tags:
        topology, _, source = name.partition("/")
        layer = FTLayer(config, topology, source, outage_budget_s=config.outage_budget_s)
        total += layer.settle_batch(tag, mode, reason)
        if mode == "ack":
            layer.end_hold(tag)
            # the carries of earlier batches (runtime.spark.batch_holds) are needless now; the
            # reader ends them at its next latestOffset, which a query that stops never makes
            layer.end_carries(keep=f"{CARRY_PREFIX}{tag}")
    if mode == "ack":  # the batch is done: its index goes too (no leak after a drain)
        client.delete(query_batch_key(config.namespace, query_id, batch_id))
    return total


def acking(fn: BatchFn, *, config: FTConfig | None = None, on_error: OnError = "auto",
           stateful: bool | None = None) -> Callable[[DataFrame, int], None]:
    """Wrap a ``foreachBatch`` function: retried in place when it fails, acked at Spark's commit.

    See the module notes for ``on_error`` and ``stateful`` (None: detected from the query).
    """
    if on_error not in ("auto", "replay", "raise"):
        msg = f"acking(on_error={on_error!r}): expected 'auto', 'replay' or 'raise'"
        raise ConfigError(msg)

    def run(df: DataFrame, batch_id: int) -> None:
        cfg = config_or_last(config)
        query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            msg = "ftlayer.acking must wrap a writeStream.foreachBatch function (no streaming query id)"
            raise ConfigError(msg)
        retry = SinkRetry(cfg, query_id, lambda: batch_sources(cfg, query_id, batch_id),
                          what=f"batch {batch_id} of query {query_id}")
        error = retry.run(lambda: fn(df, batch_id))
        if error is None:
            return
        mode = on_error
        if mode == "auto":
            keeps_state = stateful if stateful is not None else is_stateful(df.sparkSession, query_id)
            mode = "raise" if keeps_state else "replay"
        if mode == "raise":
            log.error("foreachBatch function failed on batch %d of query %s; the query stops without "
                      "committing the batch (restart it on its checkpoint to re-run it)", batch_id, query_id)
            raise error
        reason = f"batch {batch_id} write failed: {type(error).__name__}: {error}"[:1000]
        failed = settle_batch(cfg, query_id, batch_id, "fail", reason)
        log.error("foreachBatch function failed on batch %d of query %s after %d attempts; its %d records are "
                  "replayed", batch_id, query_id, retry.attempts, failed, exc_info=error)

    return run
