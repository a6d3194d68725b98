"""A running topology: :class:`FTQuery`.

FTQuery wraps the Spark StreamingQuery with the ingest threads and either the
FT service (FT on: counters from Redis, "drained" when nothing is pending or
waiting for replay) or the in-driver feeds (FT off). ``stop()`` stops all of
it, plus the metrics exporter and progress listener when they run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from ftlayer.layer import FTLayer
from ftlayer.service import FTService
from runtime.driver.ingest import Ingestor
from runtime.driver.observe import TopologyObservers

__all__ = ["FTProgress", "FTQuery", "Progress"]


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

    def stats(self) -> dict[str, dict[str, int]]:
        return {layer.store.keys.source: layer.stats() for layer in self.layers}

    def settled(self) -> bool:
        return all(s["pending"] == 0 and s["failed_waiting"] == 0 for s in self.stats().values())

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
        """Counters per source: FT on, persisted, acked, failed_*, replayed, pending, ...; FT off, see Feed.stats."""
        return self.progress.stats()

    def drained(self) -> bool:
        """Ingest finished and nothing in flight (FT on: nothing pending or waiting for replay;
        FT off: every fed row committed, i.e. the batches holding it completed)."""
        if not all(i.done for i in self.ingestors):
            return False
        return self.progress.settled()

    def await_drained(self, timeout_s: float = 120.0, poll_s: float = 0.25) -> bool:
        """Wait until :meth:`drained` (True) or the timeout (False). Raises if the query died."""
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
