"""Chunks: the unit in which a source's records are persisted, read and timed out (layout format 3).

A **chunk** is the set of records one persist call files for one channel (at
most :data:`CHUNK_TARGET_RECORDS` when ftlayer draws the ids itself). Redis
keeps one entry per chunk, not per record (see :mod:`ftlayer.keyspace.keys`): the frames
back to back, the records' initial ack values as one array, and a small state
of header plus one *settled* bit per record. So persisting, reading and timing
out cost Redis a few operations per chunk, and an ack costs a few Lua steps on
a number, with no per-record key, field or string.

**Ids name their chunk.** A source record id (signed 64 bits) is read as

====================  =======  =================================================
bits (unsigned view)  width    meaning
====================  =======  =================================================
63 .. 16              48       chunk id (its 6 big-endian bytes are the chunk's
                               field name in Redis); byte 0 also picks the shard
15 .. 0               16       index of the record in its chunk (< :data:`CHUNK_MAX_RECORDS`)
====================  =======  =================================================

so every caller finds a record's chunk by arithmetic (:func:`chunk_key`,
:func:`index_of`), in Python and in Lua alike, and a flush can address the
records of a chunk without any lookup table. Chunk ids are drawn at random
(:func:`new_chunk_bases`, fork-safe like every id), 48 bits, so two live
chunks share an id with probability about ``live**2 / 2**49``; a persist that
meets a chunk id in use is refused whole (:class:`~ftlayer.errors.ChunkIdInUseError`)
and ftlayer's own writers (ingest, replay, requeue) draw again.

**The frames of a chunk** are stored in index order, entry ``i`` being the
frame of record ``i`` or, for an index no record was given (a *hole*), the 4
bytes ``00 00 00 00``. Holes are settled from the start. So the frame of record
``i`` is found by walking the length prefixes, and the record at position ``i``
is the record with id ``base + i``. After the ``n`` entries a writer that encoded the frames
itself puts the chunk's CRC-32 (:mod:`ftlayer.records.chunk_crc`), which no walk reaches.

This module is pure: id math, packing of persist input, and parsing of what
the scripts store (for readers and inspection). The Lua under ``ftlayer/lua/`` reads the
same layouts through names generated from the constants here (``ftlayer.scripting.lua_layout``).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from ftlayer.errors import FrameError, InvalidIdError
from ftlayer.records.chunk_crc import CHUNK_CRC_BYTES, split_trailer, trailer
from ftlayer.records.ids import new_ids

__all__ = [
    "CHUNK_IN_HEADER",
    "CHUNK_KEY_BYTES",
    "CHUNK_MAX_BYTES",
    "CHUNK_MAX_RECORDS",
    "CHUNK_TARGET_RECORDS",
    "HOLE",
    "INDEX_BITS",
    "MAX_DRAWS",
    "STATE_HEADER",
    "ChunkState",
    "PackedChunk",
    "assign_sids",
    "bitmap_bytes",
    "chunk_base",
    "chunk_blob",
    "chunk_key",
    "frame_spans",
    "index_of",
    "new_chunk_bases",
    "pack_chunks",
    "pack_record_chunks",
    "pending_spans",
    "rekey_chunk",
    "shard_of",
    "sid_at",
    "split_run",
]

INDEX_BITS = 16
CHUNK_KEY_BYTES = 6
#: Most records one chunk may hold (its index field is 16 bits; the server's bitmap work is bounded by this).
CHUNK_MAX_RECORDS = 4096
#: Records per chunk when ftlayer draws the ids (ingest, replays, requeues).
CHUNK_TARGET_RECORDS = 1024
#: Frame bytes per chunk when ftlayer draws the ids (a single larger frame forms a chunk of its own).
CHUNK_MAX_BYTES = 1 << 20
#: Draws of new chunk ids before a writer gives up (each meets an id in use with odds ~ live chunks / 2**48).
MAX_DRAWS = 8
#: Frame entry of an index that holds no record.
HOLE = b"\x00\x00\x00\x00"

_INDEX_MASK = (1 << INDEX_BITS) - 1
_BASE_MASK = -1 << INDEX_BITS  # as a Python int: clears the index bits of a signed id
_MASK64 = (1 << 64) - 1

#: Persist input, per chunk: key (6) | n u16 | channel u16 | present u16 | frames length u32,
#: then the settled bitmap (``bitmap_bytes(n)``), n x 8-byte initial ack values, the frames.
CHUNK_IN_HEADER = struct.Struct(">6sHHHI")
#: A chunk's stored state (the ``ck`` value): bucket gen u32 | stream-entry gen u32 | channel u16 |
#: n u16 | records still pending u16 | records with a partial XOR u16 | flags u8, then the bitmap.
STATE_HEADER = struct.Struct(">IIHHHHB")
FLAG_REFILED = 1  # re-filed by a timeout scan because no task had read it
FLAG_SEEN = 2  # read by a task by the time of its last re-filing: it fails at the next expiry
_SID_CID = struct.Struct(">qq")
_CHANNEL = struct.Struct(">H")
_U32 = struct.Struct(">I")


def bitmap_bytes(n: int) -> int:
    """Bytes of the settled bitmap of a chunk of ``n`` records."""
    return (n + 7) // 8


def chunk_base(sid: int) -> int:
    """The id of index 0 of ``sid``'s chunk (the index bits cleared)."""
    return sid & _BASE_MASK


