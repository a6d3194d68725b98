"""A running topology: :class:`FTQuery`.

FTQuery wraps the Spark StreamingQuery with the ingest threads and either the
FT service (FT on: counters from Redis, "drained" when nothing is pending or
waiting for replay) or the in-driver feeds (FT off). ``stop()`` stops all of
it, plus the metrics exporter and progress listener when they run.

FTQuery answers like PySpark's StreamingQuery: ``id``, ``runId``, ``name``,
``isActive``, ``status``, ``lastProgress``, ``recentProgress``,
``exception()``, ``awaitTermination(timeout)``, ``processAllAvailable()`` and
``stop()`` are the Spark query's. ``stop()`` also stops ingest and the FT
service, is idempotent, and runs on leaving a ``with`` block. Stopping never
loses a persisted record: what is pending stays in Redis for the next run.

Errors are never reported as drained: an ingest thread that stopped on an
error (its source or a source hook raised) makes :meth:`FTQuery.drained`
raise :class:`~ftlayer.errors.IngestStoppedError` once everything it had
persisted is settled, and an FT service that gave up after its outage budget
makes it raise :class:`~ftlayer.errors.ServiceStoppedError` at once. During a
Redis outage (shorter than the budget) ``drained()`` is False, not an error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import redis

from ftlayer.errors import FTLayerError, IngestStoppedError, RedisUnavailableError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.facade.service import FTService
from ftlayer.logs import logger_for
from runtime.driver.ingest import Ingestor
from runtime.driver.observe import TopologyObservers
from runtime.driver.query_stop import DEFAULT_STOP_GRACE_S, stop_query

log = logger_for(__name__)

__all__ = ["FTProgress", "FTQuery", "Progress"]

if TYPE_CHECKING:
    from ftlayer.config import FTConfig
    from runtime.trigger import Trigger


class Janitor(Protocol):
    """What FTProgress closes at stop: ``runtime.driver.token_janitor.TokenJanitor``."""

    def close(self) -> None: ...


class Progress(Protocol):
    """What an FTQuery watches: :class:`FTProgress` (FT on) or ``runtime.driver.feed.FeedProgress`` (off)."""

    def stats(self) -> dict[str, dict[str, int]]: ...
    def settled(self) -> bool: ...  # nothing in flight: every ingested record is done with
    def stop(self) -> None: ...


@dataclass
class FTProgress:
    """FT on: counters from Redis; settled when nothing is pending or waiting for replay."""

    layers: list[FTLayer]
    service: FTService
    observers: TopologyObservers | None = None  # metrics exporter + progress listener
    janitor: Janitor | None = None  # deletes the flush tokens of committed batches

    def stats(self) -> dict[str, dict[str, int]]:
        return {layer.keys.source: layer.stats() for layer in self.layers}

    def settled(self) -> bool:
        try:
            stats = self.stats()
        except (RedisUnavailableError, redis.ConnectionError, redis.TimeoutError):
            return False  # an outage: not drained; tasks and ingest wait for the server
        return all(s["pending"] == 0 and s["failed_waiting"] == 0 for s in stats.values())

    def stop(self) -> None:
        # the query has stopped: the batch it was running (if any) no longer holds its records
        for layer in self.layers:
            try:
                layer.end_holds()
            except (FTLayerError, redis.RedisError) as exc:  # they lapse within one lease anyway
                log.warning("could not end the batch holds of %s: %s", layer.keys.prefix, exc)
        self.service.stop()
        if self.observers is not None:
            self.observers.stop()
        if self.janitor is not None:  # after the query stopped: its commit log is final
            self.janitor.close()


class FTQuery:
    """A running topology: the StreamingQuery plus ingest threads and the FT service (or feeds)."""

    def __init__(
        self,
        query: Any,
        ingestors: list[Ingestor],
        progress: Progress,
        checkpoint: str,
        *,
        config: FTConfig | None = None,
        trigger: Trigger | None = None,
    ) -> None:
        self.query = query
        self.ingestors = ingestors
        self.progress = progress
        self.checkpoint = checkpoint
        self.config = config  # the effective config: the topology's, with the session's spark.ftlayer.* applied
        self.trigger = trigger
        self.layers: list[FTLayer] = progress.layers if isinstance(progress, FTProgress) else []
        self.service: FTService | None = progress.service if isinstance(progress, FTProgress) else None
        self._stopped = False

    # --- the StreamingQuery interface (delegated to the Spark query) ---------------------------

    @property
    def id(self) -> str:
        """The query's id, stable across restarts from the same checkpoint."""
        return str(self.query.id)

    @property
    def runId(self) -> str:
        """The id of this run of the query."""
        return str(self.query.runId)

    @property
    def name(self) -> str | None:
        """The query name (``query_name`` of ``Topology.start``; default ``ftlayer-<topology>``)."""
        name: str | None = self.query.name
        return name

    @property
    def isActive(self) -> bool:
        """True while the Spark query runs."""
        return bool(self.query.isActive)

    @property
    def status(self) -> dict[str, Any]:
        """Spark's status: ``message``, ``isDataAvailable``, ``isTriggerActive``."""
        status: dict[str, Any] = self.query.status
        return status

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        """Spark's progress of the last micro-batch (None before the first one)."""
        progress: dict[str, Any] | None = self.query.lastProgress
        return progress

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        """Spark's progress of the recent micro-batches, oldest first."""
        return list(self.query.recentProgress)

    def exception(self) -> Any:
        """The StreamingQueryException that ended the query, or None."""
        return self.query.exception()

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """Wait for the Spark query to end; raises its exception if it failed.

        With ``timeout`` (seconds) returns whether it ended in time; without, returns None when it
        ends. Ingest and the FT service keep running until :meth:`stop` (or the ``with`` block's
        end), so records replayed after a finite trigger's query ended stay persisted for a re-run.
        """
        if timeout is None:
            self.query.awaitTermination()
            return None
        return bool(self.query.awaitTermination(timeout))

    def processAllAvailable(self) -> None:
        """Block until the Spark query processed everything available in its sources now."""
        self.query.processAllAvailable()

    def __enter__(self) -> FTQuery:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- FT figures -----------------------------------------------------------------------------

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters per source: FT on, persisted, acked, failed_*, replayed, pending, ...; FT off, see
        Feed.stats. Both add the driver's ingest figures: ``ingest_error`` (1 if ingest stopped on
        an error, see :meth:`ingest_errors`), ``ingest_paused`` (1 while it waits for Redis or for
        room) and ``ingest_pauses`` (outages it waited through)."""
        stats = self.progress.stats()
        for st, ing in zip(stats.values(), self.ingestors, strict=False):  # both in source order
            st["ingest_error"] = int(ing.error is not None)
            st["ingest_paused"] = int(ing.paused is not None)
            st["ingest_pauses"] = ing.pauses
        return stats

    def ingest_errors(self) -> dict[str, BaseException]:
        """Per source label, the error that stopped its ingest thread (empty if none did)."""
        return {i.destination.label: i.error for i in self.ingestors if i.error is not None}

    def drained(self) -> bool:
        """Ingest finished and nothing in flight (FT on: nothing pending or waiting for replay;
        FT off: every fed row committed, i.e. the batches holding it completed).

        Raises :class:`~ftlayer.errors.ServiceStoppedError` if the FT service gave up, and
        :class:`~ftlayer.errors.IngestStoppedError` if an ingest thread stopped on an error,
        once what it persisted is settled (it would otherwise look drained)."""
        if self.service is not None and self.service.error is not None:
            raise self.service.error
        if not all(i.done for i in self.ingestors):
            return False
        settled = self.progress.settled()
        failed = [i for i in self.ingestors if i.error is not None]
        if settled and failed:
            first = failed[0]
            msg = (f"ingest of source {first.destination.label!r} stopped on an error after {first.ingested} "
                   f"records (those are settled; the rest of the source was never read): "
                   f"{type(first.error).__name__}: {first.error}")
            raise IngestStoppedError(msg) from first.error
        return settled

    def await_drained(self, timeout_s: float = 120.0, poll_s: float = 0.25) -> bool:
        """Wait until :meth:`drained` (True) or the timeout (False). Raises if the query died, the
        FT service gave up or an ingest thread stopped on an error (see :meth:`drained`)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            exc = self.query.exception()
            if exc is not None:
                raise exc
            if self.drained():
                return True
            time.sleep(poll_s)
        return False

    def stop(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> bool:
        """Stop ingest, the query and the FT service (leases released) or the feed servers. Idempotent.

        The query stops between micro-batches: after ingest stopped, it waits up to ``grace_s`` for
        the running batch to end, so no task is killed (``runtime.driver.query_stop``). Returns
        False if ``grace_s`` ran out and the running batch was interrupted (nothing is lost: its
        records were not acked, and a restart re-runs it), else True.
        """
        if self._stopped:
            return True
        self._stopped = True
        for ing in self.ingestors:  # all asked first: their stop graces run side by side
            ing.request_stop()
        for ing in self.ingestors:
            ing.stop()
        try:
            quiet = stop_query(self.query, grace_s)
        finally:
            self.progress.stop()
        return quiet
