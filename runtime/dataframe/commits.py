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
and replay as usual, or are read again when the query is restarted on its checkpoint).

One listener per SparkSession (:func:`attach`), serving every ftlayer namespace opened in the
process (:meth:`CommitListener.watch`). Errors are logged, never raised into Spark's listener bus.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pyspark.sql.streaming.listener import QueryProgressEvent, QueryStartedEvent, QueryTerminatedEvent

from ftlayer.batch_acks import batch_tags
from ftlayer.config import FTConfig
from ftlayer.connection import client_for
from ftlayer.layer import FTLayer
from runtime.dataframe.acking import settle_batch
from runtime.dataframe.plan import find_query, logical_guess, remember_stateful
from runtime.driver.json_listener import JsonEventListener

__all__ = ["CommitListener", "attach"]

log = logging.getLogger(__name__)
_ATTR = "_ftlayer_commit_listener"
_lock = threading.Lock()


class CommitListener(JsonEventListener):
    """Acks committed batches of every streaming query of one session (see the module contract)."""

    def __init__(self) -> None:
        self.configs: dict[tuple[str, str], FTConfig] = {}
        self._last: dict[str, int] = {}  # query id -> last batch reported committed (-1: started)
        self._flagged: set[str] = set()
        self.settled = 0
        self.spark: Any = None
        self._lock = threading.Lock()

    def watch(self, config: FTConfig) -> None:
        """Also settle batches of sources in ``config``'s server and namespace."""
        with self._lock:
            self.configs[(config.redis_url, config.namespace)] = config

    def _watched(self) -> list[FTConfig]:
        with self._lock:
            return list(self.configs.values())

    def committed(self, query_id: str, batch_id: int, stateful: bool | None = None) -> int:
        """Settle batch ``batch_id`` of ``query_id`` (committed) in every watched namespace."""
        total = 0
        for cfg in self._watched():
            try:
                total += settle_batch(cfg, query_id, batch_id, "ack")
                if stateful is not None and query_id not in self._flagged:
                    remember_stateful(cfg, query_id, stateful)
            except Exception as exc:  # the FT source settles it at its next latestOffset, or it replays
                log.warning("could not ack batch %d of query %s in %s: %s", batch_id, query_id, cfg.namespace, exc)
        if stateful is not None:
            self._flagged.add(query_id)
        with self._lock:
            self.settled += total
        return total

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        query_id = str(event.id)
        with self._lock:
            self._last.setdefault(query_id, -1)
        # before its first progress report, the acking writer goes by the plan's operators
        guess = logical_guess(find_query(self.spark, query_id)) if self.spark is not None else None
        if guess is not None:
            for cfg in self._watched():
                try:
                    remember_stateful(cfg, query_id, guess)
                except Exception as exc:
                    log.debug("could not note whether query %s keeps state: %s", query_id, exc)

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        query_id, batch_id = str(progress.id), int(progress.batchId)
        with self._lock:
            self._last[query_id] = max(batch_id, self._last.get(query_id, -1))
        self.committed(query_id, batch_id, bool(progress.stateOperators))

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        query_id = str(event.id)
        with self._lock:
            last = self._last.pop(query_id, None)
        if last is None:
            return  # not seen starting: its holds lapse on their own
        for cfg in self._watched():
            try:
                client = client_for(cfg.redis_url, cfg.connect_timeout_s)
                for name, tag in batch_tags(client, cfg.namespace, query_id, last + 1):
                    topology, _, source = name.partition("/")
                    FTLayer(cfg, topology, source).end_hold(tag)
            except Exception as exc:
                log.warning("could not end the holds of query %s: %s (they lapse on their own)", query_id, exc)


def attach(spark: Any, config: FTConfig) -> CommitListener:
    """The session's commit listener (registered on first use), now also watching ``config``."""
    with _lock:
        listener: CommitListener | None = getattr(spark, _ATTR, None)
        if listener is None:
            listener = CommitListener()
            listener.spark = spark
            spark.streams.addListener(listener)
            setattr(spark, _ATTR, listener)
    listener.watch(config)
    return listener
