"""Where ingest puts its batches: the :class:`BatchDestination` protocol and FT on's :class:`PersistDestination`.

FT on, a batch becomes chunks of frames under fresh ids and is persisted through the FT layer
(:class:`PersistDestination`); FT off, ``runtime.driver.feed.FeedDestination`` puts it in an
in-driver feed. Key hashing and channel routing happen before, in the ingest loop
(:mod:`runtime.driver.ingest`), the same for both. Retries: the ingest loop retries a failed
``put`` or ``reject`` with the same arguments; :class:`PersistDestination` then reuses the chunks
(same ids) or the dead letter's record it built for them, so a call that reached the server
before its reply was lost files nothing twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ftlayer.errors import SerializationError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.chunks import PackedChunk
from ftlayer.records.frames import SemiDeserializedRecord
from ftlayer.status.ingest_state import write_state
from serialization.serializers import make_record

__all__ = ["MAX_REPR_CHARS", "BatchDestination", "PersistDestination"]

MAX_REPR_CHARS = 4096  # a dead-lettered value that cannot be packed is kept as its repr, this long at most


class BatchDestination(Protocol):
    """Where an :class:`Ingestor` puts its batches (see the module notes)."""

    num_channels: int
    batch_size: int  # most records per put()
    max_pending: int  # ingest waits while pending_count() is at least this
    label: str  # for logs

    def put(self, payloads: list[bytes], hashes: Sequence[int], channels: Sequence[int], columns: Any = None) -> None:
        """Make a batch of packed values visible to the query (may raise FTLayerError: retried with backoff).
        ``hashes`` and ``channels`` are lists or numpy ``int64`` arrays; ``columns``, the values as a
        record batch when a schema check decoded them, else None (``runtime.driver.ingest_batch.prepare``)."""
        ...

    def reject(self, value: Any, reason: str) -> None:
        """Set aside a record that cannot be processed (its key selector raised, or it cannot be packed)."""
        ...

    def pending_count(self) -> int:
        """Records put and not yet done with (backpressure)."""
        ...


class PersistDestination:
    """FT on: give each record a RecordId and persist the batch through the FT layer."""

    def __init__(self, layer: FTLayer) -> None:
        self.layer = layer
        self.num_channels = layer.num_channels
        # the loss window of a source without ack (module notes): flush_batch_size, or less
        self.batch_size = min(layer.config.flush_batch_size, layer.config.ingest_batch_records)
        self.max_pending = layer.config.max_pending
        self.label = layer.keys.prefix
        # replicated modes: a wait that is not confirmed (a failover, a replica catching up) is
        # transient, and a retry of the same frames is safe (see put)
        self.retry_durability = layer.config.durability.startswith("replicated")
        self._rejecting: tuple[Any, str, SemiDeserializedRecord] | None = None  # a reject being retried
        self._putting: tuple[list[bytes], list[PackedChunk]] | None = None  # a batch being retried

    def put(self, payloads: list[bytes], hashes: Sequence[int], channels: Sequence[int], columns: Any = None) -> None:
        # hot path: chunks straight from the parts; channels come from the source's partitioner.
        # Ingest retries a failed put with the same payloads list: reuse its chunks (same ids), so
        # a call that reached the server before its reply was lost files nothing twice (its token),
        # and its durability wait covers them again (PERSIST always writes its counter, so the
        # wait's replication offset is past the first call's writes).
        held = self._putting
        if held is not None and held[0] is payloads:
            chunks = held[1]
        else:
            chunks = self.layer.new_chunks(payloads, hashes, channels, columns=columns)
            self._putting = (payloads, chunks)
        self.layer.persist_chunks(chunks)  # re-keys in place a chunk whose id is in use
        self._putting = None

    def reject(self, value: Any, reason: str) -> None:
        # Ingest retries a failed reject with the same value: reuse the record built for it, so
        # the dead letter's guard (its source record id) matches and nothing is added twice.
        held = self._rejecting
        if held is not None and held[0] is value and held[1] == reason:
            record = held[2]
        else:
            try:
                record = make_record(self.layer, value, channel=0)
            except SerializationError:  # keep what can be kept: the value's repr
                record = make_record(self.layer, repr(value)[:MAX_REPR_CHARS], channel=0)
            self._rejecting = (value, reason, record)
        self.layer.dead_letter(record, reason)
        self._rejecting = None

    def pending_count(self) -> int:
        return self.layer.pending_count()

    def report_state(self, state: str, detail: str) -> None:
        """Record the ingest state for ``ftlayer status`` (:mod:`ftlayer.status.ingest_state`)."""
        write_state(self.layer.store, state, detail)
