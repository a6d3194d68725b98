"""PersistenceLayer: durable copies of source records, filed for timeout and routing.

``persist(records)`` is one atomic server-side call per ``flush_batch_size``
records. For each record not yet known it:

1. stores the frame by source_record_id (``pend``), with ack value = the
   record's current id, since the source emits the record itself once;
2. files the id in the current timeout bucket;
3. appends the id to the stream of the record's channel.

It returns only after the write is durable to the degree the durability mode
promises ('waitaof' waits for the AOF fsync), and only then may the record be
emitted. Persisting the same id again is a no-op, so a client retry is safe.

Channels are read back with :meth:`read_channel` (by stream-id range, so a
re-run micro-batch reads the same records minus those completed since) and
trimmed with :meth:`trim` once Spark has committed a range.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from ftlayer.acker_table import AckerTable
from ftlayer.errors import FrameError
from ftlayer.store import SourceStore
from partitioners.channels import check_channel_count
from serialization.frames import NO_CHANNEL, SemiDeserializedRecord, SemiDeserializedSerializer

_SERIALIZER = SemiDeserializedSerializer()


PEND_PREFIX = 12  # a `pend` value is ack (8) | bucket gen (4) | frame


@dataclass(frozen=True)
class ChannelBatch:
    """Records read from one channel, still serialized, and the last stream id read.

    ``values`` are the records' ``pend`` values: each frame starts at byte
    :data:`PEND_PREFIX` (``runtime.arrow_codec.frames_to_record_batch`` reads
    them in place with ``prefix=PEND_PREFIX``).
    """

    channel: int
    last_id: str
    values: list[bytes]

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
        """Refuse to run against data written with another channel count; register if new."""
        recorded = self.store.recorded_channels()
        if recorded is None:
            self.store.register(self.num_channels)
        else:
            k = self.store.keys
            check_channel_count(recorded, self.num_channels, f"{k.topology}/{k.source}")

    def persist(self, records: Sequence[SemiDeserializedRecord]) -> int:
        """Persist records atomically per chunk; returns how many were new. See module contract."""
        for rec in records:
            if rec.channel is None or rec.channel == NO_CHANNEL or not 0 <= rec.channel < self.num_channels:
                msg = (
                    f"record {rec.record_id.source_record_id} of source {rec.source_id} has channel "
                    f"{rec.channel}; persist needs a channel in 0..{self.num_channels - 1}"
                )
                raise FrameError(msg)
        return self.persist_frames([_SERIALIZER.encode(r) for r in records])

    def persist_frames(self, frames: Sequence[bytes]) -> int:
        """Persist already-encoded frames (the hot path: no re-encoding)."""
        size = self.store.config.flush_batch_size
        total = 0
        for i in range(0, len(frames), size):
            blob = b"".join(frames[i : i + size])
            count, _gen = self.store.run(
                "PERSIST", self.store.state_keys, [self.store.keys.prefix, self.num_channels, blob]
            )
            total += int(count)
        if frames:
            self.store.wait_durable()
        return total

    def read_channel(
        self, channel: int, after: str = "-", until: str = "+", max_entries: int = 10_000
    ) -> ChannelBatch:
        """Records appended to ``channel`` with stream ids in (after, until], still pending."""
        k = self.store.keys
        reply = self.store.run(
            "READ_CHANNEL", [k.channel(channel), k.pend], [after, until, max_entries]
        )
        last = reply[0].decode() if reply and reply[0] else ""
        return ChannelBatch(channel, last, list(reply[1:]))

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
        start = PEND_PREFIX + 8  # a frame's source_record_id sits at bytes 8..16
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

    def trim_done(self, max_entries: int = 256) -> int:
        """Drop each channel's head entries whose records are all done; returns entries removed.

        Called by the FT service, so a drained source leaves empty channel
        streams even when no later micro-batch commits the last range.
        """
        k = self.store.keys
        return sum(
            int(self.store.run("TRIM_DONE", [k.channel(c), k.pend], [max_entries]))
            for c in range(self.num_channels)
        )

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
