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

import redis

from ftlayer.acker_table import AckerTable, FlushResult
from ftlayer.config import FTConfig
from ftlayer.dead_letters import DeadLetters
from ftlayer.errors import InvalidIdError
from ftlayer.frames import SemiDeserializedRecord
from ftlayer.persistence import PersistenceLayer
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
        check_server_settings(self.store.client, self.config.durability, f"source {k.topology}/{k.source}")
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
        token: str | None = None,
        fails: Mapping[int, str] | None = None,
        no_replay: Collection[int] = (),
    ) -> FlushResult:
        """Apply XOR deltas (and explicit fails; those in ``no_replay`` are dead-lettered without
        replays) at most once per token."""
        return self.acker.xor(deltas, token=token, fails=fails, no_replay=no_replay)

    def ack(self, current_ids: Mapping[int, int], *, token: str | None = None) -> FlushResult:
        """Ack ``{source_record_id: current_record_id}`` (the last XOR of a record's life)."""
        return self.acker.ack(current_ids, token=token)

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

    def replay_due(self) -> ReplayResult:
        """Replay (or dead-letter) every failure whose backoff has passed."""
        return self.replayer.replay_all_due()

    # --- inspection ---------------------------------------------------------------
    def pending_count(self) -> int:
        return self.acker.pending_count()

    def stats(self) -> dict[str, int]:
        return self.store.stats()

    def leftovers(self) -> list[str]:
        """Key suffixes still holding state that a drained source should not have."""
        return self.store.leftover_keys()
