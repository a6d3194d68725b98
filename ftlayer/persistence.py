"""PersistenceLayer: durable copies of source records, filed for timeout and routing.

``persist(records)`` is one atomic server-side call per chunk of at most
``flush_batch_size`` records (and at most ``script_bounds.CALL_MAX_RECORDS``
records and ``CALL_MAX_BYTES`` bytes, so no call holds the server long). For
each record not yet known it:

1. stores the frame by source_record_id (``pend``), with ack value = the
   record's current id, since the source emits the record itself once;
2. files the id in the current timeout bucket;
3. appends the id to the stream of the record's channel.

It returns only after the write is durable to the degree the durability mode
promises ('waitaof' waits for the AOF fsync), and only then may the record be
emitted. Persisting the same id again is a no-op, so a client retry is safe.

Channels are read back with :meth:`read_channel` (by stream-id range, so a
re-run micro-batch reads the same records minus those completed since) and
trimmed with :meth:`trim` once Spark has committed a range. A read call is
bounded by records, bytes and time (``ftlayer.script_bounds``) and returns a
cursor (stream id and position inside that entry); :meth:`iter_channel` loops
over the calls and reads a range whole, each record once, in order.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import xxhash

from ftlayer.acker_table import AckerTable
from ftlayer.channels import check_channel_count
from ftlayer.errors import ChannelCountMismatchError, FrameError, InvalidArgumentError
from ftlayer.frames import (
    NO_CHANNEL,
    OFFSET_SOURCE_RECORD_ID,
    PEND_PREFIX,
    SemiDeserializedRecord,
    SemiDeserializedSerializer,
)
from ftlayer.layout import ensure_layout
from ftlayer.script_bounds import (
    READ_MAX_RECORDS,
    SCRIPT_BUDGET_MS,
    SCRIPT_MAX_BYTES,
    TRIM_MAX_RECORDS,
    split_call,
)
from ftlayer.store import SourceStore

_SERIALIZER = SemiDeserializedSerializer()
log = logging.getLogger(__name__)




def persist_token(store: SourceStore, blob: bytes) -> str:
    """The token key of a PERSIST call: ``tok:p:<xxh64 of its frames>`` (the frames carry the
    records' ids, so only the same call, retried, has the same token; about 0.1 ms per MB)."""
    return store.keys.token(f"p:{xxhash.xxh64_hexdigest(blob)}")


def _stream_pos(entry_id: str) -> tuple[float, float]:
    """Sort key of a stream id; '-' and '+' are the ends."""
    if entry_id == "-":
        return (float("-inf"), 0.0)
    if entry_id == "+":
        return (float("inf"), 0.0)
    ms, _, seq = entry_id.partition("-")
    return (float(ms), float(seq or 0))


@dataclass(frozen=True)
class ChannelBatch:
    """Records read from one channel, still serialized, and the cursor where the read stopped.

    ``values`` are the records' ``pend`` values: each frame starts at byte
    :data:`PEND_PREFIX` (``runtime.spark.arrow_codec.frames_to_record_batch`` reads
    them in place with ``prefix=PEND_PREFIX``). The cursor is ``last_id`` (the
    last stream entry read, '' if none) and ``skip``: 0 if that entry was read
    whole, else how many of its ids were read (pass both back to go on).
    """

    channel: int
    last_id: str
    values: list[bytes]
    skip: int = 0

    @property
    def frames(self) -> list[bytes]:
        """The frames alone (a copy of each)."""
        return [v[PEND_PREFIX:] for v in self.values]

    def records(self) -> list[SemiDeserializedRecord]:
        """The frames decoded (payloads stay msgpack bytes)."""
        return [_SERIALIZER.decode(f) for f in self.frames]


class PersistenceLayer:
    """Persist, read and trim one source's records (see module contract)."""

    def __init__(self, store: SourceStore, num_channels: int) -> None:
        self.store = store
        self.num_channels = num_channels

    def check_channels(self) -> None:
        """Register a new source, or match the channel count its data was written with.

        A different count is taken over only if the source is drained (nothing
        pending, nothing waiting for replay; dead letters do not count): the
        recorded count is changed and the old channel streams are emptied, in one
        server-side step. Otherwise :class:`ChannelCountMismatchError` names both
        counts and what is still in flight. Run this only once the query that
        used the old count has stopped; Spark needs a new checkpoint, since a
        checkpoint's offsets name the old channels.
        """
        k = self.store.keys
        ensure_layout(self.store)  # a source written by an older ftlayer
        for _ in range(3):  # a concurrent change of the recorded count: read it again
            recorded = self.store.recorded_channels()
            if recorded is None:
                self.store.register(self.num_channels)
                return
            if recorded == self.num_channels:
                return
            keys = [k.meta, k.pend, k.failed, *(k.channel(c) for c in range(recorded))]
            reply = self.store.run("RESCALE", keys, [recorded, self.num_channels])
            if int(reply[0]) == 1:
                log.warning("source %s/%s: channel count changed from %d to %d (the source was drained)",
                            k.topology, k.source, recorded, self.num_channels)
                return
            if int(reply[0]) == 0:
                check_channel_count(recorded, self.num_channels, f"{k.topology}/{k.source}",
                                    pending=int(reply[1]), failed=int(reply[2]))
        msg = f"source {k.topology}/{k.source}: its recorded channel count keeps changing; is another driver running?"
        raise ChannelCountMismatchError(msg)

    def persist(self, records: Sequence[SemiDeserializedRecord]) -> int:
        """Persist records atomically per chunk; returns how many were new. See module contract.

        Every record is checked and encoded before anything is sent: an item that is
        no :class:`SemiDeserializedRecord` raises :class:`InvalidArgumentError`, a
        channel out of range :class:`FrameError`, and nothing is written.
        """
        for i, rec in enumerate(records):
            if not isinstance(rec, SemiDeserializedRecord):
                msg = (
                    f"persist on source {self.store.keys.prefix!r}: record {i} is a {type(rec).__name__}, "
                    "expected a SemiDeserializedRecord (see FTLayer.make_record); nothing was persisted"
                )
                raise InvalidArgumentError(msg)
            if rec.channel is None or rec.channel == NO_CHANNEL or not 0 <= rec.channel < self.num_channels:
                msg = (
                    f"record {rec.record_id.source_record_id} of source {rec.source_id} has channel "
                    f"{rec.channel}; persist needs a channel in 0..{self.num_channels - 1}"
                )
                raise FrameError(msg)
        return self.persist_frames([_SERIALIZER.encode(r) for r in records])

    def persist_frames(self, frames: Sequence[bytes]) -> int:
        """Persist already-encoded frames (the hot path: no re-encoding).

        Idempotent: calling it again with the same frames files nothing twice, even once
        the first call's records were processed and acked (each server-side call carries
        a token named after a hash of its frames; see PERSIST), unless a failover
        lost the first call's writes, which are then filed again.
        """
        size = self.store.config.flush_batch_size
        channels = self.store.channel_keys(self.num_channels)
        ttl_ms = self.store.token_ttl_ms()
        blobs = [b"".join(part) for i in range(0, len(frames), size) for part in split_call(frames[i : i + size])]
        calls = [
            ("PERSIST", [*self.store.state_keys, persist_token(self.store, blob), *channels],
             [self.store.keys.prefix, self.num_channels, blob, ttl_ms])
            for blob in blobs
        ]
        # in the waiting durability modes, the calls and their wait share one connection
        return sum(int(count) for count, _gen in self.store.run_durable(calls))

    def read_channel(
        self,
        channel: int,
        after: str = "-",
        until: str = "+",
        max_entries: int = 10_000,
        *,
        skip: int = 0,
        max_records: int = READ_MAX_RECORDS,
        max_bytes: int = SCRIPT_MAX_BYTES,
    ) -> ChannelBatch:
        """One bounded read of the still-pending records with stream ids in (after, until].

        With ``skip`` > 0 the read starts inside entry ``after``, at its
        ``skip``-th id (a cursor returned by the previous call). At most
        ``max_entries`` entries, ``max_records`` ids examined and about
        ``max_bytes`` of values per call (at least one id); the returned cursor
        says where it stopped. Use :meth:`iter_channel` to read a whole range.
        """
        k = self.store.keys
        reply = self.store.run(
            "READ_CHANNEL",
            [k.channel(channel), k.pend, k.read_marks],
            [after, skip, until, max_entries, max_records, max_bytes, SCRIPT_BUDGET_MS, channel],
        )
        last = reply[0].decode() if reply and reply[0] else ""
        return ChannelBatch(channel, last, list(reply[2:]), int(reply[1]))

    def iter_channel(
        self,
        channel: int,
        after: str = "-",
        until: str = "+",
        *,
        max_entries: int = 10_000,
        max_records: int = READ_MAX_RECORDS,
        max_bytes: int = SCRIPT_MAX_BYTES,
    ) -> Iterator[ChannelBatch]:
        """Every still-pending record of (after, until], in stream order, each once, in bounded calls.

        Yields one batch per server-side call (batches may be empty when a
        chunk held only completed records).
        """
        skip = 0
        while True:
            batch = self.read_channel(
                channel, after, until, max_entries, skip=skip, max_records=max_records, max_bytes=max_bytes
            )
            yield batch
            if not batch.last_id or (not batch.skip and _stream_pos(batch.last_id) >= _stream_pos(until)):
                return
            after, skip = batch.last_id, batch.skip

    def fail_unreadable(self, bad: Sequence[tuple[bytes, str]]) -> int:
        """Fail the records whose stored frame a reader could not decode, for the dead-letter queue.

        ``bad`` holds ``(pend value as read, reason)``. Each is failed with its
        reason and without replays (a replay would re-read the same bytes), so
        the replayer dead-letters it at once; the rest of the channel goes on.
        A value is failed only if it is still exactly the ``pend`` entry of the
        id its frame header names: a header damaged so that it names another
        id fails nothing, and that record times out and is dead-lettered as
        undecodable. Idempotent (a record no longer pending is skipped).
        Returns how many records were failed.
        """
        start = PEND_PREFIX + OFFSET_SOURCE_RECORD_ID
        named = [(v[start : start + 8], v, reason) for v, reason in bad if len(v) >= start + 8]
        if not named:
            return 0
        stored: list[bytes | None] = self.store.client.hmget(self.store.keys.pend, [n[0] for n in named])  # type: ignore[assignment]
        fails = {
            struct.unpack(">q", sid)[0]: reason
            for (sid, value, reason), now in zip(named, stored, strict=True)
            if now == value
        }
        if not fails:
            return 0
        return AckerTable(self.store).xor({}, fails=fails, no_replay=set(fails)).failed

    def channel_tail(self, channel: int) -> str:
        """Id of the newest entry of a channel stream ('0-0' if it never had one)."""
        try:
            info = self.store.client.xinfo_stream(self.store.keys.channel(channel))
        except Exception:  # no such key yet
            return "0-0"
        last = info.get("last-generated-id", b"0-0")
        return last.decode() if isinstance(last, bytes) else str(last)

    def trim_done(self, max_entries: int = 256, max_calls: int = 16) -> int:
        """Drop each channel's head entries whose records are all done; returns entries removed.

        Called by the FT service, so a drained source leaves empty channel
        streams even when no later micro-batch commits the last range. Each
        call examines at most ``max_entries`` entries and ``TRIM_MAX_RECORDS``
        ids (about 20 ms); up to ``max_calls`` calls per channel, the rest is
        left for the next time.
        """
        k = self.store.keys
        removed = 0
        for c in range(self.num_channels):
            for _ in range(max_calls):
                count, more = self.store.run(
                    "TRIM_DONE", [k.channel(c), k.pend], [max_entries, TRIM_MAX_RECORDS, SCRIPT_BUDGET_MS]
                )
                removed += int(count)
                if not int(more):
                    break
        return removed

    def trim(self, channel: int, upto: str) -> int:
        """Drop stream entries with id <= ``upto`` (Spark committed them). Returns entries removed.

        Trimming only removes the channel index; records still pending stay in
        ``pend`` and time out or get replayed as usual.
        """
        ms, _, seq = upto.partition("-")
        min_id = f"{ms}-{int(seq or 0) + 1}"
        return int(
            self.store.client.xtrim(self.store.keys.channel(channel), minid=min_id, approximate=False)
        )
