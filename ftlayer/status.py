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

from ftlayer.errors import FTLayerError
from ftlayer.ingest_state import FIELDS as INGEST_FIELDS
from ftlayer.ingest_state import IngestState, parse_state
from ftlayer.keys import SourceKeys, check_name, sources_key
from ftlayer.store import COUNTERS

__all__ = ["Snapshot", "SourceName", "SourceStatus", "oldest_pending_age_ms", "registered_sources", "sample"]

SourceName = tuple[str, str]  # (topology, source)
_PER_SOURCE = 11  # commands per source in the sampling pipeline


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
    """Read the figures of ``sources`` in one non-transactional pipeline (read-only)."""
    pipe = client.pipeline(transaction=False)
    for topology, source in sources:
        k = SourceKeys(namespace, topology, source)
        pipe.hgetall(k.stats)
        pipe.get(k.live)
        pipe.hlen(k.failed)
        pipe.xlen(k.dlq)
        pipe.get(k.gen)
        pipe.hkeys(k.bcnt)
        pipe.hgetall(k.key("gtime"))
        pipe.get(k.lease)
        pipe.pttl(k.lease)
        pipe.hget(k.meta, "num_channels")
        pipe.hmget(k.meta, *INGEST_FIELDS)
    replies = pipe.execute() if sources else []
    now_ms, mono = int(time.time() * 1000), time.monotonic()
    out: list[SourceStatus] = []
    for i, (topology, source) in enumerate(sources):
        part = replies[i * _PER_SOURCE : (i + 1) * _PER_SOURCE]
        stats, pend, failed, dlq, gen, bgens, gtimes, owner, pttl, nch, ingest = part
        counters = dict.fromkeys(COUNTERS, 0)
        counters.update({k.decode(): int(v) for k, v in stats.items()})
        counters["failed"] = counters["failed_explicit"] + counters["failed_timeout"]
        gens = [int(g) for g in bgens if g.isdigit()]
        out.append(SourceStatus(
            topology=topology, source=source,
            num_channels=int(nch) if nch is not None else None,
            pending=int(pend or 0), failed_waiting=int(failed), dead_letters=int(dlq),
            bucket_gen=int(gen or 0),
            oldest_pending_age_s=(
                None if (age := oldest_pending_age_ms(gens, _ints(gtimes), now_ms)) is None else age / 1000
            ),
            counters=counters,
            lease_owner=_decode(owner),
            lease_ttl_s=int(pttl) / 1000 if owner is not None and int(pttl) >= 0 else None,
            ingest=parse_state(ingest),
        ))
    return Snapshot(now_ms, mono, out)
