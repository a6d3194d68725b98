"""FTLayer: the facade over one source's fault-tolerance state in Redis.

It bundles the parts of the original design's FTLayer for one source:
persistence (``persist``), the AckerTable (``xor``, ``ack``), explicit failing
(``fail``), timeouts (``on_timeout``: rotate the bucket map) and the replayer
(``replay_due``), plus dead letters and counters. Both kinds of failure end in
the replayer; a late ack or XOR for a failed id does nothing.

Picklable: executors receive it inside closures and reconnect by URL.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Literal

import redis

from ftlayer.acker_table import AckerTable, FlushResult
from ftlayer.batch_acks import BatchAcks
from ftlayer.chunks import PackedChunk, encode_source_chunks
from ftlayer.config import FTConfig
from ftlayer.dead_letters import DeadLetter, DeadLetters, RequeueResult
from ftlayer.errors import InvalidIdError
from ftlayer.flush_tokens import FlushToken
from ftlayer.frames import SemiDeserializedRecord
from ftlayer.keys import SourceKeys
from ftlayer.persistence import ChannelBatch, PersistenceLayer
from ftlayer.replayer import Replayer, ReplayResult, ReplayRouter
from ftlayer.rotating_map import ExpiredCallback, RotateResult, RotatingBucketMap
from ftlayer.server_settings import check_server_settings
from ftlayer.store import Clock, SourceStore

__all__ = ["FTLayer"]


class FTLayer:
    """Fault-tolerance state of one source of one topology."""

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
        # outage_budget_s > 0 (Spark tasks): commands wait out a Redis outage (ftlayer.outage)
        self.store = SourceStore(config, topology, source, client=client, clock=clock,
                                 outage_budget_s=outage_budget_s)
        self.acker = AckerTable(self.store)
        self.persistence = PersistenceLayer(self.store, self.num_channels)
        self.buckets = RotatingBucketMap(self.store, owner=owner, on_expired=on_expired)
        self.replayer = Replayer(self.store, self.num_channels, replay_router)
        self.dead_letters = DeadLetters(self.store)

    def open(self) -> FTLayer:
        """Check the server's settings, then register the source or check its channel count.

        Raises :class:`EvictionPolicyError` if the server may evict keys, and in
        'waitaof' mode :class:`DurabilityError` if its AOF cannot confirm an fsync
        (see ``ftlayer.server_settings``); nothing is written then.
        """
        k = self.store.keys
        check_server_settings(self.store.node_client(), self.config.durability, f"source {k.topology}/{k.source}")
        self.persistence.check_channels()
        return self

    # --- the record life cycle -------------------------------------------------
    def persist(self, records: Sequence[SemiDeserializedRecord]) -> int:
        """Persist source records (atomic per batch, durable per mode); returns new count."""
        return self.persistence.persist(records)

    def xor(
        self,
        deltas: Mapping[int, int] | Iterable[tuple[int, int]],
        *,
        token: str | FlushToken | None = None,
        fails: Mapping[int, str] | None = None,
        no_replay: Collection[int] = (),
    ) -> FlushResult:
        """Apply XOR deltas (and explicit fails; those in ``no_replay`` are dead-lettered without
        replays) at most once per token."""
        return self.acker.xor(deltas, token=token, fails=fails, no_replay=no_replay)

    def ack(self, current_ids: Mapping[int, int], *, token: str | FlushToken | None = None) -> FlushResult:
        """Ack ``{source_record_id: current_record_id}`` (the last XOR of a record's life)."""
        return self.acker.ack(current_ids, token=token)

    def complete(self, deltas: Mapping[int, int]) -> FlushResult:
        """Apply only the deltas that complete their record (no token needed; see AckerTable)."""
        return self.acker.complete(deltas)

    def pending_of(self, source_record_ids: Sequence[int]) -> list[bool]:
        """Per id: still pending? (read-only; see AckerTable.pending_of)"""
        return self.acker.pending_of(source_record_ids)

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
        return self.acker.xor({}, fails=fails).failed

    def on_timeout(self, *, use_lease: bool = False) -> RotateResult:
        """Rotate the timeout buckets once; still-pending records of the expired one fail."""
        return self.buckets.rotate(use_lease=use_lease)

    def persist_frames(self, frames: Sequence[bytes]) -> int:
        """Persist encoded frames (grouped into chunks by their ids); as :meth:`persist`."""
        return self.persistence.persist_frames(frames)

    def persist_new(self, payloads: Sequence[bytes], key_hashes: Sequence[int], channels: Sequence[int]) -> int:
        """Persist new source records from their parts, under ids drawn here (ingest's hot path).

        The ids are drawn per channel in chunks (``ftlayer.chunks.assign_sids``); a chunk id
        found in use is drawn again. For a retry after a lost reply, use :meth:`new_chunks`
        and :meth:`persist_chunks` and send the same chunks again.
        """
        return self.persist_chunks(self.new_chunks(payloads, key_hashes, channels))

    def new_chunks(
        self, payloads: Sequence[bytes], key_hashes: Sequence[int], channels: Sequence[int],
    ) -> list[PackedChunk]:
        """New source records as packed chunks under freshly drawn ids (see :meth:`persist_new`)."""
        return encode_source_chunks(self.source_id, payloads, key_hashes, channels)

    def persist_chunks(self, chunks: list[PackedChunk]) -> int:
        """Persist chunks from :meth:`new_chunks`; chunk ids in use are drawn again (in place)."""
        return self.persistence.persist_chunks(chunks, rekey=True)

    # --- the read side (the FT source) and the DataFrame path ---------------------------
    def check_channels(self) -> None:
        """Register the source's channel count, or check it against the recorded one (see :meth:`open`)."""
        self.persistence.check_channels()

    def read_channel(self, channel: int, **kw: Any) -> ChannelBatch:
        """One bounded read of a channel (``PersistenceLayer.read_channel``; same arguments)."""
        return self.persistence.read_channel(channel, **kw)

    def fail_unreadable(self, records: Sequence[tuple[int, str]]) -> int:
        """Dead-letter ``(source record id, reason)`` of records whose stored frame fails its checks
        (``PersistenceLayer.fail_unreadable``)."""
        return self.persistence.fail_unreadable(records)

    def record_batch_reads(self, query_id: str, batch_id: int, sids: Sequence[int]) -> None:
        """DataFrame path: file the ids a read task emitted for ``batch_id`` of ``query_id``."""
        BatchAcks(self.store).record(query_id, batch_id, sids)

    def settle_batch(self, query_id: str, batch_id: int, mode: Literal["ack", "fail"], reason: str = "") -> int:
        """DataFrame path: ack (or fail) every still-pending record the batch's read tasks emitted."""
        return BatchAcks(self.store).settle(query_id, batch_id, mode, reason)

    def replay_due(self) -> ReplayResult:
        """Replay (or dead-letter) every failure whose backoff has passed."""
        return self.replayer.replay_all_due()

    # --- inspection ---------------------------------------------------------------
    def pending_count(self) -> int:
        return self.acker.pending_count()

    def stats(self) -> dict[str, int]:
        return self.store.stats()

    # --- dead letters ---------------------------------------------------------------
    def dead_letter(self, record: SemiDeserializedRecord, reason: str) -> str:
        """Set aside a record that never became pending (at most once per record); its entry id."""
        return self.dead_letters.add(record, reason)

    def dead_letter_count(self) -> int:
        return self.dead_letters.count()

    def list_dead_letters(self, count: int = 100, after: str = "-") -> list[DeadLetter]:
        """Up to ``count`` dead letters after entry id ``after``, oldest first."""
        return self.dead_letters.list(count=count, after=after)

    def get_dead_letter(self, entry_id: str) -> DeadLetter | None:
        return self.dead_letters.get(entry_id)

    def purge_dead_letters(self, entry_ids: Sequence[str]) -> int:
        """Delete dead letters; returns how many existed."""
        return self.dead_letters.purge(entry_ids)

    def requeue_dead_letters(self, entry_ids: Sequence[str], num_channels: int | None = None) -> RequeueResult:
        """Persist dead letters again as new records (replay count 0), routed over ``num_channels``
        (default: the count the source recorded, else this layer's)."""
        n = num_channels or self.recorded_channels() or self.num_channels
        return self.dead_letters.requeue(entry_ids, n)

    def recorded_channels(self) -> int | None:
        """The channel count the source's data was written with, or None if none is recorded."""
        return self.store.recorded_channels()

    # --- names and inspection ----------------------------------------------------------
    @property
    def keys(self) -> SourceKeys:
        """The source's key names (read-only inspection: status, benchmarks, chaos checks)."""
        return self.store.keys

    @property
    def client(self) -> redis.Redis:
        """The connection this layer uses (read-only inspection; state changes go through the methods)."""
        return self.store.client

    def trim_channel(self, channel: int) -> None:
        """Trim a channel stream to its tail (tools that persist without a query reading them)."""
        self.persistence.trim(channel, self.persistence.channel_tail(channel))

    def disconnect(self) -> None:
        """Close this layer's pooled connections (they reopen on the next call)."""
        self.store.client.connection_pool.disconnect()

    def leftovers(self) -> list[str]:
        """Key suffixes still holding state that a drained source should not have."""
        return self.store.leftover_keys()
