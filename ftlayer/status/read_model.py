"""The read model of a namespace: what each registered source's FT state holds right now.

:func:`sample` reads every figure of a list of sources in one non-transactional
pipeline; it is read-only and never starts a server. ``ftlayer status``, the
metrics exporter and the query listener all read through it, so they agree.
The oldest-pending age is an upper bound, accurate to one rotation interval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import redis

from ftlayer.acker.breaker import BreakerState, parse_breaker
from ftlayer.acker.holds import CARRY_PREFIX, Hold, parse_hold
from ftlayer.errors import FTLayerError
from ftlayer.keyspace.keys import SourceKeys, check_name, sources_key
from ftlayer.status.ingest_state import FIELDS as INGEST_FIELDS
from ftlayer.status.ingest_state import IngestState, parse_state
from ftlayer.store.source_store import COUNTERS

__all__ = ["Snapshot", "SourceName", "SourceStatus", "oldest_pending_age_ms", "registered_sources", "sample"]

SourceName = tuple[str, str]  # (topology, source)
_PER_SHARD = 10  # commands per shard of a source in the sampling pipeline


def registered_sources(client: redis.Redis, namespace: str) -> list[SourceName]:
    """The (topology, source) pairs registered in ``<namespace>:sources``, sorted; invalid names skipped."""
    out: list[SourceName] = []
    for raw in client.smembers(sources_key(namespace)):
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        topology, sep, source = name.partition("/")
        try:
            check_name("topology", topology)
            check_name("source", source)
        except FTLayerError:
            continue  # not written by ftlayer: no keys of such a source can exist
        if sep:
            out.append((topology, source))
    return sorted(out)



@dataclass(frozen=True)
class SourceStatus:
    """One source's figures at one instant (see the module contract for their meaning)."""

    topology: str
    source: str
    num_channels: int | None
    pending: int
    failed_waiting: int
    dead_letters: int
    bucket_gen: int
    oldest_pending_age_s: float | None
    counters: dict[str, int]
    lease_owner: str | None
    lease_ttl_s: float | None
    ingest: IngestState | None = None
    breaker: BreakerState | None = None  # the sink breaker, if stored (open or lapsed): ftlayer.acker.breaker
    holds: tuple[Hold, ...] = ()  # micro-batches holding the source's records: ftlayer.acker.holds

    def breaker_open(self, now_ms: int) -> bool:
        """True while a sink breaker keeps the source's replays paused (a sink outage)."""
        return self.breaker is not None and self.breaker.open_at(now_ms)

    def running_batches(self, now_ms: int) -> list[Hold]:
        """The live holds: micro-batches running now that read the source (one per batch)."""
        live: dict[str, Hold] = {}
        for hold in self.holds:
            if hold.live(now_ms) and not hold.tag.startswith(CARRY_PREFIX):
                live.setdefault(hold.tag, hold)
        return list(live.values())

    @property
    def name(self) -> str:
        return f"{self.topology}/{self.source}"

    @property
    def service_alive(self) -> bool:
        """An FT service holds the rotator lease (it expires unless renewed)."""
        return self.lease_owner is not None


@dataclass(frozen=True)
class Snapshot:
    """Every selected source sampled in one pipeline, with wall and monotonic times."""

    time_ms: int
    monotonic_s: float
    sources: list[SourceStatus] = field(default_factory=list)


def oldest_pending_age_ms(bucket_gens: list[int], gen_times: dict[int, int], now_ms: int) -> float | None:
    """``now - start of the oldest bucket holding pending records``, or None if unknown.

    If that bucket's own start time is missing, the latest known start of an
    older generation is used: the result stays an upper bound.
    """
    if not bucket_gens:
        return None
    oldest = min(bucket_gens)
    known = [g for g in gen_times if g <= oldest]
    if not known:
        return None
    return float(max(0, now_ms - gen_times[max(known)]))


def _decode(raw: Any) -> str | None:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else None


def _ints(raw: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    for k, v in (raw or {}).items():
        try:
            out[int(k)] = int(float(v))
        except ValueError:
            continue
    return out


def sample(client: redis.Redis, namespace: str, sources: list[SourceName]) -> Snapshot:
    """Read the figures of ``sources`` (summed over each one's shards) in two non-transactional
    pipelines (read-only): the shard counts first, then every shard's figures."""
    counts = [1] * len(sources)
    if sources:
        pipe = client.pipeline(transaction=False)
        for topology, source in sources:
            pipe.hget(SourceKeys(namespace, topology, source).meta, "num_shards")
        counts = [max(1, min(64, int(raw))) if raw is not None else 1 for raw in pipe.execute()]
    pipe = client.pipeline(transaction=False)
    for (topology, source), n in zip(sources, counts, strict=True):
        home = SourceKeys(namespace, topology, source, 0, n)
        pipe.hget(home.meta, "num_channels")
        pipe.hmget(home.meta, *INGEST_FIELDS)
        pipe.hgetall(home.breaker)
        for shard in range(n):
            k = home.for_shard(shard)
            pipe.hgetall(k.stats)
            pipe.get(k.live)
            pipe.hlen(k.failed)
            pipe.xlen(k.dlq)
            pipe.get(k.gen)
            pipe.hkeys(k.bcnt)
            pipe.hgetall(k.key("gtime"))
            pipe.get(k.lease)
            pipe.pttl(k.lease)
            pipe.hgetall(k.holds)
    replies = pipe.execute() if sources else []
    now_ms, mono = int(time.time() * 1000), time.monotonic()
    out: list[SourceStatus] = []
    at = 0
    for (topology, source), n in zip(sources, counts, strict=True):
        nch, ingest, brk = replies[at : at + 3]
        shards = [replies[at + 3 + j * _PER_SHARD : at + 3 + (j + 1) * _PER_SHARD] for j in range(n)]
        at += 3 + n * _PER_SHARD
        holds: list[Hold] = []
        counters = dict.fromkeys(COUNTERS, 0)
        pending = failed_n = dead = gen_max = 0
        ages: list[float] = []
        for stats, pend, failed, dlq, gen, bgens, gtimes, _owner, _pttl, held in shards:
            holds += [h for h in (parse_hold(t, v) for t, v in held.items()) if h is not None]
            for key, value in stats.items():
                counters[key.decode()] = counters.get(key.decode(), 0) + int(value)
            pending, failed_n, dead = pending + int(pend or 0), failed_n + int(failed), dead + int(dlq)
            gen_max = max(gen_max, int(gen or 0))
            age = oldest_pending_age_ms([int(g) for g in bgens if g.isdigit()], _ints(gtimes), now_ms)
            if age is not None:
                ages.append(age)
        counters["failed"] = counters["failed_explicit"] + counters["failed_timeout"]
        owner, pttl = shards[0][7], shards[0][8]
        out.append(SourceStatus(
            topology=topology, source=source,
            num_channels=int(nch) if nch is not None else None,
            pending=pending, failed_waiting=failed_n, dead_letters=dead,
            bucket_gen=gen_max,
            oldest_pending_age_s=max(ages) / 1000 if ages else None,
            counters=counters,
            lease_owner=_decode(owner),
            lease_ttl_s=int(pttl) / 1000 if owner is not None and int(pttl) >= 0 else None,
            ingest=parse_state(ingest),
            breaker=parse_breaker(brk),
            holds=tuple(holds),
        ))
    return Snapshot(now_ms, mono, out)
