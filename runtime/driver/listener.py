"""A StreamingQueryListener that logs the FT figures of each micro-batch next to Spark's progress.

::

    listener = attach(spark, query.layers, query_name="ftlayer-clicks")
    ...
    detach(spark, listener)

On every ``onQueryProgress`` (one per micro-batch; Spark calls it
asynchronously on the driver after the batch) it logs one INFO line on the
logger ``ftlayer.progress``::

    query=ftlayer-clicks batch=12 inputRows=500 inputRowsPerSecond=49.8 processedRowsPerSecond=512.3
    batchDurationMs=976 | clicks/events pending=3 acked=480 failed=2 replayed=2 deadLettered=0

(one line; a ``| topology/source ...`` group per source). The FT figures are
the source's counters at the time of the event (``failed`` = explicit +
timeout), read with the same read-only pipeline as ``ftlayer status``
(:func:`runtime.cli.status.sample`). The record also carries them as
``record.spark_progress`` and ``record.ft_sources`` (dicts) for structured
log handlers. If Redis cannot be read, the line says ``ft=unavailable`` with
the (password-free) reason at WARNING; the listener never raises into Spark.

A listener sees every query of the session: with ``query_name`` it logs
only the progress of that query (``Topology.start`` names its query
``ftlayer-<topology>``).

Clean stops: Spark calls the listener from its JVM listener bus through Py4J.
A call still running when the Python process exits is cut off, and the JVM logs
it as an ERROR with a Py4J stack trace. :func:`detach` therefore unregisters
the listener and then waits (bounded) until no call is running and none has
started for a short quiet period, so the process can exit with no such call.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from pyspark.sql.streaming.listener import (
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from ftlayer.errors import FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.status.read_model import sample
from ftlayer.store.source_store import SourceStore
from runtime.driver.json_listener import JsonEventListener
from runtime.driver.listener_removal import remove_listener

LOGGER_NAME = "ftlayer.progress"
QUIET_S = 0.3  # detach: no callback may have started this long before it returns
DETACH_WAIT_S = 10.0  # detach: the longest it waits for running callbacks
FT_FIGURES = ("pending", "acked", "failed", "replayed", "dead_lettered")
_SHOWN = {"dead_lettered": "deadLettered"}


def _rate(value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(number) else f"{number:.1f}"


class FTProgressListener(JsonEventListener):
    """Logs Spark's progress and the FT figures of ``stores`` for each micro-batch (see the module doc)."""

    def __init__(
        self,
        stores: Sequence[FTLayer | SourceStore],
        *,
        query_name: str | None = None,
        logger: logging.Logger | None = None,
        accept: Callable[[Any], bool] | None = None,
    ) -> None:
        self.stores = [s.store if isinstance(s, FTLayer) else s for s in stores]
        self.query_name = query_name
        self.accept = accept  # progress events it reports on (None: all of its query name's)
        self.log = logger or logging.getLogger(LOGGER_NAME)
        self.batches_logged = 0
        self._query_ids: set[str] = set()  # ids of the queries this listener reports on
        self.closed = False  # set before detaching: Spark's listener bus may still deliver late events
        self._calls = threading.Condition()
        self._running = 0  # callbacks from the JVM running now
        self._last_call = 0.0  # monotonic time the last callback started

    def close(self) -> None:
        """Ignore every event from now on (Spark delivers events asynchronously, even after removal)."""
        self.closed = True

    def remove(self, source: FTLayer | SourceStore) -> None:
        """Stop reporting the figures of ``source`` (its handle stopped)."""
        store = source.store if isinstance(source, FTLayer) else source
        self.stores = [s for s in self.stores
                       if s.keys.prefix != store.keys.prefix or s.config.redis_url != store.config.redis_url]

    def add(self, source: FTLayer | SourceStore) -> None:
        """Also report the figures of ``source`` (a DataFrame query may read sources opened later)."""
        store = source.store if isinstance(source, FTLayer) else source
        if all(s.keys.prefix != store.keys.prefix or s.config.redis_url != store.config.redis_url
               for s in self.stores):
            self.stores = [*self.stores, store]

    def _enter(self) -> None:
        with self._calls:
            self._running += 1
            self._last_call = time.monotonic()

    def _exit(self) -> None:
        with self._calls:
            self._running -= 1
            self._calls.notify_all()

    def wait_idle(self, quiet_s: float = QUIET_S, timeout_s: float = DETACH_WAIT_S) -> bool:
        """Wait until no callback runs and none started in the last ``quiet_s``; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._calls:
            while True:
                now = time.monotonic()
                quiet_until = self._last_call + quiet_s
                if self._running == 0 and now >= quiet_until:
                    return True
                if now >= deadline:
                    return False
                self._calls.wait(min(deadline, max(quiet_until, now + 0.01)) - now)

    def ft_figures(self) -> dict[str, dict[str, int]]:
        """``{"topology/source": {pending, acked, failed, replayed, dead_lettered}}`` read now."""
        out: dict[str, dict[str, int]] = {}
        by_namespace: dict[tuple[int, str], tuple[redis.Redis, list[SourceStore]]] = {}
        for store in self.stores:
            client = store.client
            by_namespace.setdefault((id(client), store.keys.namespace), (client, []))[1].append(store)
        for (_, namespace), (client, stores) in by_namespace.items():
            snap = sample(client, namespace, [(s.keys.topology, s.keys.source) for s in stores])
            for s in snap.sources:
                figures = {"pending": s.pending}
                figures.update({k: s.counters[k] for k in FT_FIGURES if k != "pending"})
                out[s.name] = figures
        return out

    def progress_line(self, progress: Any) -> tuple[str, dict[str, Any], dict[str, dict[str, int]] | None, str]:
        """(line, Spark figures, FT figures or None, error) for one ``StreamingQueryProgress``."""
        spark = {
            "query": progress.name or str(progress.id),
            "batchId": progress.batchId,
            "numInputRows": progress.numInputRows,
            "inputRowsPerSecond": progress.inputRowsPerSecond,
            "processedRowsPerSecond": progress.processedRowsPerSecond,
            "batchDurationMs": progress.batchDuration,
        }
        line = (
            f"query={spark['query']} batch={spark['batchId']} inputRows={spark['numInputRows']} "
            f"inputRowsPerSecond={_rate(spark['inputRowsPerSecond'])} "
            f"processedRowsPerSecond={_rate(spark['processedRowsPerSecond'])} "
            f"batchDurationMs={spark['batchDurationMs']}"
        )
        try:
            ft: dict[str, dict[str, int]] | None = self.ft_figures()
        except (FTLayerError, redis.RedisError) as exc:
            return f"{line} | ft=unavailable ({exc})", spark, None, str(exc)
        assert ft is not None
        for name, figures in ft.items():
            line += f" | {name} " + " ".join(f"{_SHOWN.get(k, k)}={v}" for k, v in figures.items())
        return line, spark, ft, ""

    def _mine(self, name: str | None, query_id: Any) -> bool:
        if self.query_name is not None and name != self.query_name:
            return False
        self._query_ids.add(str(query_id))
        return True

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        self._enter()
        try:
            if not self.closed and self._mine(event.name, event.id):
                self.log.debug("query=%s started (id %s, run %s)", event.name, event.id, event.runId)
        finally:
            self._exit()

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        self._enter()
        try:
            self._on_progress(event)
        finally:
            self._exit()

    def _on_progress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        if self.closed or not self._mine(progress.name, progress.id):
            return
        if self.accept is not None and not self.accept(progress):
            return
        try:
            line, spark, ft, error = self.progress_line(progress)
        except Exception:  # never raise into Spark's listener bus
            self.log.exception("ftlayer progress listener failed on a progress event")
            return
        level = logging.WARNING if error else logging.INFO
        self.log.log(level, "%s", line, extra={"spark_progress": spark, "ft_sources": ft})
        self.batches_logged += 1

    def onQueryIdle(self, event: Any) -> None:
        self._enter()
        self._exit()

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        self._enter()
        try:
            if self.closed or (self.query_name is not None and str(event.id) not in self._query_ids):
                return
            if event.exception:
                first = str(event.exception).strip().splitlines()[0][:300] if str(event.exception).strip() else "?"
                self.log.warning("query %s terminated with an exception: %s", event.id, first)
                self.log.debug("query %s: the whole exception: %s", event.id, event.exception)
            else:
                self.log.debug("query %s terminated", event.id)
        finally:
            self._exit()


def attach(
    spark: Any,
    stores: Sequence[FTLayer | SourceStore],
    *,
    query_name: str | None = None,
    logger: logging.Logger | None = None,
    accept: Callable[[Any], bool] | None = None,
) -> FTProgressListener:
    """Register an :class:`FTProgressListener` for ``stores`` on ``spark``'s streams and return it."""
    listener = FTProgressListener(stores, query_name=query_name, logger=logger, accept=accept)
    spark.streams.addListener(listener)
    return listener


def detach(spark: Any, listener: FTProgressListener) -> None:
    """Unregister a listener returned by :func:`attach` and wait until no callback of it runs.

    Events already queued may still arrive; a closed listener ignores them. Waiting for running
    callbacks (bounded, see :meth:`FTProgressListener.wait_idle`) lets the process exit without
    cutting one off, which the JVM would log as an ERROR with a Py4J stack trace.
    """
    listener.close()
    remove_listener(spark, listener)
    listener.wait_idle()