def index_of(sid: int) -> int:
    """The record's index in its chunk."""
    return sid & _INDEX_MASK


def chunk_key(sid: int) -> bytes:
    """The chunk's field name in Redis: bytes 0..5 of the big-endian id."""
    return ((sid & _MASK64) >> INDEX_BITS).to_bytes(CHUNK_KEY_BYTES, "big")


def sid_at(key: bytes, index: int) -> int:
    """The signed id of record ``index`` of the chunk named ``key``."""
    return int.from_bytes(key + index.to_bytes(2, "big"), "big", signed=True)


def shard_of(sid: int, num_shards: int) -> int:
    """The virtual shard (``ftlayer.keyspace.shard_tags``) a record lives in: the top byte of its id modulo
    ``num_shards``. All records of a chunk share it, and a replay is drawn in its origin's shard."""
    return ((sid >> 56) & 0xFF) % num_shards


def new_chunk_bases(count: int, shard: int | None = None, num_shards: int = 1,
                    among: Sequence[int] | None = None) -> list[int]:
    """``count`` fresh chunk bases (index 0 ids): random 48-bit chunk ids, none 0, fork-safe.

    With ``shard`` every base lies in that shard (:func:`shard_of`); without, the bases
    take the shards in turn (of ``among``, default all) from a random one, so chunks spread evenly.
    """
    out = []
    pool = list(among) if among else list(range(num_shards))
    first = int.from_bytes(os.urandom(2), "big") % len(pool)
    for k, raw in enumerate(new_ids(count)):
        unsigned = raw & _MASK64 & ~_INDEX_MASK
        want = pool[(first + k) % len(pool)] if shard is None else shard
        if num_shards > 1 or shard:
            top = unsigned >> 56
            top = top - top % num_shards + want
            if top > 0xFF:
                top -= num_shards
            unsigned = (unsigned & ((1 << 56) - 1)) | (top << 56)
        if not unsigned:
            unsigned = 1 << INDEX_BITS
        out.append(unsigned - (1 << 64) if unsigned >> 63 else unsigned)
    return out


def split_run(members: Sequence[int], sizes: Sequence[int] | None, max_records: int = CHUNK_TARGET_RECORDS,
              max_bytes: int = CHUNK_MAX_BYTES) -> list[list[int]]:
    """One channel's records (``members``: indexes, in batch order) cut into chunks of at most
    ``max_records`` records and, by ``sizes[i]`` (their frames' byte sizes; None: no byte bound),
    ``max_bytes`` bytes, a larger frame alone; in order, none empty."""
    runs: list[list[int]] = []
    run: list[int] = []
    used = 0
    for i in members:
        size = sizes[i] if sizes is not None else 0
        if run and (len(run) >= max_records or used + size > max_bytes):
            runs.append(run)
            run, used = [], 0
        run.append(i)
        used += size
    runs.append(run)
    return runs


def assign_sids(
    channels: Sequence[int],
    sizes: Sequence[int] | None = None,
    *,
    max_records: int = CHUNK_TARGET_RECORDS,
    max_bytes: int = CHUNK_MAX_BYTES,
    shard: int | None = None,
    num_shards: int = 1,
    among: Sequence[int] | None = None,
) -> list[int]:
    """Source record ids for a batch of new records, grouped into chunks per channel.

    Record ``i`` goes to ``channels[i]``; the records of one channel, in batch
    order, fill chunks of at most ``max_records`` records and (by ``sizes``, the
    frames' byte sizes) ``max_bytes`` bytes, a larger frame alone. Every chunk
    gets a fresh random id and its records the indexes 0, 1, ... in order, so
    each chunk is dense. Chunks go to ``shard``, or spread over the ``num_shards``
    shards in turn (:func:`new_chunk_bases`).
    """
    by_channel: dict[int, list[int]] = {}
    for i, ch in enumerate(channels):
        by_channel.setdefault(ch, []).append(i)
    runs: list[list[int]] = []
    for members in by_channel.values():
        runs += split_run(members, sizes, max_records, max_bytes)
    sids = [0] * len(channels)
    for base, run in zip(new_chunk_bases(len(runs), shard, num_shards, among), runs, strict=True):
        for index, i in enumerate(run):
            sids[i] = base | index
    return sids


