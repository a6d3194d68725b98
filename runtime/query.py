"""A running topology (:class:`FTQuery`) and the driver-side foreachBatch sink.

FTQuery wraps the Spark StreamingQuery with the ingest threads and either the
FT service (FT on: counters from Redis, "drained" when nothing is pending or
waiting for replay) or the in-driver feeds (FT off). ``stop()`` stops all of
it, plus the metrics exporter and progress listener when they run.

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
from typing import Any, Protocol

import redis

from ftlayer.errors import IngestStoppedError, RedisUnavailableError
from ftlayer.layer import FTLayer
from ftlayer.service import FTService
from runtime.handlers import CARRIER, FTHandler, handler_for
from runtime.ingest import Ingestor
from runtime.observe import TopologyObservers
from runtime.operators import ROW_COLUMNS, TaskEnv
from runtime.sinks import ForeachBatchSink
from serialization.payload import unpack_payload


@dataclass
class DriverSinkBatch:
    """foreachBatch function of a :class:`ForeachBatchSink`: collect, call, ack on the driver."""

    env: TaskEnv
    sink: ForeachBatchSink

    def __call__(self, df: Any, batch_id: int) -> None:
        if not self.env.config.ft_on:  # FT off: no acks; a failing sink fails the batch (Spark's rules)
            self.sink.fn([unpack_payload(r["payload"]) for r in df.select("payload").collect()], batch_id)
            return
        handler: FTHandler = handler_for(True, 0)
        rows = handler.receive(
            (r["src"], r["sid"], r["cid"], r["origin"], CARRIER if r["payload"] is None else r["payload"], r["delta"])
            for r in df.select(*ROW_COLUMNS).collect()
        )
        ids = [(src, sid, cid ^ delta) for src, sid, cid, _, _, delta in rows]
        try:
            self.sink.fn([unpack_payload(row[4]) for row in rows], batch_id)
        except Exception as exc:  # the batch's records fail and are replayed
            handler.fail_all(ids, exc)
        else:
            handler.ack(ids)
        handler.flush(self.env.layers(), f"{self.env.topology}/{batch_id}/sink/driver")


class Progress(Protocol):
    """What an FTQuery watches: :class:`FTProgress` (FT on) or ``runtime.feed.FeedProgress`` (off)."""

    def stats(self) -> dict[str, dict[str, int]]: ...
    def settled(self) -> bool: ...  # nothing in flight: every ingested record is done with
    def stop(self) -> None: ...


@dataclass
class FTProgress:
    """FT on: counters from Redis; settled when nothing is pending or waiting for replay."""

    layers: list[FTLayer]
    service: FTService
    observers: TopologyObservers | None = None  # metrics exporter + progress listener

    def stats(self) -> dict[str, dict[str, int]]:
        return {layer.store.keys.source: layer.stats() for layer in self.layers}

    def settled(self) -> bool:
        try:
            stats = self.stats()
        except (RedisUnavailableError, redis.ConnectionError, redis.TimeoutError):
            return False  # an outage: not drained; tasks and ingest wait for the server
        return all(s["pending"] == 0 and s["failed_waiting"] == 0 for s in stats.values())

    def stop(self) -> None:
        self.service.stop()
        if self.observers is not None:
            self.observers.stop()


class FTQuery:
    """A running topology: the StreamingQuery plus ingest threads and the FT service (or feeds)."""

    def __init__(self, query: Any, ingestors: list[Ingestor], progress: Progress, checkpoint: str) -> None:
        self.query = query
        self.ingestors = ingestors
        self.progress = progress
        self.checkpoint = checkpoint
        self.layers: list[FTLayer] = progress.layers if isinstance(progress, FTProgress) else []
        self.service: FTService | None = progress.service if isinstance(progress, FTProgress) else None

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

    def stop(self) -> None:
        """Stop ingest, the query and the FT service (leases released) or the feed servers."""
        for ing in self.ingestors:
            ing.stop()
        self.query.stop()
        self.progress.stop()
