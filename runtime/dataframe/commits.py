"""The commit listener of the DataFrame path: settle each micro-batch once Spark has committed it.

Spark posts a query's progress event for batch ``b`` only after ``b``'s commit log entry is
written, so the event is a safe moment to ack: every record the batch's read tasks emitted and
that is still pending is acked (:func:`runtime.dataframe.acking.settle_batch`) and the batch's
holds end. The FT source does the same from Spark's next ``latestOffset`` call (usually first,
``runtime.spark.ft_source``); the listener covers the last batch of a query that stops or of a
finite trigger, after which Spark plans nothing more. Settling is idempotent, so both may run.

It also tells the acking writer whether the query keeps state (``stateOperators`` of the
progress, :func:`runtime.dataframe.plan.remember_stateful`), and when a query terminates it ends
the holds of the batch it was running, if any (that batch did not commit: its records time out
and replay as usual, or are read again when the query is restarted on its checkpoint), and
drops that flag. Only queries whose progress shows an FT source's offsets (channel streams) cost
any Redis call: the others (FT-off queries, other sources) are recognised from the event alone.

One listener per SparkSession (:func:`attach`), serving every ftlayer namespace opened in the
process (:meth:`CommitListener.watch`). Errors are logged, never raised into Spark's listener bus.
"""

from __future__ import annotations

import threading
from typing import Any

from pyspark.sql.streaming.listener import QueryProgressEvent, QueryStartedEvent, QueryTerminatedEvent

from ftlayer.acker.batch_acks import batch_tags
from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.keyspace.keys import query_batch_key
from ftlayer.logs import logger_for
from ftlayer.store.connection import client_for
from runtime.dataframe.acking import settle_batch
from runtime.dataframe.observe import reads_ftlayer
from runtime.dataframe.plan import WRITER_MARK, forget_stateful, remember_stateful
from runtime.driver.json_listener import JsonEventListener
from runtime.driver.listener_removal import remove_listener

__all__ = ["CommitListener", "attach", "detach_if_idle", "listener_of"]

log = logger_for(__name__)
_ATTR = "_ftlayer_commit_listener"
_lock = threading.Lock()


class CommitListener(JsonEventListener):
    """Acks committed batches of every streaming query of one session (see the module contract)."""

    def __init__(self) -> None:
        self.configs: dict[tuple[str, str], FTConfig] = {}
        self._users: dict[tuple[str, str], int] = {}
        self._last: dict[str, int] = {}  # query id -> last batch reported committed (-1: started)
        self._flagged: set[str] = set()
        self._ours: set[str] = set()  # queries seen reading an FT source
        self.settled = 0
        self._lock = threading.Lock()

    def watch(self, config: FTConfig) -> None:
        """Also settle batches of sources in ``config``'s server and namespace (one more user of it)."""
        key = (config.redis_url, config.namespace)
        with self._lock:
            self.configs[key] = config
            self._users[key] = self._users.get(key, 0) + 1

    def unwatch(self, config: FTConfig) -> None:
        """One user of ``config`` (a source handle) stopped; the last one stops the watching."""
        key = (config.redis_url, config.namespace)
        with self._lock:
            left = self._users.get(key, 0) - 1
            if left > 0:
                self._users[key] = left
            else:
                self._users.pop(key, None)
                self.configs.pop(key, None)

    def _watched(self) -> list[FTConfig]:
        with self._lock:
            return list(self.configs.values())

    def committed(self, query_id: str, batch_id: int, stateful: bool | None = None) -> int:
        """Settle batch ``batch_id`` of ``query_id`` (committed) in every watched namespace."""
        total = 0
        for cfg in self._watched():
            try:
                client = client_for(cfg.redis_url, cfg.connect_timeout_s)
                writer = bool(client.sismember(query_batch_key(cfg.namespace, query_id, batch_id), WRITER_MARK))
                total += settle_batch(cfg, query_id, batch_id, "ack")
                if stateful is not None and writer and query_id not in self._flagged:
                    remember_stateful(cfg, query_id, stateful)  # for the acking writer's commit
                    self._flagged.add(query_id)
            except Exception as exc:  # the FT source settles it at its next latestOffset, or it replays
                log.warning("could not ack batch %d of query %s in %s: %s", batch_id, query_id, cfg.namespace, exc)
        with self._lock:
            self.settled += total
        return total

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        with self._lock:
            self._last.setdefault(str(event.id), -1)

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        if not reads_ftlayer(progress):
            return  # not a query over an FT source: no Redis traffic for it
        query_id, batch_id = str(progress.id), int(progress.batchId)
        with self._lock:
            self._last[query_id] = max(batch_id, self._last.get(query_id, -1))
            self._ours.add(query_id)
        self.committed(query_id, batch_id, bool(progress.stateOperators))

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        query_id = str(event.id)
        with self._lock:
            last = self._last.pop(query_id, None)
            ours = query_id in self._ours
            self._ours.discard(query_id)
        if last is None or not ours:
            return  # not an ftlayer query seen at work: anything it left lapses on its own
        flagged = query_id in self._flagged
        for cfg in self._watched():
            try:
                client = client_for(cfg.redis_url, cfg.connect_timeout_s)
                for name, tag in batch_tags(client, cfg.namespace, query_id, last + 1):
                    topology, _, source = name.partition("/")
                    FTLayer(cfg, topology, source).end_hold(tag)
                if flagged:
                    forget_stateful(cfg, query_id)
            except Exception as exc:
                log.warning("could not end the holds of query %s: %s (they lapse on their own)", query_id, exc)
        self._flagged.discard(query_id)


def attach(spark: Any, config: FTConfig) -> CommitListener:
    """The session's commit listener (registered on first use), now also watching ``config``."""
    with _lock:
        listener: CommitListener | None = getattr(spark, _ATTR, None)
        if listener is None:
            listener = CommitListener()
            spark.streams.addListener(listener)
            setattr(spark, _ATTR, listener)
    listener.watch(config)
    return listener


def listener_of(spark: Any) -> CommitListener | None:
    """The session's commit listener, if one was attached."""
    found: CommitListener | None = getattr(spark, _ATTR, None)
    return found


def detach_if_idle(spark: Any) -> None:
    """Unregister the session's commit listener once it watches no namespace (every handle stopped)."""
    with _lock:
        listener: CommitListener | None = getattr(spark, _ATTR, None)
        if listener is None or listener.configs:
            return
        setattr(spark, _ATTR, None)
    remove_listener(spark, listener)