@dataclass(frozen=True)
class PackedChunk:
    """One chunk as persist input (``blob``), with its record count and the ids it holds."""

    key: bytes
    blob: bytes
    sids: tuple[int, ...]

    @property
    def records(self) -> int:
        return len(self.sids)


def chunk_blob(key: bytes, channel: int, *, n: int, pending: int, settled: bytes, cids: bytes, body: bytes,
               crc: bool) -> bytes:
    """One chunk as PERSIST takes it: its header, its settled bitmap, its records' initial ack values
    (``cids``: 8 bytes each, big-endian) and its frames (``body``), ended by their chunk CRC
    (:mod:`ftlayer.records.chunk_crc`) with ``crc``: only for frames the caller encoded itself."""
    tail = trailer(body) if crc else b""
    return b"".join((CHUNK_IN_HEADER.pack(key, n, channel, pending, len(body) + len(tail)), settled, cids, body, tail))


def _pack_one(key: bytes, channel: int, members: dict[int, tuple[int, bytes]], crc: bool) -> PackedChunk:
    n = max(members) + 1
    bits = bytearray(bitmap_bytes(n))
    cids = [0] * n
    frames: list[bytes] = []
    for i in range(n):
        got = members.get(i)
        if got is None:
            bits[i >> 3] |= 1 << (i & 7)
            frames.append(HOLE)
        else:
            cids[i] = got[0]
            frames.append(got[1])
    blob = chunk_blob(key, channel, n=n, pending=len(members), settled=bytes(bits), cids=struct.pack(f">{n}q", *cids),
                      body=b"".join(frames), crc=crc)
    return PackedChunk(key, blob, tuple(sid_at(key, i) for i in sorted(members)))


def pack_chunks(frames: Iterable[bytes], *, crc: bool = False) -> list[PackedChunk]:
    """Frames grouped into chunks by their source record ids, as persist input, in first-seen order.

    With ``crc`` each chunk's frames end with the chunk's CRC-32 (:mod:`ftlayer.records.chunk_crc`),
    which vouches for them at read: only for frames the caller encoded itself.

    Each frame's source and current record id and channel are read from its
    header. Raises :class:`InvalidIdError` (nothing is packed) if an id's index
    is ``>= CHUNK_MAX_RECORDS``, two frames share an id, or the records of one
    chunk name different channels; :class:`FrameError` if a frame is shorter
    than its header.
    """
    groups: dict[bytes, tuple[int, dict[int, tuple[int, bytes]]]] = {}
    for frame in frames:
        if len(frame) < 48:
            msg = f"frame of {len(frame)} bytes is shorter than a frame header (48)"
            raise FrameError(msg)
        sid, cid = _SID_CID.unpack_from(frame, 8)
        (channel,) = _CHANNEL.unpack_from(frame, 42)
        index = sid & _INDEX_MASK
        if index >= CHUNK_MAX_RECORDS:
            msg = (
                f"source record id {sid}: its index in its chunk (low {INDEX_BITS} bits, {index}) must be "
                f"below {CHUNK_MAX_RECORDS}; draw ids with ftlayer.records.ids.new_record_id or "
                "serialization.make_record"
            )
            raise InvalidIdError(msg)
        key = ((sid & _MASK64) >> INDEX_BITS).to_bytes(CHUNK_KEY_BYTES, "big")
        group = groups.get(key)
        if group is None:
            group = (channel, {})
            groups[key] = group
        elif group[0] != channel:
            msg = (
                f"source record id {sid} names channel {channel} but the other records of its chunk "
                f"channel {group[0]}: the records of one chunk share a channel"
            )
            raise InvalidIdError(msg)
        if index in group[1]:
            msg = f"source record id {sid} is given twice in one persist"
            raise InvalidIdError(msg)
        group[1][index] = (cid, frame)
    return [_pack_one(key, ch, members, crc) for key, (ch, members) in groups.items()]


