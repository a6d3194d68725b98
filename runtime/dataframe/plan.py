"""Does a streaming query keep state? What a failed write may do depends on it.

A batch whose write failed can be handled in two ways. Failing the batch's records (they are
replayed in later batches) and letting Spark commit the batch keeps the query running, and is
right for a **stateless** plan: the records' rows were not written, and they will be. For a
**stateful** plan (aggregations, ``dropDuplicates``, stream-stream joins, ``*GroupsWithState``,
``transformWithState``) Spark commits the batch's state with it, so a replayed record would be
folded in twice (counted twice, or dropped as a duplicate of itself). There the batch must not
commit: the acking point raises, the query stops, and a restart re-runs the batch from Spark's
offset log, reading the same still-pending records.

:func:`is_stateful` answers from the running query: its last progress report lists its state
operators; before the first report, the physical plan of the batch being run is looked at
(classic PySpark: through the JVM). When neither can be read (Spark Connect before the query's
first progress report, or a query it cannot tell, ``runtime.dataframe.batch_context``), the
answer is True, the safe one. Answers are cached per query id (a query's plan does not change).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.logs import logger_for
from ftlayer.store.connection import client_for

__all__ = [
    "STATEFUL_NODES", "WRITER_MARK", "find_query", "forget_stateful", "is_stateful", "mark_writer",
    "plan_is_stateful", "recall_stateful", "remember_stateful",
]

log = logger_for(__name__)

#: Physical operators that write to Spark's state store.
STATEFUL_NODES = re.compile(
    r"StateStoreSave|StateStoreRestore|StreamingDeduplicate|SymmetricHashJoin|GroupsWithState"
    r"|TransformWithState|SessionWindowStateStore|StreamingGlobalLimit"
)
_cache: dict[str, bool] = {}
_lock = threading.Lock()


def plan_is_stateful(plan_text: str) -> bool:
    """True if a physical plan's text names an operator that keeps state."""
    return STATEFUL_NODES.search(plan_text) is not None


def _from_jvm(query: Any) -> bool | None:
    jsq = getattr(query, "_jsq", None)
    if jsq is None:
        return None
    try:
        execution = jsq.streamingQuery().lastExecution()
        if execution is None:
            return None
        return plan_is_stateful(str(execution.executedPlan().toString()))
    except Exception as exc:  # a plan that cannot be read is not an answer
        log.debug("could not read the plan of query %s: %s", getattr(query, "id", "?"), exc)
        return None


def find_query(spark: Any, query_id: str, also: Any = None) -> Any:
    """The StreamingQuery ``query_id``: foreachBatch hands out a clone of the session, whose query
    manager does not know the query, so the active and the default sessions are asked too, and
    ``also`` (on Spark Connect: the session that started the query, ``runtime.dataframe.batch_context``)."""
    candidates = [spark, *([also] if also is not None else [])]
    try:
        from pyspark.sql import SparkSession

        candidates += [SparkSession.getActiveSession(), getattr(SparkSession, "_instantiatedSession", None)]
    except ImportError:
        pass
    for session in candidates:
        if session is None:
            continue
        try:
            query = session.streams.get(query_id)
        except Exception:
            continue
        if query is not None:
            return query
    return None


def is_stateful(spark: Any, query_id: str, also: Any = None) -> bool:
    """True if the streaming query ``query_id`` of ``spark`` (or of session ``also``) keeps state
    (see the module notes)."""
    with _lock:
        known = _cache.get(query_id)
    if known is not None:
        return known
    answer: bool | None = None
    query = find_query(spark, query_id, also)
    if query is not None:
        progress = query.lastProgress
        if progress is not None:
            answer = bool(progress.get("stateOperators") if isinstance(progress, dict)
                          else getattr(progress, "stateOperators", None))
        if answer is None:
            answer = _from_jvm(query)
    if answer is None:
        return True  # unknown: the safe answer, not cached
    with _lock:
        _cache[query_id] = answer
    return answer


def _flag_key(namespace: str, query_id: str) -> str:
    return f"{namespace}:dfs:{query_id}"


FLAG_TTL_S = 7 * 24 * 3600


def remember_stateful(config: FTConfig, query_id: str, stateful: bool) -> None:
    """Tell the acking writer's ``commit`` (another process) whether the query keeps state."""
    client = client_for(config.redis_url, config.connect_timeout_s)
    client.set(_flag_key(config.namespace, query_id), "1" if stateful else "0", ex=FLAG_TTL_S)


WRITER_MARK = "@writer"  # in a batch's index (dfq:<q>:<b>): the query writes with the acking writer


def mark_writer(config: FTConfig, query_id: str, batch_id: int) -> None:
    """The acking writer's ``commit`` notes that ``query_id`` writes with it, so the commit listener
    tells it whether the query keeps state (queries that do not use it get no such key)."""
    from ftlayer.keyspace.keys import query_batch_key

    client = client_for(config.redis_url, config.connect_timeout_s)
    key = query_batch_key(config.namespace, query_id, batch_id)
    pipe = client.pipeline(transaction=False)
    pipe.sadd(key, WRITER_MARK)
    pipe.expire(key, FLAG_TTL_S)
    pipe.execute()


def forget_stateful(config: FTConfig, query_id: str) -> None:
    """The query ended: drop what :func:`remember_stateful` stored (no key left behind)."""
    client_for(config.redis_url, config.connect_timeout_s).delete(_flag_key(config.namespace, query_id))


def recall_stateful(config: FTConfig, query_id: str) -> bool | None:
    """What :func:`remember_stateful` stored for the query; None if nothing yet."""
    client = client_for(config.redis_url, config.connect_timeout_s)
    raw = client.get(_flag_key(config.namespace, query_id))
    return None if raw is None else raw in (b"1", "1")
