"""Deletes the flush tokens of committed micro-batches (the tokens: ``ftlayer.acker.flush_tokens``).

A StreamingQueryListener limited to one query name. Contract:

- On the progress event of batch ``b`` every batch before ``b`` has committed
  (Spark plans batch ``b`` only once batch ``b - 1`` is in the commit log), so
  their token hashes are deleted, each batch once (one ``DEL`` per batch and
  source). The first clean-up of a query id also looks for earlier batches that
  a driver which died left behind (one ``SCAN`` per source, once per run).
- :meth:`close` runs after the query stopped: it deletes the tokens of every
  batch in the checkpoint's commit log (a local checkpoint; others keep their
  last batch's tokens until the TTL), then detaches the listener.
- A batch that has not committed keeps its tokens: after a restart it may be
  re-run under the same tokens. Deleting one too early could only make a
  record time out and replay (a delta applied twice cancels), never lose it.
- Errors are logged, never raised into Spark's listener bus.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from pyspark.sql.streaming.listener import (
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from ftlayer.acker.flush_tokens import delete_batch_tokens, stale_batches
from ftlayer.errors import FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.logs import logger_for
from ftlayer.store.source_store import SourceStore
from runtime.driver.json_listener import JsonEventListener

log = logger_for(__name__)


def last_committed_batch(checkpoint: str) -> int | None:
    """The newest batch id in a local checkpoint's commit log; None if none or not local."""
    path = checkpoint[len("file:"):] if checkpoint.startswith("file:") else checkpoint
    commits = Path(path, "commits")
    if "://" in path or not commits.is_dir():
        return None
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()]
    return max(ids) if ids else None


class TokenJanitor(JsonEventListener):
    """Deletes the token hashes of one query's committed batches (see the module contract)."""

    def __init__(self, stores: Sequence[FTLayer | SourceStore], *, query_name: str, checkpoint: str) -> None:
        # every shard keeps its own token hashes (a token lives in the slot of the records it guards)
        self.stores = [st for s in stores for st in ([sh.store for sh in s.shards] if isinstance(s, FTLayer) else [s])]
        self.query_name = query_name
        self.checkpoint = checkpoint
        self.query_id: str | None = None  # set by the topology once the query started
        self.deleted = 0
        self.closed = False
        self._spark: Any = None
        self._cleaned: dict[str, int] = {}  # query id -> newest batch whose tokens are gone
        self._lock = threading.Lock()

    @classmethod
    def attach(cls, spark: Any, stores: Sequence[FTLayer | SourceStore], *, query_name: str,
               checkpoint: str) -> TokenJanitor:
        """Register a janitor on ``spark``'s streams (before the query starts) and return it."""
        janitor = cls(stores, query_name=query_name, checkpoint=checkpoint)
        spark.streams.addListener(janitor)
        janitor._spark = spark
        return janitor

    def committed(self, query_id: str, upto: int) -> int:
        """Delete the tokens of ``query_id``'s batches up to ``upto`` (all committed); returns keys deleted."""
        with self._lock:
            done = self._cleaned.get(query_id)
            if upto < 0 or (done is not None and upto <= done):
                return 0
            if done is None:  # first clean-up of this run: what did an earlier driver leave?
                ids: Sequence[int] = sorted({b for s in self.stores for b in stale_batches(s, query_id, upto)})
            else:
                ids = range(done + 1, upto + 1)
            n = delete_batch_tokens(self.stores, query_id, ids)
            self._cleaned[query_id] = upto
            self.deleted += n
            return n

    def _safely(self, query_id: str, upto: int) -> None:
        try:
            self.committed(query_id, upto)
        except (FTLayerError, redis.RedisError) as exc:  # a token left behind only expires later
            log.warning("could not delete the flush tokens of query %s up to batch %d: %s", query_id, upto, exc)

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        return None

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        if not self.closed and progress.name == self.query_name:
            self._safely(str(progress.id), int(progress.batchId) - 1)

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        return None

    def close(self) -> None:
        """After the query stopped: delete what the commit log holds, detach. Idempotent."""
        if self.closed:
            return
        self.closed = True
        last = last_committed_batch(self.checkpoint)
        if self.query_id is not None and last is not None:
            self._safely(self.query_id, last)
        if self._spark is not None:
            self._spark.streams.removeListener(self)
            self._spark = None
