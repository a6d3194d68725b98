"""One source's keys as a whole: what ``ftlayer sources describe`` shows and ``sources reset`` deletes.

Contract:

- :func:`source_prefixes` are the key prefixes that hold every key of a source (the layout of
  :mod:`ftlayer.keyspace.keys`): each shard's ``<namespace>:{<shard tag>}:``, and the source's own
  ``<namespace>:{<topology>/<source>}:`` (``meta``, ``brk``; the same as shard 0's with one
  shard). No other source's key starts with one of them: names cannot hold ``/`` or braces.
- :func:`inventory` lists those keys with type, entry count and bytes (SCAN, TYPE, a length
  command and ``MEMORY USAGE`` per key; read-only) and the source's ``meta``.
- :func:`reset_blockers` says why deleting a source now would lose or break something: records
  pending or waiting for replay, an FT service holding the rotator lease (a running query),
  micro-batches running.
- :func:`reset_source` deletes every key under the source's prefixes and then removes the
  source from ``<namespace>:sources``. It is not atomic (the shards live in different slots),
  but repeatable: shards first, ``meta`` and the membership last, so a reset stopped part-way
  still lists the source and a second reset finishes it. It deletes nothing of the namespace
  itself (``<namespace>:owner``, other sources) and leaves the short-lived namespace-level
  ``<namespace>:dfq:*`` sets of the DataFrame path to their expiry. State outside Redis is not
  touched: the Spark checkpoint of a query that read the source (its offsets name stream ids of
  the deleted channels: start the query with a new checkpoint) and ``ftlayer ingest``'s saved
  file offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from ftlayer.keyspace.keys import SourceKeys, sources_key
from ftlayer.status.read_model import SourceStatus

__all__ = ["KeyInfo", "SourceInventory", "inventory", "reset_blockers", "reset_source", "source_prefixes"]

_LENGTH = {"string": "EXISTS", "hash": "HLEN", "list": "LLEN", "set": "SCARD", "zset": "ZCARD", "stream": "XLEN"}
_DELETE_BATCH = 500


@dataclass(frozen=True)
class KeyInfo:
    """One key of a source: full name, shard, suffix (``ck``, ``ch:0``, ``tok:...``), type, entries, bytes."""

    name: str
    shard: int | None  # None: the source's own keys (meta, brk) of a source with several shards
    suffix: str
    type: str
    entries: int
    bytes: int | None  # None where MEMORY USAGE is not allowed

    @property
    def family(self) -> str:
        """The key's kind without its per-key part: ``ch``, ``tok``, ``dfb``, ``hld`` or the suffix."""
        return self.suffix.split(":", 1)[0]


@dataclass(frozen=True)
class SourceInventory:
    """The keys of one source and its ``meta`` fields (decoded text)."""

    topology: str
    source: str
    num_shards: int
    meta: dict[str, str]
    keys: list[KeyInfo] = field(default_factory=list)

    @property
    def total_bytes(self) -> int | None:
        sizes = [k.bytes for k in self.keys]
        return None if any(b is None for b in sizes) else sum(b for b in sizes if b is not None)


def recorded_shards(client: redis.Redis, namespace: str, topology: str, source: str) -> int:
    """The shard count in the source's ``meta`` (1 when missing: a source older than shards, or gone)."""
    raw = client.hget(SourceKeys(namespace, topology, source).meta, "num_shards")
    return max(1, int(raw)) if raw is not None else 1


def source_prefixes(namespace: str, topology: str, source: str, num_shards: int) -> list[tuple[int | None, str]]:
    """``(shard, prefix)`` of every prefix holding the source's keys; the source's own prefix last
    (shard None; with one shard it is shard 0's and listed once)."""
    home = SourceKeys(namespace, topology, source, 0, num_shards)
    out: list[tuple[int | None, str]] = [(k, home.for_shard(k).prefix) for k in range(num_shards)]
    if num_shards > 1:
        out.append((None, home.source_prefix))
    return out


def _scan(client: redis.Redis, prefix: str) -> list[str]:
    return sorted({(raw.decode() if isinstance(raw, bytes) else str(raw))
                   for raw in client.scan_iter(match=prefix + "*", count=1000)})


def inventory(client: redis.Redis, namespace: str, topology: str, source: str) -> SourceInventory:
    """Every key of the source now, with its type, entries and bytes (read-only)."""
    shards = recorded_shards(client, namespace, topology, source)
    found: list[tuple[int | None, str, str]] = []  # (shard, prefix, name)
    for shard, prefix in source_prefixes(namespace, topology, source, shards):
        found += [(shard, prefix, name) for name in _scan(client, prefix)]
    pipe = client.pipeline(transaction=False)
    for _, _, name in found:
        pipe.type(name)
    types = [t.decode() if isinstance(t, bytes) else str(t) for t in pipe.execute()] if found else []
    pipe = client.pipeline(transaction=False)
    for (_, _, name), kind in zip(found, types, strict=True):
        pipe.execute_command(_LENGTH.get(kind, "EXISTS"), name)  # type: ignore[no-untyped-call]
        pipe.memory_usage(name)
    try:
        sizes = pipe.execute(raise_on_error=False) if found else []
    except redis.ResponseError:
        sizes = []
    keys: list[KeyInfo] = []
    for i, ((shard, prefix, name), kind) in enumerate(zip(found, types, strict=True)):
        entries, used = (sizes[2 * i], sizes[2 * i + 1]) if sizes else (0, None)
        if kind == "none":  # expired or deleted between SCAN and TYPE
            continue
        keys.append(KeyInfo(
            name=name, shard=shard, suffix=name[len(prefix):], type=kind,
            entries=int(entries) if isinstance(entries, int) else 0,
            bytes=int(used) if isinstance(used, int) else None,
        ))
    raw_meta = client.hgetall(SourceKeys(namespace, topology, source).meta)
    meta = {(k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
            for k, v in raw_meta.items()}
    return SourceInventory(topology, source, shards, meta, keys)


def reset_blockers(status: SourceStatus, now_ms: int) -> list[str]:
    """Why resetting the source now would lose records or pull state from under a running query."""
    out: list[str] = []
    if status.pending:
        out.append(f"{status.pending} record(s) pending (persisted, not yet complete or failed)")
    if status.failed_waiting:
        out.append(f"{status.failed_waiting} failed record(s) waiting for their replay")
    if status.service_alive:
        out.append(f"an FT service holds the rotator lease (owner {status.lease_owner}): a query runs")
    running = status.running_batches(now_ms)
    if running:
        out.append(f"{len(running)} micro-batch(es) reading the source are running")
    return out


def reset_source(client: redis.Redis, namespace: str, topology: str, source: str) -> int:
    """Delete every key of the source, then its registration; returns how many keys were deleted."""
    shards = recorded_shards(client, namespace, topology, source)
    home = SourceKeys(namespace, topology, source, 0, shards)
    deleted = 0
    for _, prefix in source_prefixes(namespace, topology, source, shards):
        names = [n for n in _scan(client, prefix) if n != home.meta]  # meta last: it holds num_shards
        for i in range(0, len(names), _DELETE_BATCH):
            deleted += int(client.delete(*names[i : i + _DELETE_BATCH]))
    deleted += int(client.delete(home.meta))
    client.srem(sources_key(namespace), f"{topology}/{source}")
    return deleted
