"""The streaming query and micro-batch of one ``foreachBatch`` call, on classic and Spark Connect sessions.

The acking point (``runtime.dataframe.acking``) calls :func:`enter` before the user's function
and :meth:`BatchContext.close` after it. The context tells it which query runs the batch and
which sources' batch tags (``ftlayer.acker.batch_acks``) the batch's read tasks filed:

- **Classic session.** The function runs on the query's own thread, which carries Spark's query
  id (local property ``sql.streaming.queryId``); the read tasks its actions start carry the query
  and batch ids too, and list their tags under them (``dfq:<query>:<batch>``). Unchanged from
  before Spark Connect support.
- **Spark Connect.** The function runs in a Python process of the Connect server, on a session
  cloned for the query, and its actions run as Connect operations, outside the query's thread:
  their jobs carry no query id. So:

  - *the batch's tags*: :func:`enter` adds the job tag of a fresh batch token to the session
    for the length of the call (``runtime.spark.connect``); the read tasks list their tags
    under the token (``dfk:<token>``), where :meth:`BatchContext.tags` finds them. Exact for
    the actions the function runs on its calling thread (a session tag belongs to a thread): the
    records read by actions on other threads are still acked at Spark's commit, but a write
    given up on does not fail them; they time out and replay instead;
  - *the query id*: among the active queries of the session that started the query (its id
    travels with the pickled function, ``root``; looked up through the Connect server's local
    URL, ``SPARK_CONNECT_LOCAL_URL``, that Spark gives the worker), the one running a trigger
    whose last progress is batch ``b - 1`` or that has none yet. The calling query always
    qualifies; when another one does too, the id stays unknown (None), and the callers take the
    safe way: the plan counts as stateful, the commit listener gets no index for the batch (its
    records are acked at the query's next trigger, or when the query restarts on its checkpoint,
    else they time out and replay), the Delta sink merges without a txn id. Once found, the id
    is kept for the cloned session (one per query run).

:func:`current_query_id` gives a function that runs inside an acking point (the Delta sink) the
query id of the batch being run.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from ftlayer.acker.batch_acks import BATCH_KEY_TTL_S, batch_tags, token_tags
from ftlayer.config import FTConfig
from ftlayer.keyspace.keys import query_batch_key, token_batch_key
from ftlayer.logs import logger_for
from ftlayer.store.connection import client_for
from runtime.spark.connect import batch_job_tag, is_connect, new_batch_token
from runtime.spark.typed_source import QUERY_ID_PROPERTY

__all__ = ["BatchContext", "current_query_id", "enter", "root_session"]

log = logger_for(__name__)

LOCAL_URL_ENV = "SPARK_CONNECT_LOCAL_URL"  # set by the Connect server for its foreachBatch worker
_local = threading.local()
_lock = threading.Lock()
_queries: dict[str, str] = {}  # Spark Connect: cloned session id -> the query id found for it
_roots: dict[str, Any] = {}  # root session id -> a Connect session on it (never stopped: it is the user's)
_unknown: set[str] = set()  # cloned session ids already warned about


@dataclass
class BatchContext:
    """One ``foreachBatch`` call: its batch id, the query id (None: not known) and, on Spark
    Connect, the batch token its read tasks file under and the root session's handle."""

    batch_id: int
    query_id: str | None
    token: str | None = None
    session: Any = None  # Spark Connect: the session whose thread carries the token's job tag
    root: Any = None  # Spark Connect: the session that started the query (None: not reachable)

    @property
    def label(self) -> str:
        """The query id, or when it is not known the session cloned for the query run (Spark
        Connect): names the query in logs and as the owner of a sink breaker."""
        if self.query_id is not None:
            return self.query_id
        return f"spark-connect-session-{getattr(self.session, 'session_id', '?')}"

    def tags(self, config: FTConfig) -> list[tuple[str, str]]:
        """``(topology/source, tag)`` of every source the batch's read tasks filed ids for so far."""
        client = client_for(config.redis_url, config.connect_timeout_s)
        if self.token is not None:
            return token_tags(client, config.namespace, self.token)
        if self.query_id is None:
            return []
        return batch_tags(client, config.namespace, self.query_id, self.batch_id)

    def publish(self, config: FTConfig) -> None:
        """Spark Connect with a known query id: list the batch's tags under (query id, batch id)
        too, where the commit listener looks once Spark reports the batch committed. Call it after
        the function returned, before Spark commits. Classic: nothing to do (the read tasks did)."""
        if self.token is None or self.query_id is None:
            return
        tags = self.tags(config)
        if not tags:
            return
        client = client_for(config.redis_url, config.connect_timeout_s)
        key = query_batch_key(config.namespace, self.query_id, self.batch_id)
        pipe = client.pipeline(transaction=False)
        pipe.sadd(key, *[f"{name} {tag}" for name, tag in tags])
        pipe.pexpire(key, BATCH_KEY_TTL_S * 1000)
        pipe.execute()

    def close(self, config: FTConfig | None = None) -> None:
        """The call is over: drop the job tag and (with ``config``) the token's index."""
        if getattr(_local, "current", None) is self:
            _local.current = None
        if self.token is None:
            return
        try:
            self.session.removeTag(batch_job_tag(self.token))
        except Exception as exc:  # a session gone: its thread's tags went with it
            log.debug("could not remove the batch tag of batch %d: %s", self.batch_id, exc)
        if config is not None:
            try:
                client_for(config.redis_url, config.connect_timeout_s).delete(
                    token_batch_key(config.namespace, self.token))
            except Exception as exc:  # it expires on its own
                log.debug("could not delete the token index of batch %d: %s", self.batch_id, exc)


