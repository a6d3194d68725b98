"""The flush token of the running Spark task (``ftlayer.acker.flush_tokens`` defines the token).

A stage's or sink stage's flush is named by its query id, micro-batch id and partition, read
from the task's ``TaskContext`` (so this module is Spark's side, not the core's).
"""

from __future__ import annotations

from ftlayer.acker.flush_tokens import FlushToken, batch_key

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark on every task of a streaming query
NO_QUERY = "noquery"  # outside a streaming query (tests calling stages directly)


def task_token(stage: str) -> FlushToken:
    """The token of the running Spark task's flush for ``stage`` (query id, batch, partition)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    query = (ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx else None) or NO_QUERY
    batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
    part = ctx.partitionId() if ctx else -1
    return FlushToken(batch_key(query, str(batch)), f"{stage}/p{part}")
