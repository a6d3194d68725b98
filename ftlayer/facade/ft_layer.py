"""FTLayer: the facade over one source's fault-tolerance state in Redis.

It bundles the parts of the original design's FTLayer for one source (per virtual
shard, ``ftlayer.facade.shard``; one shard unless ``num_shards`` says more):
persistence (``persist``), the AckerTable (``xor``, ``ack``), explicit failing
(``fail``), timeouts (``on_timeout``: rotate the bucket map) and the replayer
(``replay_due``), plus dead letters and counters. Both kinds of failure end in
the replayer; a late ack or XOR for a failed id does nothing.

Picklable: executors receive it inside closures and reconnect by URL.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import redis

from ftlayer.acker.acker_table import FlushResult, check_id, check_pairs, checked_fails
from ftlayer.acker.batch_acks import BatchAcks
from ftlayer.acker.dead_letter_entry import DeadLetter
from ftlayer.acker.dead_letter_ids import by_entry_shard, entry_order, qualify, shard_cursor, unqualify
from ftlayer.acker.dead_letter_requeue import RequeueResult
from ftlayer.acker.flush_tokens import FlushToken
from ftlayer.acker.holds import CARRY_PREFIX, Hold, Holds
from ftlayer.acker.persistence import ChannelBatch
from ftlayer.acker.replayer import ReplayResult, ReplayRouter
from ftlayer.acker.rotating_map import ExpiredCallback, RotateResult
from ftlayer.config import FTConfig
from ftlayer.errors import ChunkIdInUseError, ConfigError, InvalidIdError
from ftlayer.facade.shard import Shard, by_shard, shard_ids, split_by_shard
from ftlayer.keyspace.keys import SourceKeys
from ftlayer.records.chunk_columns import attach_columns
from ftlayer.records.chunk_encoding import encode_source_chunks
from ftlayer.records.chunks import PackedChunk, shard_of, sid_at
from ftlayer.records.delta_arrays import DeltaArrays
from ftlayer.records.frames import SemiDeserializedRecord
from ftlayer.scripting.lua_script import STATE_KEYS, LuaScript
from ftlayer.servers.process_server import resolved
from ftlayer.store.id_blobs import pack_ids
from ftlayer.store.server_settings import check_server_settings
from ftlayer.store.source_store import Clock, persist_refused_error

# The script this module runs (ftlayer.scripting.lua_script: its KEYS and ARGV, checked at each call)
TOUCH = LuaScript("TOUCH", keys=STATE_KEYS, argv=("prefix", "sids"))

__all__ = ["FTLayer"]


class FTLayer:
    """Fault-tolerance state of one source of one topology, over its shards (``ftlayer.facade.shard``).

    With ``config.num_shards`` = 1 (the default) there is one shard and ``store``, ``acker``,
    ``persistence``, ``buckets``, ``replayer`` and ``dead_letters`` are its parts. With more,
    those name shard 0's parts, and every method here routes by shard: a call's ids are split
    by the shard they name and each shard gets one call of its own (one slot each, so a
    cluster spreads them over its primaries). Results are merged.
    """

    def __init__(
        self,
        config: FTConfig,
        topology: str,
        source: str,
        *,
        source_id: int = 0,
        num_channels: int | None = None,
        replay_router: ReplayRouter | None = None,
        client: redis.Redis | None = None,
        clock: Clock = time.time,
        on_expired: ExpiredCallback | None = None,
        owner: str | None = None,
        outage_budget_s: float = 0.0,
    ) -> None:
        self.config = config
        self.source_id = source_id
        self.num_channels = num_channels or config.num_channels
        self.num_shards = config.num_shards
        # no redis_url and no client: this process's embedded server (started on first use)
        shard_config = config if client is not None or config.redis_url else resolved(config)
        # outage_budget_s > 0 (Spark tasks): commands wait out a Redis outage (ftlayer.store.outage)
        self.shards = [
            Shard(shard_config, topology, source, k, num_channels=self.num_channels, replay_router=replay_router,
                  client=client, clock=clock, on_expired=on_expired, owner=owner, outage_budget_s=outage_budget_s)
            for k in range(self.num_shards)
        ]
        # the shards this process files new records in (all by default; see write_shards)
        self.ingest_shards: list[int] | None = None
        first = self.shards[0]
        self.store = first.store
        self.acker = first.acker
        self.persistence = first.persistence
        self.buckets = first.buckets
        self.replayer = first.replayer
        self.dead_letters = first.dead_letters

    @classmethod
    def registered(cls, config: FTConfig, topology: str, source: str, **kw: Any) -> FTLayer:
        """A layer of an existing source with the shard count it registered with (tools that
        inspect or manage a source: ``ftlayer dlq``); ``config.num_shards`` if it is not registered."""
        layer = cls(config, topology, source, **kw)
        raw = layer.store.client.hget(layer.keys.meta, "num_shards")
        shards = int(raw) if raw is not None else config.num_shards
        return layer if shards == layer.num_shards else cls(config.replace(num_shards=shards), topology, source, **kw)

    def open(self) -> FTLayer:
        """Check the server's settings, then register the source or check its channel and shard counts.

        Raises :class:`EvictionPolicyError` if the server may evict keys, and in
        'waitaof' mode :class:`DurabilityError` if its AOF cannot confirm an fsync
        (see ``ftlayer.store.server_settings``); nothing is written then. A source registered
        with another ``num_shards`` raises :class:`ConfigError` naming both. Idempotent. On a
        cluster both steps ride out dropped connections and failovers (``SourceStore.ride_out``);
        on a single server the client's own retry (``outage_budget_s``) does.
        """
        k = self.store.keys
        where = f"source {k.topology}/{k.source}"

        def check_nodes() -> None:
            # the nodes looked up again on each try: after a failover a shard has a new primary
            nodes: dict[tuple[object, ...], redis.Redis] = {}
            for shard in self.shards:
                node = shard.store.node_client()
                kw = node.connection_pool.connection_kwargs
                nodes.setdefault((kw.get("host"), kw.get("port"), kw.get("path")), node)
            for node in nodes.values():
                check_server_settings(node, self.config.durability, where)

        # retried like every other call on a cluster: a connection dropped while a node client
        # connects (its own 3 tries take ~0.2 s) must not fail the start of a query. The settings
        # check only reads; the channel check's writes are idempotent (SADD, HSETNX, a CAS re-read)
        self.store.ride_out(check_nodes)
        self.store.ride_out(self.check_channels)
        return self

    # --- the record life cycle -------------------------------------------------
    def persist(self, records: Sequence[SemiDeserializedRecord]) -> int:
        """Persist source records (atomic per call, durable per mode); returns new count.

        A record whose chunk id pending records of other ids already use refuses its call
        (:class:`ChunkIdInUseError`); every shard is still tried, and the one error raised says
        which records were filed (``filed``, ``new``) and which were not (``refused``).
        """
        if self.num_shards == 1:
            return self.persistence.persist(records)
        groups = by_shard(records, lambda r: r.record_id.source_record_id, self.num_shards)
        new, first = 0, None
        filed: list[int] = []
        refused: list[int] = []
        for k, group in groups.items():
            try:
                new += self.shards[k].persistence.persist(group)
                filed += [r.record_id.source_record_id for r in group]
            except ChunkIdInUseError as exc:
                first = first or exc
                new, filed, refused = new + exc.new, filed + list(exc.filed), refused + list(exc.refused)
        if first is not None:
            raise persist_refused_error(self.store.keys, first.chunk, filed=filed, refused=refused, new=new)
        return new

    def xor(
        self,
        deltas: Mapping[int, int] | Iterable[tuple[int, int]] | DeltaArrays,
        *,
        token: str | FlushToken | None = None,
        fails: Mapping[int, str] | None = None,
        no_replay: Collection[int] = (),
    ) -> FlushResult:
        """Apply XOR deltas (and explicit fails; those in ``no_replay`` are dead-lettered without
        replays) at most once per token (per shard: each shard's call carries the same token)."""
        if self.num_shards == 1:
            return self.acker.xor(deltas, token=token, fails=fails, no_replay=no_replay)
        where = f"flush of source {self.store.keys.topology}/{self.store.keys.source}"
        try:
            delta_parts: Mapping[int, Any]
            # the whole flush is checked before any shard's part is sent: a bad id refuses it whole
            fail_parts = split_by_shard(checked_fails(fails, where), self.num_shards)
            if isinstance(deltas, DeltaArrays):
                delta_parts = deltas.by_shard(self.num_shards)
            else:
                pairs = list(deltas.items()) if isinstance(deltas, Mapping) else list(deltas)
                check_pairs(pairs, where)
                delta_parts = by_shard(pairs, lambda p: p[0], self.num_shards)
        except TypeError:  # not ids at all: the acker names the first bad one and applies nothing
            return self.acker.xor(deltas, token=token, fails=fails, no_replay=no_replay)
        result = FlushResult()
        for k in sorted(set(delta_parts) | set(fail_parts)):
            result = result.merge(self.shards[k].acker.xor(
                delta_parts.get(k, ()), token=token, fails=fail_parts.get(k), no_replay=no_replay))
        return result

    def ack(self, current_ids: Mapping[int, int], *, token: str | FlushToken | None = None) -> FlushResult:
        """Ack ``{source_record_id: current_record_id}`` (the last XOR of a record's life)."""
        return self.xor(current_ids, token=token)

    def complete(self, deltas: Mapping[int, int] | DeltaArrays) -> FlushResult:
        """Apply only the deltas that complete their record (no token needed; see AckerTable)."""
        if self.num_shards == 1:
            return self.acker.complete(deltas)
        try:
            parts: Mapping[int, Any] = (deltas.by_shard(self.num_shards) if isinstance(deltas, DeltaArrays)
                                        else split_by_shard(deltas, self.num_shards))
        except TypeError:
            return self.acker.complete(deltas)
        result = FlushResult()
        for k, part in parts.items():
            result = result.merge(self.shards[k].acker.complete(part))
        return result

    def pending_of(self, source_record_ids: Sequence[int]) -> list[bool]:
        """Per id: still pending? (read-only; see AckerTable.pending_of)"""
        if self.num_shards == 1:
            return self.acker.pending_of(source_record_ids)
        try:
            where = shard_ids(source_record_ids, self.num_shards)
        except TypeError:
            return self.acker.pending_of(source_record_ids)
        out = [False] * len(source_record_ids)
        for k in set(where):
            idx = [i for i, w in enumerate(where) if w == k]
            for i, got in zip(idx, self.shards[k].acker.pending_of([source_record_ids[i] for i in idx]), strict=True):
                out[i] = got
        return out

    def fail(self, source_record_ids: Iterable[int], reason: str = "failed explicitly") -> int:
        """Fail pending records now (explicit fail); returns how many were still pending.

        Raises :class:`InvalidIdError` (nothing failed) unless every id is a signed 64-bit integer.
        """
        try:
            fails = dict.fromkeys(source_record_ids, reason)
        except TypeError as exc:
            what = type(source_record_ids).__name__
            msg = f"fail on source {self.store.keys.prefix!r}: expected an iterable of source record ids, got {what}"
            raise InvalidIdError(msg) from exc
        return self.xor({}, fails=fails).failed

    def on_timeout(self, *, use_lease: bool = False) -> RotateResult:
        """Rotate the timeout buckets of every shard once; still-pending records of the expired ones fail."""
        results = [shard.buckets.rotate(use_lease=use_lease) for shard in self.shards]
        first = results[0]
        return RotateResult(any(r.rotated for r in results), first.gen,
                            [sid for r in results for sid in r.expired], max(r.steps for r in results))

    def persist_frames(self, frames: Sequence[bytes]) -> int:
        """Persist encoded frames (grouped into chunks by their ids); as :meth:`persist`."""
        if self.num_shards == 1:
            return self.persistence.persist_frames(frames)
        groups = by_shard(frames, lambda f: int.from_bytes(f[8:16], "big", signed=True), self.num_shards)
        return sum(self.shards[k].persistence.persist_frames(group) for k, group in groups.items())

    def persist_new(self, payloads: Sequence[bytes], key_hashes: Sequence[int], channels: Sequence[int]) -> int:
        """Persist new source records from their parts, under ids drawn here (ingest's hot path).

        The ids are drawn per channel in chunks (``ftlayer.records.chunks.assign_sids``), the chunks
        spread over the shards; a chunk id found in use is drawn again. For a retry after a
        lost reply, use :meth:`new_chunks` and :meth:`persist_chunks` and send the same chunks again.
        """
        return self.persist_chunks(self.new_chunks(payloads, key_hashes, channels))

    def new_chunks(
        self, payloads: Sequence[bytes], key_hashes: Sequence[int], channels: Sequence[int], *,
        columns: Any = None,
    ) -> list[PackedChunk]:
        """New source records as packed chunks under freshly drawn ids (see :meth:`persist_new`);
        with ``columns`` (the values as a ``pyarrow.RecordBatch``, row ``i`` for payload ``i``) each
        chunk keeps its records' rows after its frames (``ftlayer.records.chunk_columns``)."""
        chunks = encode_source_chunks(self.source_id, payloads, key_hashes, channels, num_shards=self.num_shards,
                                      among=self.ingest_shards)
        return chunks if columns is None else attach_columns(chunks, channels, columns, list(map(len, payloads)))

    def write_shards(self, worker: int, workers: int) -> list[int]:
        """Let this process file new records only in its share of the shards: ingest worker
        ``worker`` of ``workers`` takes the shards ``k`` with ``k % workers == worker`` (all of
        them if there are fewer shards than workers). Several processes that ingest into one
        source then write disjoint shards. Returns the shards taken."""
        own = [k for k in range(self.num_shards) if k % workers == worker] if workers > 0 else []
        self.ingest_shards = own or None
        return own or list(range(self.num_shards))

    def persist_chunks(self, chunks: list[PackedChunk]) -> int:
        """Persist chunks from :meth:`new_chunks`; chunk ids in use are drawn again (in place)."""
        if self.num_shards == 1:
            return self.persistence.persist_chunks(chunks, rekey=True)
        total = 0
        places = by_shard(range(len(chunks)), lambda i: sid_at(chunks[i].key, 0), self.num_shards)
        for k, idx in places.items():
            group = [chunks[i] for i in idx]
            total += self.shards[k].persistence.persist_chunks(group, rekey=True)
            for i, chunk in zip(idx, group, strict=True):
                chunks[i] = chunk  # a re-keyed chunk replaces the one the caller holds
        return total

    # --- the read side (the FT source) and the DataFrame path ---------------------------
    def check_channels(self) -> None:
        """Register the source's channel and shard counts, or check them against the recorded ones
        (see :meth:`open`)."""
        recorded = self.store.recorded_shards()
        if recorded is not None and recorded != self.num_shards:
            k = self.store.keys
            msg = (f"source {k.topology}/{k.source} was registered with num_shards = {recorded}, this run "
                   f"asks for {self.num_shards}: the shard count of a source is fixed (set num_shards = "
                   f"{recorded}, or drain the source and start another one)")
            raise ConfigError(msg)
        self.persistence.check_channels(shards=[s.store for s in self.shards])

    def read_channel(self, channel: int, *, shard: int = 0, **kw: Any) -> ChannelBatch:
        """One bounded read of a channel of one shard (``PersistenceLayer.read_channel``; same arguments)."""
        return self.shards[shard].persistence.read_channel(channel, **kw)

    def fail_unreadable(self, records: Sequence[tuple[int, str]]) -> int:
        """Dead-letter ``(source record id, reason)`` of records whose stored frame fails its checks
        (``PersistenceLayer.fail_unreadable``)."""
        groups = by_shard(records, lambda r: r[0], self.num_shards)
        return sum(self.shards[k].persistence.fail_unreadable(group) for k, group in groups.items())

    def record_batch_reads(self, tag: str, sids: Sequence[int], batch: tuple[str, int] | None = None,
                           token: str | None = None) -> None:
        """DataFrame path: file the ids a read task emitted for the micro-batch ``tag`` (and list the
        tag under Spark's ``batch`` = (query id, batch id), if known, and under the batch token
        ``token``, if given); see ``ftlayer.acker.batch_acks``."""
        # one shard (the default): no grouping, which is a Python step per id
        groups = {0: sids} if self.num_shards == 1 else by_shard(sids, lambda s: s, self.num_shards)
        for k, group in groups.items():
            BatchAcks(self.shards[k].store).record(tag, group, batch, token)

    def settle_batch(self, tag: str, mode: Literal["ack", "fail"], reason: str = "") -> int:
        """DataFrame path: ack (or fail) every still-pending record the batch ``tag`` emitted."""
        return sum(BatchAcks(shard.store).settle(tag, mode, reason) for shard in self.shards)

    def reset_timeout(self, source_record_ids: Sequence[int]) -> int:
        """Restart the timeouts of records still being processed (Storm's ``resetTimeout``): each
        still-pending one fails no earlier than ``timeout_s`` from now unless acked first
        (``TOUCH``, per chunk). Idempotent; returns the chunks re-filed."""
        ids = [check_id(sid, f"reset_timeout of {self.keys.topology}/{self.keys.source}") for sid in source_record_ids]
        total = 0
        for k, group in by_shard(ids, lambda s: s, self.num_shards).items():
            store = self.shards[k].store
            total += int(store.run(TOUCH, store.state_keys, [store.keys.prefix, pack_ids(group)]))
        return total

    # --- holds (ftlayer.acker.holds) -------------------------------------------------------
    def start_hold(self, tag: str, deadline_ms: int, started_ms: int) -> None:
        """Hold the micro-batch ``tag`` in every shard until ``deadline_ms``."""
        for shard in self.shards:
            Holds(shard.store).start(tag, deadline_ms, started_ms)

    def renew_hold(self, tag: str, deadline_ms: int, started_ms: int) -> bool:
        """Move a hold's deadline where it still exists; False if it was ended in every shard."""
        return any([Holds(shard.store).renew(tag, deadline_ms, started_ms) for shard in self.shards])

    def hold_chunks(self, tag: str, shard: int, chunk_ids: list[bytes], ttl_ms: int) -> None:
        """Add chunks of ``shard`` to the hold ``tag`` (started with :meth:`start_hold`)."""
        Holds(self.shards[shard].store).add(tag, chunk_ids, ttl_ms)

    def end_hold(self, tag: str) -> None:
        """End the hold of the micro-batch ``tag`` in every shard."""
        for shard in self.shards:
            Holds(shard.store).end(tag)

    def end_carries(self, keep: str | None = None) -> int:
        """End every carry hold (``ftlayer.acker.holds.CARRY_PREFIX``) of the source but ``keep``: a
        committed batch makes the carries of the batches before it needless. Returns how many."""
        ended = 0
        for shard in self.shards:
            holds = Holds(shard.store)
            for hold in holds.all():
                if hold.tag.startswith(CARRY_PREFIX) and hold.tag != keep:
                    holds.end(hold.tag)
                    ended += 1
        return ended

    def end_holds(self) -> int:
        """End every hold of the source (its one query stopped); returns how many there were."""
        return sum(Holds(shard.store).end_all() for shard in self.shards)

    def holds(self) -> list[Hold]:
        """Every hold of every shard (live or lapsed), for status and tests."""
        return [h for shard in self.shards for h in Holds(shard.store).all()]

    def replay_due(self) -> ReplayResult:
        """Replay (or dead-letter) every failure whose backoff has passed."""
        total = ReplayResult()
        for shard in self.shards:
            total = total.plus(shard.replayer.replay_all_due())
        return total

    # --- inspection ---------------------------------------------------------------
    def iter_pending(self, count: int = 100) -> Iterator[tuple[int, bytes]]:
        """``(source record id, frame)`` of every pending record of every shard (for inspection and
        tools; see ``PersistenceLayer.iter_pending``)."""
        for shard in self.shards:
            yield from shard.persistence.iter_pending(count)

    def pending_count(self) -> int:
        """Source records persisted and neither completed nor failed, over every shard."""
        if self.num_shards == 1:
            return self.acker.pending_count()
        pipe = self.client.pipeline(transaction=False)
        for shard in self.shards:
            pipe.get(shard.store.keys.live)
        return sum(int(v or 0) for v in pipe.execute())

    def stats(self) -> dict[str, int]:
        """Counters and live sizes, summed over the shards (``gen``: the highest bucket generation)."""
        out = self.store.stats()
        for shard in self.shards[1:]:
            more = shard.store.stats()
            for key, value in more.items():
                out[key] = max(out[key], value) if key == "gen" else out.get(key, 0) + value
        return out

    # --- dead letters ---------------------------------------------------------------
    def dead_letter(self, record: SemiDeserializedRecord, reason: str) -> str:
        """Set aside a record that never became pending (at most once per record); its entry id."""
        shard = shard_of(record.record_id.source_record_id, self.num_shards)
        return qualify(self.shards[shard].dead_letters.add(record, reason), shard, self.num_shards)

    def dead_letter_count(self) -> int:
        return sum(shard.dead_letters.count() for shard in self.shards)

    def list_dead_letters(self, count: int = 100, after: str = "-") -> list[DeadLetter]:
        """Up to ``count`` dead letters after entry id ``after``, oldest first (with more than one shard,
        ids name their shard: ``<stream id>@<shard>``, ordered by stream id, then shard)."""
        if self.num_shards == 1:
            return self.dead_letters.list(count=count, after=after)
        merged: list[DeadLetter] = []
        for k, shard in enumerate(self.shards):
            start, inclusive = shard_cursor(after, k)
            merged += [dataclasses.replace(d, entry_id=qualify(d.entry_id, k, self.num_shards))
                       for d in shard.dead_letters.list(count=count, after=start, inclusive=inclusive)]
        merged.sort(key=lambda d: entry_order(d.entry_id))
        return merged[:count]

    def get_dead_letter(self, entry_id: str) -> DeadLetter | None:
        """One dead letter by entry id (as :meth:`list_dead_letters` gives it), or None."""
        shard, plain = unqualify(entry_id, self.num_shards)
        got = self.shards[shard].dead_letters.get(plain)
        return None if got is None else dataclasses.replace(got, entry_id=qualify(got.entry_id, shard, self.num_shards))

    def purge_dead_letters(self, entry_ids: Sequence[str]) -> int:
        """Delete dead letters; returns how many existed."""
        groups = by_entry_shard(entry_ids, self.num_shards)
        return sum(self.shards[k].dead_letters.purge(ids) for k, ids in groups.items())

    def requeue_dead_letters(self, entry_ids: Sequence[str], num_channels: int | None = None) -> RequeueResult:
        """Persist dead letters again as new records (replay count 0), routed over ``num_channels``
        (default: the count the source recorded, else this layer's), each in its own shard."""
        n = num_channels or self.recorded_channels() or self.num_channels
        result = RequeueResult()
        for k, ids in by_entry_shard(entry_ids, self.num_shards).items():
            step = self.shards[k].dead_letters.requeue(ids, n)
            result = RequeueResult(
                result.requeued + step.requeued,
                result.missing + [qualify(e, k, self.num_shards) for e in step.missing],
                result.undecodable + [qualify(e, k, self.num_shards) for e in step.undecodable],
            )
        return result

    def recorded_channels(self) -> int | None:
        """The channel count the source's data was written with, or None if none is recorded."""
        return self.store.recorded_channels()

    # --- names and inspection ----------------------------------------------------------
    @property
    def keys(self) -> SourceKeys:
        """The source's key names (shard 0's; read-only inspection: status, benchmarks, chaos checks)."""
        return self.store.keys

    @property
    def client(self) -> redis.Redis:
        """The connection this layer uses (read-only inspection; state changes go through the methods)."""
        return self.store.client

    def trim_channel(self, channel: int) -> None:
        """Trim a channel stream of every shard to its tail (tools that persist without a query reading them)."""
        for shard in self.shards:
            shard.persistence.trim(channel, shard.persistence.channel_tail(channel))

    def disconnect(self) -> None:
        """Close this layer's pooled connections (they reopen on the next call)."""
        self.store.client.connection_pool.disconnect()

    def leftovers(self) -> list[str]:
        """Key suffixes still holding state that a drained source should not have (with more than
        one shard, prefixed by ``<shard>/``)."""
        if self.num_shards == 1:
            return self.store.leftover_keys()
        return sorted(f"{k}/{suffix}" for k, shard in enumerate(self.shards) for suffix in shard.store.leftover_keys())
