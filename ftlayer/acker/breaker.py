"""The sink breaker: a sink outage pauses replays instead of spending the replay budget.

When a micro-batch's write fails, the acking point (``runtime.dataframe``) retries the same batch
with backoff, holding it (``ftlayer.acker.holds``): reads are paused because the query waits in that
batch. While it retries, the sink breaker of every source the batch read is **open**: the FT
service replays none of those sources' failed records (a replay would only meet the same broken
sink and spend its record's budget towards the dead-letter queue). Ingest goes on, bounded by
``max_pending``; records nobody read are re-filed, not failed (stalls). The first write that
succeeds **closes** the breaker and replays resume; so does giving up (the batch's records are
then failed or the query stopped, as the acking point decides).

Stored per source (whatever its shard count) under the source's own tag: ``brk``, a hash with
``query``, ``since_ms``, ``until_ms``, ``failures`` (failed attempts so far) and ``error`` (the
last one, truncated). ``until_ms`` is a lease: the acking point renews it on every attempt, so
a breaker whose driver died closes by itself within one lease. All calls are idempotent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from ftlayer.keyspace.keys import SourceKeys

__all__ = ["BREAKER_LEASE_S", "BreakerState", "SinkBreaker", "parse_breaker"]

BREAKER_LEASE_S = 60.0  # default lease: an open breaker nobody renews closes after this long
MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class BreakerState:
    """An open breaker as stored."""

    query: str
    since_ms: int
    until_ms: int
    failures: int
    error: str

    def open_at(self, now_ms: int) -> bool:
        return self.until_ms > now_ms


def parse_breaker(fields: Mapping[Any, Any] | None) -> BreakerState | None:
    """A ``brk`` hash as read (bytes or str) as a :class:`BreakerState`; None if empty or malformed."""
    raw = {k.decode() if isinstance(k, bytes) else str(k): v.decode() if isinstance(v, bytes) else str(v)
           for k, v in (fields or {}).items()}
    if not raw:
        return None
    try:
        return BreakerState(raw.get("query", ""), int(raw.get("since_ms", "0")), int(raw.get("until_ms", "0")),
                            int(raw.get("failures", "0")), raw.get("error", ""))
    except ValueError:
        return None


class SinkBreaker:
    """The sink breaker of one source (see the module contract)."""

    def __init__(self, client: redis.Redis, keys: SourceKeys) -> None:
        self.client = client
        self.key = keys.breaker

    def open(self, query: str, error: str, now_ms: int, lease_s: float = BREAKER_LEASE_S) -> None:
        """Record one more failed write of ``query`` and keep the breaker open for ``lease_s``."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hsetnx(self.key, "since_ms", now_ms)
        pipe.hset(self.key, mapping={"query": query, "until_ms": now_ms + int(lease_s * 1000),
                                     "error": error[:MAX_ERROR_CHARS]})
        pipe.hincrby(self.key, "failures", 1)
        pipe.execute()

    def close(self) -> None:
        """A write succeeded (or the acking point gave up): replays resume."""
        self.client.delete(self.key)

    def state(self) -> BreakerState | None:
        """The stored breaker (open or lapsed), or None if closed."""
        return parse_breaker(self.client.hgetall(self.key))

    def is_open(self, now_ms: int) -> bool:
        """True while an unexpired breaker is stored (replays of the source are paused)."""
        state = self.state()
        return state is not None and state.open_at(now_ms)
