"""One virtual shard of a source: its store and the FT components over it, and routing by shard.

A source with ``num_shards`` N keeps its records in N shards, each a full set of
keys under its own hash tag (``ftlayer.keyspace.keys``, ``ftlayer.keyspace.shard_tags``). A record lives
in the shard its id names (``ftlayer.records.chunks.shard_of``: all records of a chunk share
it), its replays are drawn in the same shard, and every server-side call touches
one shard (one slot). :class:`Shard` bundles what :class:`~ftlayer.facade.ft_layer.FTLayer`
used to hold for the whole source; the functions here split a call's ids by
shard. With N = 1 there is one shard, named as the source always was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import redis

from ftlayer.acker.acker_table import AckerTable
from ftlayer.acker.dead_letters import DeadLetters
from ftlayer.acker.persistence import PersistenceLayer
from ftlayer.acker.replayer import Replayer, ReplayRouter
from ftlayer.acker.rotating_map import ExpiredCallback, RotatingBucketMap
from ftlayer.config import FTConfig
from ftlayer.records.chunks import shard_of
from ftlayer.store.source_store import Clock, SourceStore

__all__ = ["Shard", "by_shard", "split_by_shard"]

T = TypeVar("T")


class Shard:
    """The FT components of one shard of one source (see the module notes). Picklable."""

    def __init__(
        self,
        config: FTConfig,
        topology: str,
        source: str,
        shard: int,
        *,
        num_channels: int,
        replay_router: ReplayRouter | None,
        client: redis.Redis | None,
        clock: Clock,
        on_expired: ExpiredCallback | None,
        owner: str | None,
        outage_budget_s: float,
    ) -> None:
        self.index = shard
        self.store = SourceStore(config, topology, source, client=client, clock=clock,
                                 outage_budget_s=outage_budget_s, shard=shard)
        self.acker = AckerTable(self.store)
        self.persistence = PersistenceLayer(self.store, num_channels)
        self.buckets = RotatingBucketMap(self.store, owner=owner, on_expired=on_expired)
        self.replayer = Replayer(self.store, num_channels, replay_router)
        self.dead_letters = DeadLetters(self.store)


def by_shard(items: Iterable[T], sid_of: Callable[[T], int], num_shards: int) -> dict[int, list[T]]:
    """``items`` grouped by the shard of their id, order kept within a shard."""
    out: dict[int, list[T]] = {}
    for item in items:
        out.setdefault(shard_of(sid_of(item), num_shards), []).append(item)
    return out


def split_by_shard(mapping: Mapping[int, T], num_shards: int) -> dict[int, dict[int, T]]:
    """A ``{sid: value}`` mapping split per shard."""
    out: dict[int, dict[int, T]] = {}
    for sid, value in mapping.items():
        out.setdefault(shard_of(sid, num_shards), {})[sid] = value
    return out


def shard_ids(sids: Sequence[int], num_shards: int) -> list[int]:
    """The shard of each id, in order."""
    return [shard_of(sid, num_shards) for sid in sids]