def pack_record_chunks(
    frames: Sequence[bytes], sids: Sequence[int], cids: Sequence[int], channels: Sequence[int]
) -> list[PackedChunk]:
    """As :func:`pack_chunks` for frames whose ids and channels the caller already has (ingest's
    hot path: no header parsing). The ids must come from :func:`assign_sids`: dense chunks. The
    caller encoded the frames itself: each chunk's frames end with the chunk's CRC-32."""
    groups: dict[int, list[int]] = {}
    for i, sid in enumerate(sids):
        groups.setdefault(sid & _BASE_MASK, []).append(i)
    out = []
    for base, members in groups.items():
        key = ((base & _MASK64) >> INDEX_BITS).to_bytes(CHUNK_KEY_BYTES, "big")
        n = len(members)
        blob = chunk_blob(key, channels[members[0]], n=n, pending=n, settled=bytes(bitmap_bytes(n)),
                          cids=struct.pack(f">{n}q", *[cids[i] for i in members]),
                          body=b"".join([frames[i] for i in members]), crc=True)
        out.append(PackedChunk(key, blob, tuple(sids[i] for i in members)))
    return out


def rekey_chunk(chunk: PackedChunk, num_shards: int = 1) -> PackedChunk:
    """The same chunk under a fresh random chunk id in the same shard: each frame's source record
    id (and CRC) rewritten, holes and ack values unchanged; a chunk CRC that vouched for the frames
    is computed again (one that did not is left as it was), and a columns section after it kept
    (``ftlayer.records.chunk_columns``: values only). For a persist refused because the id was in use."""
    blob = bytearray(chunk.blob)
    _, n, _, _, flen = CHUNK_IN_HEADER.unpack_from(blob)
    base = new_chunk_bases(1, shard_of(sid_at(chunk.key, 0), num_shards), num_shards)[0]
    key = ((base & _MASK64) >> INDEX_BITS).to_bytes(CHUNK_KEY_BYTES, "big")
    blob[0:CHUNK_KEY_BYTES] = key
    start = CHUNK_IN_HEADER.size + bitmap_bytes(n) + 8 * n
    frames = memoryview(blob)[start : start + flen]
    spans = frame_spans(frames, n)
    end = spans[-1][1] if spans else 0
    sealed, _ = split_trailer(frames, end)  # a columns section after the trailer stays as it is
    for i, (lo, hi) in enumerate(spans):
        if hi - lo >= 48:
            struct.pack_into(">q", frames, lo + 8, base | i)
            crc = zlib.crc32(frames[lo + 48 : hi], zlib.crc32(frames[lo + 4 : lo + 44]))
            _U32.pack_into(frames, lo + 44, crc)
    if sealed:
        frames[end : end + CHUNK_CRC_BYTES] = trailer(frames[:end])
    frames.release()
    return PackedChunk(key, bytes(blob), tuple(base | index_of(sid) for sid in chunk.sids))


@dataclass(frozen=True)
class ChunkState:
    """A chunk's stored state (``ck`` value), parsed."""

    gen: int
    entry_gen: int
    channel: int
    n: int
    left: int
    partials: int
    flags: int
    settled: bytes  # bitmap, bit i set: record i is not pending

    @classmethod
    def parse(cls, raw: bytes) -> ChunkState:
        gen, egen, ch, n, left, partials, flags = STATE_HEADER.unpack_from(raw)
        return cls(gen, egen, ch, n, left, partials, flags, bytes(raw[STATE_HEADER.size :]))

    def pending(self, index: int) -> bool:
        """Is record ``index`` still pending (neither completed, failed nor a hole)?"""
        if not 0 <= index < self.n:
            return False
        return not self.settled[index >> 3] >> (index & 7) & 1


def pending_spans(key: bytes, state: bytes, frames: bytes) -> Iterator[tuple[int, int, int]]:
    """``(sid, start, end)`` of each pending record of a chunk as read (its ``ck`` state and ``cf``
    frames), in index order. A record's id is its place in the chunk (:func:`sid_at`), not what its
    frame says, so a damaged frame is still named right."""
    st = ChunkState.parse(state)
    settled = st.settled
    base = sid_at(key, 0)
    for i, (start, end) in enumerate(frame_spans(frames, st.n)):
        if not settled[i >> 3] >> (i & 7) & 1:
            yield base | i, start, end


def frame_spans(frames: bytes | memoryview, n: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each of the ``n`` entries of a chunk's frames, in index order.

    An entry whose length prefix runs past the end (a damaged length) ends the
    walk: it and every later index get ``(start, start)`` or ``(size, size)``,
    empty spans a reader treats as unreadable frames.
    """
    size = len(frames)
    spans: list[tuple[int, int]] = []
    pos = 0
    unpack = _U32.unpack_from
    for _ in range(n):
        if pos + 4 > size:
            spans.append((size, size))
            continue
        end = pos + 4 + unpack(frames, pos)[0]
        if end > size:
            spans.append((pos, pos))
            pos = size
            continue
        spans.append((pos, end))
        pos = end
    return spans
