"""PersistenceLayer: durable copies of source records, filed for timeout and routing.

Records are filed in *chunks* (``ftlayer.records.chunks``): the records of one call
for one channel, named by the high 48 bits of their source record ids.
``persist(records)`` is one atomic server-side call per group of whole chunks
of at most ``flush_batch_size`` records (and ``script_bounds.CALL_MAX_RECORDS``
records and ``CALL_MAX_BYTES`` bytes, so no call holds the server long). For
each chunk not yet known it:

1. stores its frames, its records' ack values (= their current ids, since the
   source emits each record itself once) and its state (all pending), one hash
   field each, under the chunk id;
2. files the chunk in the current timeout bucket;
3. appends the chunk id to the stream of its channel.

It returns only after the write is durable to the degree the durability mode
promises ('waitaof' waits for the AOF fsync), and only then may the records be
emitted. A call retried with the same input files nothing twice (its token); a
chunk id already in use by a pending chunk refuses the call whole
(:class:`~ftlayer.errors.ChunkIdInUseError`).

Channels are read back with :meth:`read_channel` (by stream-id range, so a
re-run micro-batch reads the same records minus those settled since) and
trimmed with :meth:`trim` once Spark has committed a range. A read call is
bounded by records, bytes and time (``ftlayer.scripting.script_bounds``) and returns a
cursor (stream id and position inside that entry); :meth:`iter_channel` loops
over the calls and reads a range whole, each record once, in order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import xxhash

from ftlayer.acker.acker_table import AckerTable
from ftlayer.acker.channels import check_channel_count
from ftlayer.errors import ChannelCountMismatchError, FrameError, InvalidArgumentError
from ftlayer.records.chunks import MAX_DRAWS, PackedChunk, pack_chunks, pending_spans, rekey_chunk
from ftlayer.records.frames import NO_CHANNEL, SemiDeserializedRecord, SemiDeserializedSerializer
from ftlayer.records.span_arrays import chunk_span_arrays
from ftlayer.scripting.lua_script import STATE_KEYS, LuaScript
from ftlayer.scripting.script_bounds import (
    CALL_MAX_BYTES,
    CALL_MAX_CHUNKS,
    CALL_MAX_RECORDS,
    READ_MAX_RECORDS,
    SCRIPT_BUDGET_MS,
    SCRIPT_MAX_BYTES,
    TRIM_MAX_RECORDS,
)
from ftlayer.store.layout_version import ensure_layout
from ftlayer.store.source_store import SourceStore, persist_refused_error

_SERIALIZER = SemiDeserializedSerializer()
log = logging.getLogger(__name__)

# The scripts this module runs (ftlayer.scripting.lua_script: their KEYS and ARGV, checked at each call)
PERSIST = LuaScript("PERSIST", keys=(*STATE_KEYS, "tok:*", "ch:*[num_channels]"),
                    argv=("prefix", "num_channels", "chunks", "token_ttl_ms"))
READ_CHANNEL = LuaScript(
    "READ_CHANNEL", keys=("ch:*", "ck", "cf", "rd", "hld:*?", "dfs:*?"),
    argv=("start_id", "start_skip", "end_id", "max_entries", "max_records", "max_bytes", "budget_ms", "channel",
          "hold_ttl_ms", "start_chunk?", "end_chunk?", "skips_ttl_ms?", "first_call?"),
)
TRIM_DONE = LuaScript("TRIM_DONE", keys=("ch:*", "ck"), argv=("max_entries", "max_chunks", "budget_ms"))
RESCALE = LuaScript("RESCALE", keys=("ck", "failed", "live", "ch:*..."), argv=())
META_CAS = LuaScript("META_CAS", keys=("meta",), argv=("field", "expected", "value"))


def persist_token(store: SourceStore, blob: bytes) -> str:
    """The token key of a PERSIST call: ``tok:p:<xxh64 of its input>`` (the input carries the
    records' ids, so only the same call, retried, has the same token; about 0.1 ms per MB)."""
    return store.keys.token(f"p:{xxhash.xxh64_hexdigest(blob)}")


def call_groups(
    chunks: Sequence[PackedChunk], max_records: int, max_bytes: int = CALL_MAX_BYTES,
) -> list[tuple[int, int]]:
    """Consecutive whole chunks grouped into calls of at most ``max_records`` records,
    ``max_bytes`` bytes and ``CALL_MAX_CHUNKS`` chunks (a chunk larger than either goes
    alone), as ``(start, end)`` index ranges. Deterministic: the same chunks give the same
    calls, so a retried persist sends the same inputs (and tokens)."""
    out: list[tuple[int, int]] = []
    start = records = size = 0
    for i, c in enumerate(chunks):
        if i > start and (records + c.records > max_records or size + len(c.blob) > max_bytes
                          or i - start >= CALL_MAX_CHUNKS):
            out.append((start, i))
            start, records, size = i, 0, 0
        records += c.records
        size += len(c.blob)
    if start < len(chunks):
        out.append((start, len(chunks)))
    return out




def _stream_pos(entry_id: str) -> tuple[float, float]:
    """Sort key of a stream id; '-' and '+' are the ends."""
    if entry_id == "-":
        return (float("-inf"), 0.0)
    if entry_id == "+":
        return (float("inf"), 0.0)
    ms, _, seq = entry_id.partition("-")
    return (float(ms), float(seq or 0))


def chunk_records(key: bytes, state: bytes, frames: bytes) -> tuple[list[int], list[bytes]]:
    """The pending records of one chunk as read: ``(sids, frames)``, in index order
    (``ftlayer.records.chunks.pending_spans``; damaged frames are returned as they are, for the reader's
    checks)."""
    sids: list[int] = []
    out: list[bytes] = []
    for sid, start, end in pending_spans(key, state, frames):
        sids.append(sid)
        out.append(frames[start:end])
    return sids, out


class PendingSpans(NamedTuple):
    """Where a read's pending records lie in the joined frames of their chunks (:meth:`ChannelBatch.spans`).

    ``blob``: the chunks' frames joined once; ``starts``, ``lengths`` and ``sids`` (``int64``
    arrays, read order): each pending record's frame in ``blob`` and its source record id;
    ``vouched`` (bool array): True where the record's chunk CRC matched
    (``ftlayer.records.chunk_crc``), so its frame's own CRC need not be checked again;
    ``columns``: per chunk with records read, in read order, ``(fingerprint, body, rows, n)`` of
    its columns section (``ftlayer.records.chunk_columns``: the pending records are rows ``rows``
    of the section's ``n``), or None unless every such chunk has a sound one.
    """

    blob: bytes
    starts: Any
    lengths: Any
    sids: Any
    vouched: Any
    columns: tuple[tuple[bytes, memoryview, Any, int], ...] | None = None


@dataclass(frozen=True)
class ChannelBatch:
    """Records read from one channel, still serialized, and the cursor where the read stopped.

    ``chunks`` holds per chunk read its id, stored state and frames as they came from Redis;
    :attr:`sids` and :attr:`frames` are its pending records (settled ones skipped), in order.
    The cursor is ``last_id`` (the last stream entry read, '' if none) and ``skip``: 0 if that
    entry was read whole, else how many of its chunks were read (pass both back to go on).
    """

    channel: int
    last_id: str
    chunks: list[tuple[bytes, bytes, bytes]] = field(default_factory=list)  # (chunk id, state, frames)
    skip: int = 0
    cuts: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # chunk id -> (lo, hi]: the records kept

    def _spans(self, key: bytes, state: bytes, blob: bytes) -> Iterator[tuple[int, int, int]]:
        cut = self.cuts.get(key)
        for sid, start, end in pending_spans(key, state, blob):
            if cut is None or cut[0] < (sid & 0xFFFF) <= cut[1]:
                yield sid, start, end

    @property
    def sids(self) -> list[int]:
        """Source record ids of the pending records, in read order."""
        return self.pending()[0]

    @property
    def frames(self) -> list[bytes]:
        """Frames of the pending records, in read order (a copy of each)."""
        return self.pending()[1]

    def pending(self) -> tuple[list[int], list[bytes]]:
        """``(sids, frames)`` of the pending records, in read order."""
        sids: list[int] = []
        frames: list[bytes] = []
        for key, state, blob in self.chunks:
            for sid, start, end in self._spans(key, state, blob):
                sids.append(sid)
                frames.append(blob[start:end])
        return sids, frames

    def spans(self) -> PendingSpans:
        """The pending records as :class:`PendingSpans`: the chunks' frames joined once, and where
        each pending record's frame lies in it, in read order (the FT source's hot path: no frame
        is copied out on its own, and no Python step per record but the length-prefix walk,
        :mod:`ftlayer.records.span_arrays`)."""
        import numpy as np

        parts: list[bytes] = []
        found: list[tuple[Any, Any, Any, Any]] = []
        columns: list[tuple[bytes, memoryview, Any, int]] | None = []
        offset = 0
        for key, state, blob in self.chunks:
            got = chunk_span_arrays(key, state, blob, self.cuts.get(key))
            found.append((got.sids, got.starts + offset, got.ends - got.starts, np.full(got.sids.size, got.vouched)))
            parts.append(blob)
            offset += len(blob)
            if columns is not None and got.sids.size:
                if got.section is None:
                    columns = None  # the page is decoded from its frames
                else:
                    columns.append((*got.section, got.rows, got.n))
        if not found:
            empty = np.zeros(0, dtype=np.int64)
            return PendingSpans(b"", empty, empty, empty, np.zeros(0, dtype=bool))
        sids, starts, lengths, vouched = (np.concatenate(column) for column in zip(*found, strict=True))
        return PendingSpans(b"".join(parts), starts, lengths, sids, vouched,
                            tuple(columns) if columns else None)

    def records(self) -> list[SemiDeserializedRecord]:
        """The frames decoded (payloads stay msgpack bytes)."""
        return [_SERIALIZER.decode(f) for f in self.frames]


class PersistenceLayer:
    """Persist, read and trim one source's records (see module contract)."""

    def __init__(self, store: SourceStore, num_channels: int) -> None:
        self.store = store
        self.num_channels = num_channels

    def check_channels(self, shards: Sequence[SourceStore] = ()) -> None:
        """Register a new source, or match the channel count its data was written with.

        ``shards`` are the stores of every shard of the source (default: this layer's store
        alone, a one-shard source). A different count is taken over only if every shard is
        drained (nothing pending, nothing waiting for replay; dead letters do not count):
        each shard's channel streams are emptied, then the recorded count is changed if it
        still is the one read. Otherwise :class:`ChannelCountMismatchError` names both
        counts and what is still in flight. Run this only once the query that used the old
        count has stopped; Spark needs a new checkpoint, since a checkpoint's offsets name
        the old channels.
        """
        stores = list(shards) or [self.store]
        k = self.store.keys
        if k.num_shards == 1:
            ensure_layout(self.store)  # a source written by an older ftlayer
        for _ in range(3):  # a concurrent change of the recorded count: read it again
            recorded = self.store.recorded_channels()
            if recorded is None:
                self.store.register(self.num_channels)
            elif recorded != self.num_channels:
                pending = failed = 0
                for st in stores:
                    sk = st.keys
                    reply = st.run(RESCALE, [sk.chunks, sk.failed, sk.live,
                                               *(sk.channel(c) for c in range(recorded))], [])
                    pending, failed = pending + int(reply[1]), failed + int(reply[2])
                if pending or failed:
                    check_channel_count(recorded, self.num_channels, f"{k.topology}/{k.source}",
                                        pending=pending, failed=failed)
                if not int(self.store.run(META_CAS, [k.meta], ["num_channels", recorded, self.num_channels])):
                    continue
                log.warning("source %s/%s: channel count changed from %d to %d (the source was drained)",
                            k.topology, k.source, recorded, self.num_channels)
            for st in stores[1:]:
                st.register_shard()
            return
        msg = f"source {k.topology}/{k.source}: its recorded channel count keeps changing; is another driver running?"
        raise ChannelCountMismatchError(msg)

    def persist(self, records: Sequence[SemiDeserializedRecord]) -> int:
        """Persist records atomically per call; returns how many were new. See module contract.

        Every record is checked and encoded before anything is sent: an item that is
        no :class:`SemiDeserializedRecord` raises :class:`InvalidArgumentError`, a
        channel out of range :class:`FrameError`, ids that do not fit the chunk layout
        :class:`~ftlayer.errors.InvalidIdError`, and nothing is written.
        """
        for i, rec in enumerate(records):
            if not isinstance(rec, SemiDeserializedRecord):
                msg = (
                    f"persist on source {self.store.keys.prefix!r}: record {i} is a {type(rec).__name__}, "
                    "expected a SemiDeserializedRecord (see serialization.make_record); nothing was persisted"
                )
                raise InvalidArgumentError(msg)
            if rec.channel is None or rec.channel == NO_CHANNEL or not 0 <= rec.channel < self.num_channels:
                msg = (
                    f"record {rec.record_id.source_record_id} of source {rec.source_id} has channel "
                    f"{rec.channel}; persist needs a channel in 0..{self.num_channels - 1}"
                )
                raise FrameError(msg)
        # encoded here: each chunk carries its CRC (ftlayer.records.chunk_crc), which the reader checks
        return self.persist_chunks(pack_chunks([_SERIALIZER.encode(r) for r in records], crc=True))

    def persist_frames(self, frames: Sequence[bytes]) -> int:
        """Persist already-encoded frames, grouped into chunks by their ids (``ftlayer.records.chunks``).

        Idempotent: calling it again with the same frames files nothing twice, even once
        the first call's records were processed and acked (each server-side call carries
        a token named after a hash of its input; see PERSIST), unless a failover
        lost the first call's writes, which are then filed again.

        The frames come from the caller, so their chunks carry no chunk CRC
        (``ftlayer.records.chunk_crc``): the reader checks each frame's own.
        """
        return self.persist_chunks(pack_chunks(frames))

    def persist_chunks(self, chunks: list[PackedChunk], *, rekey: bool = False) -> int:
        """Persist packed chunks (ingest's hot path: ``ftlayer.records.chunks.pack_record_chunks``).

        A call that names a chunk id in use by pending records writes nothing. With ``rekey``
        (ids ftlayer drew itself) the chunks of such a call get fresh ids (``chunks`` is
        updated in place, so a caller that retries after a lost reply sends the chunks as
        they were last sent) and only that call is sent again. Without it,
        :class:`ChunkIdInUseError` names the chunk, and its ``filed`` and ``refused`` say which
        records the applied calls and the refused ones held.
        """
        size = min(self.store.config.flush_batch_size, CALL_MAX_RECORDS)
        channels = self.store.channel_keys(self.num_channels)
        ttl_ms = self.store.token_ttl_ms()
        groups = call_groups(chunks, size)
        todo = list(range(len(groups)))
        total = 0
        for _ in range(MAX_DRAWS):
            blobs = [b"".join(c.blob for c in chunks[groups[g][0] : groups[g][1]]) for g in todo]
            calls = [
                (PERSIST, [*self.store.state_keys, persist_token(self.store, blob), *channels],
                 [self.store.keys.prefix, self.num_channels, blob, ttl_ms])
                for blob in blobs
            ]
            # in the waiting durability modes, the calls and their wait share one connection
            refused: list[tuple[int, bytes]] = []
            for g, (count, gen) in zip(todo, self.store.run_durable(calls), strict=True):
                if int(count) < 0:
                    refused.append((g, bytes(gen)))
                else:
                    total += int(count)
            if not refused:
                return total
            if not rekey:
                break
            for g, _ in refused:
                start, end = groups[g]
                chunks[start:end] = [rekey_chunk(c, self.store.keys.num_shards) for c in chunks[start:end]]
            todo = [g for g, _ in refused]
        # the other calls were applied: say exactly which records, so that a retry files none twice
        no = {g for g, _ in refused}
        sids = [s for g in range(len(groups)) if g in no for c in chunks[groups[g][0] : groups[g][1]] for s in c.sids]
        filed = [s for g in range(len(groups)) if g not in no for c in chunks[groups[g][0] : groups[g][1]]
                 for s in c.sids]
        raise persist_refused_error(self.store.keys, refused[0][1], filed=filed, refused=sids, new=total)

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
        hold: str | None = None,
        hold_ttl_ms: int = 3_600_000,
        skips_ttl_ms: int | None = None,
        first_call: bool = True,
        start_chunk: bytes = b"",
        end_chunk: bytes = b"",
        cuts: Mapping[bytes, tuple[int, int]] | None = None,
    ) -> ChannelBatch:
        """One bounded read of the pending records with stream ids in (after, until].

        With ``skip`` > 0 the read starts inside entry ``after``, at its
        ``skip``-th chunk (a cursor returned by the previous call). At most
        ``max_entries`` entries, about ``max_records`` records examined and
        ``max_bytes`` of frames per call (at least one chunk); the returned
        cursor says where it stopped. Use :meth:`iter_channel` to read a whole range.
        With ``hold`` (a running batch's tag, ``ftlayer.acker.holds``) the chunks read join that
        batch's hold set, kept ``hold_ttl_ms`` at most. Record-precise bounds: with
        ``start_chunk`` (and ``skip`` 0) the read begins at that chunk of entry ``after``,
        included; with ``end_chunk`` the entry ``until`` is read up to that chunk, included;
        ``cuts`` keeps, of the chunks it names, only the records whose index ``i`` has
        ``lo < i <= hi`` (``runtime.spark.ft_offsets``). With ``skips_ttl_ms`` (and ``hold``: the
        DataFrame path's read tasks) the records of the chunks read that are no longer pending are
        noted in ``dfs:<hold>`` for that long: this read does not hand them on, so the batch's
        settle must not complete them late (``BATCH_SETTLE``). ``dfs:<hold>`` also counts the reads
        of the channel (``first_call``: this call begins a read, a task's first page) and, per
        chunk returned, the reads that returned it: a chunk some read of its partition did not
        return (its records all settled and its entry trimmed before that read) is not completed
        late either.
        """
        k = self.store.keys
        keys = [k.channel(channel), k.chunks, k.chunk_frames, k.read_marks]
        args: list[object] = [after, skip, until, max_entries, max_records, max_bytes, SCRIPT_BUDGET_MS, channel,
                              hold_ttl_ms, start_chunk, end_chunk]
        if skips_ttl_ms is not None and hold is None:
            msg = "read_channel: skips_ttl_ms needs hold (the batch whose reads it notes)"
            raise ValueError(msg)
        if hold is not None:
            keys.append(k.held(hold))
        if hold is not None and skips_ttl_ms is not None:
            keys.append(k.batch_skips(hold))
            args.extend([skips_ttl_ms, "1" if first_call else "0"])
        reply = self.store.run(READ_CHANNEL, keys, args)
        last = reply[0].decode() if reply and reply[0] else ""
        rest = reply[2:]
        return ChannelBatch(channel, last, list(zip(rest[::3], rest[1::3], rest[2::3], strict=True)), int(reply[1]),
                            dict(cuts or {}))

    def iter_channel(
        self,
        channel: int,
        after: str = "-",
        until: str = "+",
        *,
        max_entries: int = 10_000,
        max_records: int = READ_MAX_RECORDS,
        max_bytes: int = SCRIPT_MAX_BYTES,
        hold: str | None = None,
    ) -> Iterator[ChannelBatch]:
        """Every pending record of (after, until], in stream order, each once, in bounded calls.

        Yields one batch per server-side call (batches may be empty when a
        chunk held only settled records). ``hold``: as in :meth:`read_channel`.
        """
        skip = 0
        while True:
            batch = self.read_channel(
                channel, after, until, max_entries, skip=skip, max_records=max_records, max_bytes=max_bytes,
                hold=hold,
            )
            yield batch
            if not batch.last_id or (not batch.skip and _stream_pos(batch.last_id) >= _stream_pos(until)):
                return
            after, skip = batch.last_id, batch.skip

    def fail_unreadable(self, bad: Sequence[tuple[int, str]]) -> int:
        """Fail the records whose stored frame a reader could not decode, for the dead-letter queue.

        ``bad`` holds ``(source record id, reason)``; the id is the record's place in
        its chunk, so a damaged header cannot misname it. Each is failed with its
        reason and without replays (a replay would re-read the same bytes), so the
        replayer dead-letters it at once; the rest of the channel goes on.
        Idempotent (a record no longer pending is skipped). Returns how many records
        were failed.
        """
        if not bad:
            return 0
        fails = dict(bad)
        return AckerTable(self.store).xor({}, fails=fails, no_replay=set(fails)).failed

    def iter_pending(self, count: int = 100) -> Iterator[tuple[int, bytes]]:
        """``(source record id, frame)`` of every pending record, chunk by chunk (HSCAN order:
        a chunk filed or settled meanwhile may be seen or not). For inspection and tests."""
        k = self.store.keys
        client = self.store.client
        for key, state in client.hscan_iter(k.chunks, count=count):
            frames = client.hget(k.chunk_frames, key)
            if frames is not None:
                yield from zip(*chunk_records(key, state, frames), strict=True)  # type: ignore[arg-type]

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
                    TRIM_DONE, [k.channel(c), k.chunks], [max_entries, TRIM_MAX_RECORDS, SCRIPT_BUDGET_MS]
                )
                removed += int(count)
                if not int(more):
                    break
        return removed

    def trim(self, channel: int, upto: str) -> int:
        """Drop stream entries with id <= ``upto`` (Spark committed them). Returns entries removed.

        Trimming only removes the channel index; records still pending stay in
        their chunks and time out or get replayed as usual.
        """
        ms, _, seq = upto.partition("-")
        min_id = f"{ms}-{int(seq or 0) + 1}"
        return int(
            self.store.client.xtrim(self.store.keys.channel(channel), minid=min_id, approximate=False)
        )
