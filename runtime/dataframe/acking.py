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
  out (it holds them, ``ftlayer.acker.holds``), the query reads nothing new and the sources' sink
  breaker keeps replays paused (``ftlayer.acker.breaker``): a sink outage costs no replay budget.
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

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from ftlayer.acker.batch_acks import batch_tags
from ftlayer.acker.holds import CARRY_PREFIX
from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.keyspace.keys import query_batch_key
from ftlayer.logs import logger_for
from ftlayer.store.connection import client_for
from runtime.dataframe.plan import is_stateful
from runtime.dataframe.session_state import active_session, config_or_last
from runtime.dataframe.sink_retry import SinkRetry
from runtime.spark.connect import session_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["OnError", "acking", "batch_sources", "settle_batch", "settle_tags"]

log = logger_for(__name__)

BatchFn = Callable[["DataFrame", int], Any]
OnError = Literal["auto", "replay", "raise"]


def batch_sources(config: FTConfig, query_id: str, batch_id: int) -> list[str]:
    """``topology/source`` of every source the micro-batch's read tasks read (so far)."""
    client = client_for(config.redis_url, config.connect_timeout_s)
    return sorted({name for name, _ in batch_tags(client, config.namespace, query_id, batch_id)})


def settle_tags(config: FTConfig, tags: Sequence[tuple[str, str]], mode: Literal["ack", "fail"],
                reason: str = "") -> int:
    """Ack or fail the still-pending records of the batch tags ``(topology/source, tag)``; acking
    ends their holds too, and the carry holds of the batches before them. Idempotent; returns the
    records settled."""
    total = 0
    for name, tag in tags:
        topology, _, source = name.partition("/")
        layer = FTLayer(config, topology, source, outage_budget_s=config.outage_budget_s)
        total += layer.settle_batch(tag, mode, reason)
        if mode == "ack":
            layer.end_hold(tag)
            # the carries of earlier batches (runtime.spark.batch_holds) are needless now; the
            # reader ends them at its next latestOffset, which a query that stops never makes
            layer.end_carries(keep=f"{CARRY_PREFIX}{tag}")
    return total


def settle_batch(config: FTConfig, query_id: str, batch_id: int, mode: Literal["ack", "fail"],
                 reason: str = "") -> int:
    """Ack or fail the still-pending records of one batch of one query, over every source it read.

    Acking ends the batch's holds too (it is done), and the carry holds of the batches before
    it. Idempotent; returns the records settled.
    """
    client = client_for(config.redis_url, config.connect_timeout_s)
    total = settle_tags(config, batch_tags(client, config.namespace, query_id, batch_id), mode, reason)
    if mode == "ack":  # the batch is done: its index goes too (no leak after a drain)
        client.delete(query_batch_key(config.namespace, query_id, batch_id))
    return total


class AckingFn:
    """What :func:`acking` returns: the ``foreachBatch`` function (see the module notes).

    A class so that it can take along what it needs when Spark Connect pickles it to the server
    (``__getstate__``, in the user's process): the config with its Redis URL resolved (the
    server's Python worker opened no source) and the id of the session that starts the query
    (``runtime.dataframe.batch_context``). On a classic session it is never pickled.
    """

    def __init__(self, fn: BatchFn, config: FTConfig | None, on_error: OnError, stateful: bool | None) -> None:
        if on_error not in ("auto", "replay", "raise"):
            msg = f"acking(on_error={on_error!r}): expected 'auto', 'replay' or 'raise'"
            raise ConfigError(msg)
        self.fn, self.config, self.on_error, self.stateful = fn, config, on_error, stateful
        self.root: str | None = None  # Spark Connect: the session that starts the query

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["config"] = config_or_last(self.config)
        state["root"] = self.root or session_id(active_session())
        return state

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        from runtime.dataframe.batch_context import enter

        cfg = config_or_last(self.config)
        ctx = enter(df, batch_id, self.root)
        try:
            if ctx.query_id is None and ctx.token is None:
                msg = "ftlayer.acking must wrap a writeStream.foreachBatch function (no streaming query id)"
                raise ConfigError(msg)
            retry = SinkRetry(cfg, ctx.label, lambda: sorted({name for name, _ in ctx.tags(cfg)}),
                              what=f"batch {batch_id} of query {ctx.label}")
            error = retry.run(lambda: self.fn(df, batch_id))
            if error is None:
                ctx.publish(cfg)
                return
            mode = self.on_error
            if mode == "auto":
                keeps_state = self.stateful
                if keeps_state is None:
                    keeps_state = ctx.query_id is None or is_stateful(df.sparkSession, ctx.query_id, also=ctx.root)
                mode = "raise" if keeps_state else "replay"
            if mode == "raise":
                log.error("foreachBatch function failed on batch %d of query %s; the query stops without "
                          "committing the batch (restart it on its checkpoint to re-run it)", batch_id, ctx.label)
                raise error
            reason = f"batch {batch_id} write failed: {type(error).__name__}: {error}"[:1000]
            failed = settle_tags(cfg, ctx.tags(cfg), "fail", reason)
            log.error("foreachBatch function failed on batch %d of query %s after %d attempts; its %d records are "
                      "replayed", batch_id, ctx.label, retry.attempts, failed, exc_info=error)
        finally:
            ctx.close(cfg)


def acking(fn: BatchFn, *, config: FTConfig | None = None, on_error: OnError = "auto",
           stateful: bool | None = None) -> AckingFn:
    """Wrap a ``foreachBatch`` function: retried in place when it fails, acked at Spark's commit.

    See the module notes for ``on_error`` and ``stateful`` (None: detected from the query).
    """
    return AckingFn(fn, config, on_error, stateful)