def enter(df: Any, batch_id: int, root: str | None = None) -> BatchContext:
    """The context of a ``foreachBatch`` call on ``df`` (see the module notes); ``root`` is the id
    of the Spark Connect session that started the query (None on a classic session)."""
    spark = df.sparkSession
    if not is_connect(spark):
        query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        ctx = BatchContext(batch_id, str(query_id) if query_id else None)
    else:
        token = new_batch_token()
        spark.addTag(batch_job_tag(token))
        root_spark = root_session(root)
        ctx = BatchContext(batch_id, _connect_query_id(spark, root_spark, batch_id), token, spark, root_spark)
    _local.current = ctx
    return ctx


def current_query_id(df: Any) -> str | None:
    """The query id of the batch an acking point runs on this thread; else, on a classic session,
    Spark's own (the query's thread); else None."""
    ctx: BatchContext | None = getattr(_local, "current", None)
    if ctx is not None:
        return ctx.query_id
    spark = df.sparkSession
    if is_connect(spark):
        return None
    query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    return str(query_id) if query_id else None


def root_session(root: str | None) -> Any:
    """A Spark Connect session on the server-side session ``root``, reached through the local URL
    the Connect server gives its ``foreachBatch`` worker; None outside such a worker or without
    ``root``. Cached per process, and never stopped: stopping would end the user's session."""
    url = os.environ.get(LOCAL_URL_ENV)
    if not root or not url:
        return None
    with _lock:
        found = _roots.get(root)
        if found is None:
            from pyspark.sql.connect.session import SparkSession as ConnectSession

            # create() leaves the worker's active and default sessions (the cloned one) as they are
            found = _roots[root] = ConnectSession.builder.remote(f"{url};session_id={root}").create()
        return found


def _connect_query_id(spark: Any, root: Any, batch_id: int) -> str | None:
    """The query of the cloned session ``spark`` running ``batch_id`` (module notes), or None."""
    cloned = str(spark.session_id)
    with _lock:
        known = _queries.get(cloned)
    if known is not None or root is None:
        return known
    try:
        found = [str(q.id) for q in root.streams.active if _may_run(q, batch_id)]
    except Exception as exc:  # the root session cannot be asked: unknown, the safe answer
        log.warning("could not list the streaming queries of the Spark Connect session: %s", exc)
        return None
    if len(found) == 1:
        with _lock:
            _queries[cloned] = found[0]
        return found[0]
    if cloned not in _unknown:
        _unknown.add(cloned)
        log.warning("batch %d: %d active queries of the Spark Connect session could be running it; ftlayer "
                    "goes on without the query id (module notes of runtime.dataframe.batch_context)",
                    batch_id, len(found))
    return None


def _may_run(query: Any, batch_id: int) -> bool:
    """Could ``query`` be running ``batch_id`` now: a trigger is active and its last progress (if
    any in this run) is the batch before."""
    status = query.status
    active = status.get("isTriggerActive") if isinstance(status, dict) else getattr(status, "isTriggerActive", None)
    if not active:
        return False
    progress = query.lastProgress
    if progress is None:
        return True
    last = progress.get("batchId") if isinstance(progress, dict) else getattr(progress, "batchId", None)
    return last is None or int(last) == batch_id - 1
