"""Ingest: run a user source on the driver and persist its records before Spark sees them.

A user source is plain Python, one of:

- an iterable or iterator of records (ends when exhausted);
- a callable returning a record, an iterable of records, or None (nothing now);
  raising StopIteration ends it;
- an object with ``open()``, ``poll()`` (an iterable of records, possibly
  empty) and ``close()``; ``poll`` returning None ends it.

The :class:`Ingestor` thread pulls records, gives each a RecordId and key hash
(the source's key selector), routes it to a channel (fields by that key, else
round-robin) and persists it in batches of at most ``flush_batch_size``,
waiting at most ``linger_s`` to fill a batch. A record becomes visible to
Spark only after its batch is persisted. Backpressure: while ``max_pending``
records are pending, the thread waits, so a fast source cannot flood Redis.

Contract on errors: an exception from the user source stops ingest and is kept
in ``Ingestor.error`` (the query keeps running and drains what was persisted);
a :class:`~ftlayer.errors.DurabilityError` (a WAITAOF that timed out in
'waitaof' mode: the batch reached the server, its fsync is unconfirmed) stops
ingest too and is kept in ``Ingestor.error``, never retried, since a retry
would persist the batch again under new ids; any other Redis error is retried
with backoff, holding the batch, so nothing read from
the source is dropped while the process lives, unless ``stop()`` is called
while Redis is unreachable: the batch held then (at most ``flush_batch_size``
records, never reported as persisted) is abandoned, logged and counted in
``Ingestor.abandoned``. A record whose key selector
raises, or whose value cannot be serialized, is never persisted for
processing: it is handed to the destination's ``reject`` (FT on: a dead letter
with the reason, ``ftlayer dlq`` shows it; FT off: dropped, logged and counted)
and ingest goes on with the next record.

Where batches go is pluggable: an :class:`FTLayer` (FT on) is wrapped in a
:class:`PersistDestination`; with FT off the topology passes a
``runtime.driver.feed.FeedDestination`` (an in-memory feed, no Redis). Any object with
the :class:`BatchDestination` attributes works; key hashing and channel routing
stay here, the same for both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from ftlayer.errors import DurabilityError, FTLayerError, SerializationError
from ftlayer.frames import SemiDeserializedRecord, encode_source_frames
from ftlayer.ids import new_ids
from ftlayer.keyhash import NO_KEY_HASH, key_hash
from ftlayer.layer import FTLayer
from partitioners.factory import partitioner_for, source_strategy
from serialization.payload import pack_payload
from serialization.serializers import make_record

log = logging.getLogger(__name__)

KeySelector = Callable[[Any], Any]
MAX_REPR_CHARS = 4096


def source_iterator(source: Any, stop: threading.Event) -> Iterator[Any]:
    """Adapt any supported user source to an iterator that yields records or None (idle)."""
    if hasattr(source, "poll"):
        if hasattr(source, "open"):
            source.open()
        try:
            while not stop.is_set():
                got = source.poll()
                if got is None:
                    return
                produced = False
                for rec in got:
                    produced = True
                    yield rec
                if not produced:
                    yield None
        finally:
            if hasattr(source, "close"):
                source.close()
    elif callable(source) and not isinstance(source, Iterable):
        while not stop.is_set():
            try:
                got = source()
            except StopIteration:
                return
            if got is None:
                yield None
            elif isinstance(got, (list, tuple)):
                yield from got
            else:
                yield got
    else:
        yield from source


class BatchDestination(Protocol):
    """Where an :class:`Ingestor` puts its batches (see the module notes)."""

    num_channels: int
    batch_size: int  # most records per put()
    max_pending: int  # ingest waits while pending_count() is at least this
    label: str  # for logs

    def put(self, payloads: list[bytes], hashes: list[int], channels: list[int]) -> None:
        """Make a batch of packed values visible to the query (may raise FTLayerError: retried with backoff)."""
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
        self.batch_size = layer.config.flush_batch_size
        self.max_pending = layer.config.max_pending
        self.label = layer.store.keys.prefix
        self._rejecting: tuple[Any, str, SemiDeserializedRecord] | None = None  # a reject being retried

    def put(self, payloads: list[bytes], hashes: list[int], channels: list[int]) -> None:
        # hot path: frames straight from the parts; channels come from the source's partitioner
        frames = encode_source_frames(self.layer.source_id, new_ids(2 * len(payloads)), hashes, payloads, channels)
        self.layer.persistence.persist_frames(frames)

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
        self.layer.dead_letters.add(record, reason)
        self._rejecting = None

    def pending_count(self) -> int:
        return self.layer.pending_count()


class Ingestor:
    """Driver-side thread that persists one source's records (see module contract)."""

    def __init__(
        self,
        layer: FTLayer | BatchDestination,
        source: Any,
        *,
        key: KeySelector | None = None,
        partitioning: str | None = None,
        linger_s: float = 0.02,
    ) -> None:
        dest: BatchDestination = PersistDestination(layer) if isinstance(layer, FTLayer) else layer
        self.destination = dest
        self.source = source
        self.key = key
        self.linger_s = linger_s
        strategy = partitioning or source_strategy(key is not None)  # as the FT service replays
        self.partitioner = partitioner_for(strategy, dest.num_channels)
        self.batch_size = dest.batch_size
        self.max_pending = dest.max_pending
        self.ingested = 0
        self.rejected = 0  # records set aside by reject() (key selector raised, not serializable)
        self.abandoned = 0  # records read but never persisted because stop() came during an outage
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def done(self) -> bool:
        """True once the source ended (or failed) and everything read was persisted."""
        return self._done.is_set()

    def _prepare(self, values: list[Any]) -> tuple[list[bytes], list[int], list[int]]:
        """Packed value, key hash and channel of every value (fields by key, else round-robin).

        A value whose key selector raises or that cannot be packed is rejected
        (see the module contract) and left out.
        """
        select, key = self.partitioner.select, self.key
        try:  # the fast path: no per-value error handling
            payloads = [pack_payload(v) for v in values]
            hashes = [NO_KEY_HASH] * len(values) if key is None else [key_hash(key(v)) for v in values]
        except Exception:  # a key selector or value failed: sort the batch out one by one
            payloads, hashes = [], []
            for value in values:
                try:
                    packed = pack_payload(value)
                    h = NO_KEY_HASH if key is None else key_hash(key(value))
                except Exception as exc:
                    self._reject(value, exc)
                    continue
                payloads.append(packed)
                hashes.append(h)
        return payloads, hashes, [select(key_hash=h)[0] for h in hashes]

    def _reject(self, value: Any, exc: BaseException) -> None:
        what = "cannot be serialized" if isinstance(exc, SerializationError) else "key selector raised"
        reason = f"ingest: {what}: {type(exc).__name__}: {exc}"
        self.rejected += 1
        log.warning("record rejected by ingest of %s (%s)", self.destination.label, reason)
        self._retrying("dead-lettering a rejected record", lambda: self.destination.reject(value, reason))

    def _retrying(self, what: str, call: Callable[[], None]) -> None:
        """``call()`` until it succeeds: an FTLayerError (Redis down) is retried with backoff until stop()."""
        delay = 0.05
        while True:
            try:
                call()
            except DurabilityError:  # the write reached the server; a retry would persist it again
                raise
            except FTLayerError:
                if self._stop.is_set():
                    raise
                log.exception("%s failed; retrying in %.2f s", what, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            else:
                return

    def _persist(self, values: list[Any]) -> None:
        payloads, hashes, channels = self._prepare(values)
        if payloads:
            self._retrying("persist", lambda: self.destination.put(payloads, hashes, channels))
            self.ingested += len(payloads)

    def _wait_for_room(self) -> None:
        while not self._stop.is_set():
            try:
                if self.destination.pending_count() < self.max_pending:
                    return
            except FTLayerError:
                pass
            time.sleep(0.02)

    def run(self) -> None:
        """Ingest until the source ends or ``stop()``; usable without the thread (tests)."""
        batch: list[Any] = []
        started = time.monotonic()
        try:
            for value in source_iterator(self.source, self._stop):
                if value is not None:
                    if not batch:
                        started = time.monotonic()
                    batch.append(value)
                full = len(batch) >= self.batch_size
                if batch and (full or value is None or time.monotonic() - started >= self.linger_s):
                    self._wait_for_room()
                    self._persist(batch)
                    batch = []
                if value is None:
                    time.sleep(self.linger_s)
                if self._stop.is_set():
                    break
        except DurabilityError as exc:
            self._durability_failed(exc)
            batch = []  # it reached the server; persisting it again would duplicate it under new ids
        except Exception as exc:  # a broken user source stops ingest, not the query
            self.error = exc
            log.exception("user source of %s failed; ingest stopped", self.destination.label)
        finally:
            if batch:
                try:
                    self._persist(batch)
                except DurabilityError as exc:
                    self._durability_failed(exc)
                except FTLayerError:  # stop() during an outage: see the module contract
                    self.abandoned += len(batch)
                    log.exception("ingest of %s stopped while Redis was unreachable: %d records read from the "
                              "source were never persisted", self.destination.label, len(batch))
            self._done.set()

    def _durability_failed(self, exc: DurabilityError) -> None:
        """'waitaof' unconfirmed: stop and report, never loop (see the module contract)."""
        self.error = self.error or exc
        log.error("ingest of %s stopped: %s", self.destination.label, exc)

    def start(self) -> Ingestor:
        self._thread = threading.Thread(target=self.run, name="ftlayer-ingest", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
