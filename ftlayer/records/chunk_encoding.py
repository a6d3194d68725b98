"""Ingest's hot path: a batch of new source records to persist-ready chunks, over arrays.

:func:`encode_source_chunks` gives, for a batch of packed values, exactly the
chunks that drawing the ids with :func:`ftlayer.records.chunks.assign_sids`, encoding
each frame with :func:`ftlayer.records.frames.encode_source_frames` and packing them
with :func:`ftlayer.records.chunks.pack_record_chunks` would give for the same ids
(property-tested against that path). The difference is cost: the frame
headers of the whole batch are one numpy structured array, and so are their ids
(:func:`ftlayer.records.ids.new_id_array`, no Python int per id); the 40 covered header bytes of
every frame are cut out of the batch's headers by one ``struct`` call, and each frame's CRC-32 over
them and its payload is two ``zlib.crc32`` calls (in C, run by ``map``; a whole-batch table CRC,
:func:`ftlayer.records.crc_arrays.crc32_rows`, costs more below ~1,000 frames); the
headers are cut apart by one ``struct`` call and each chunk's frames are joined once (and
their chunk CRC, :mod:`ftlayer.records.chunk_crc`, is one ``zlib.crc32`` over the join). On the
driver this takes the encoding of a small record from about 1.2 µs (a CRC call on a
memoryview slice per frame) to about 0.7. The arrays cost some 50 µs to set up whatever the
batch's size, so a small batch (up to :data:`PLAIN_MAX_RECORDS`) takes :func:`encode_chunks_plain`
instead, the same bytes with no numpy (each frame's parts made by ``map`` over the batch),
property-tested against the array path for the same draws.

Chunk rules (as ``assign_sids``): the records of one channel, in batch order,
fill chunks of at most ``CHUNK_TARGET_RECORDS`` records and ``CHUNK_MAX_BYTES``
bytes of frames (a larger frame alone); every chunk gets a fresh random id
(:func:`ftlayer.records.chunks.new_chunk_bases`, spread over the shards in turn) and
its records the indexes 0, 1, ... in batch order.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Sequence
from itertools import groupby, repeat
from typing import Any

from ftlayer.errors import SerializationError
from ftlayer.records.chunks import (
    CHUNK_KEY_BYTES,
    CHUNK_MAX_BYTES,
    CHUNK_TARGET_RECORDS,
    INDEX_BITS,
    PackedChunk,
    bitmap_bytes,
    chunk_blob,
    new_chunk_bases,
    split_run,
)
from ftlayer.records.frames import (
    BODY_FIXED_SIZE,
    FRAME_VERSION,
    HEADER_FIELDS,
    HEADER_SIZE,
    OFFSET_CRC,
    OFFSET_VERSION,
    header_dtype,
)
from ftlayer.records.ids import new_id_array, new_ids

__all__ = ["PLAIN_MAX_RECORDS", "encode_chunks_arrays", "encode_chunks_plain", "encode_source_chunks"]

_MASK64 = (1 << 64) - 1
#: Batches up to this many records take the plain-Python path (:func:`encode_chunks_plain`): below about
#: this size the array path's set-up (some 30 small numpy calls) outweighs its lower cost per record.
#: Measured on the 2-core dev machine, webhook-sized records (CPU us, plain vs arrays, the header
#: structs cached): 10 records 35 vs 65; 50: 77 vs 88; 75: 105 vs 104; 100: 133 vs 117; 300: 324 vs 213.
#: (Before the covered bytes' CRC was two zlib calls a frame, the crossover was near 300.) Same bytes either way.
PLAIN_MAX_RECORDS = 75
_CODES = "".join(code for _, code in HEADER_FIELDS)
_COVERED = struct.Struct(">" + _CODES[1:-1])  # header bytes [4:44): all but body_len and crc, as frames.py
_U32 = struct.Struct(">I")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def chunk_runs(channels: Any, sizes: Any, max_records: int = CHUNK_TARGET_RECORDS,
               max_bytes: int = CHUNK_MAX_BYTES) -> tuple[Any, list[tuple[int, int]]]:
    """The records grouped into chunks: ``(order, runs)``, where ``order`` lists the records by
    channel (batch order within one) and each run ``(start, end)`` is a slice of ``order`` that
    makes one chunk (see the module rules). One step per chunk, not per record."""
    import numpy as np

    order = np.argsort(channels, kind="stable")
    grouped = channels[order]
    cum = np.cumsum(sizes[order])
    bounds = np.flatnonzero(np.diff(grouped)) + 1
    runs: list[tuple[int, int]] = []
    for g0, g1 in zip([0, *bounds.tolist()], [*bounds.tolist(), len(order)], strict=True):
        start = g0
        while start < g1:
            before = int(cum[start - 1]) if start else 0
            fits = int(np.searchsorted(cum, before + max_bytes, side="right"))  # frames up to max_bytes
            end = max(start + 1, min(g1, start + max_records, fits))
            runs.append((start, end))
            start = end
    return order, runs


def encode_source_chunks(
    source_id: int, payloads: Sequence[bytes], key_hashes: Sequence[int], channels: Sequence[int], *,
    num_shards: int = 1,
    among: Sequence[int] | None = None,
) -> list[PackedChunk]:
    """New first-attempt source records as persist input: ids drawn per channel in chunks
    (spread over the shards, or over ``among``), fresh current ids, frames encoded.

    Record ``i`` has payload ``payloads[i]``, key hash ``key_hashes[i]`` and channel
    ``channels[i]``; its origin is its source record id, its replay count 0. A value
    that does not fit its frame field (a channel or source index outside 16 bits, a
    hash outside 64) raises ``SerializationError``.

    Up to :data:`PLAIN_MAX_RECORDS` records take :func:`encode_chunks_plain`, more
    :func:`encode_chunks_arrays`: for the same random draws both give the same chunks, byte for byte.
    """
    if len(payloads) > PLAIN_MAX_RECORDS:
        return encode_chunks_arrays(source_id, payloads, key_hashes, channels, num_shards=num_shards, among=among)
    # hashes and channels may come as numpy arrays (ingest): the plain encoder does its arithmetic on
    # Python ints (numpy scalars would wrap silently on overflow), and steps per record anyway
    key_hashes = key_hashes if isinstance(key_hashes, list) else list(map(int, key_hashes))
    channels = channels if isinstance(channels, list) else list(map(int, channels))
    return encode_chunks_plain(source_id, payloads, key_hashes, channels, num_shards=num_shards, among=among)


def _refused(n: int, problem: str) -> SerializationError:
    return SerializationError(f"cannot encode a batch of {n} source records as frames: {problem}")


def _plain_runs(sizes: list[int], channels: Sequence[int]) -> list[list[int]]:
    """The records grouped into chunks (the module rules, as :func:`chunk_runs`) by their frames'
    ``sizes``: lists of record indexes, by channel (ascending), batch order within one (a stable
    sort and ``groupby``: the loops in C)."""
    runs: list[list[int]] = []
    size_of = sizes.__getitem__
    for _, group in groupby(sorted(range(len(sizes)), key=channels.__getitem__), key=channels.__getitem__):
        members = list(group)
        if len(members) <= CHUNK_TARGET_RECORDS and sum(map(size_of, members)) <= CHUNK_MAX_BYTES:
            runs.append(members)  # the usual case: a channel's records make one chunk
            continue
        runs += split_run(members, sizes)
    return runs


def _packed(base: int, channel: int, cids: bytes, body: bytes, sids: tuple[int, ...]) -> PackedChunk:
    """One chunk as PERSIST takes it: its header, a clear settled bitmap, its records' initial ack
    values (``cids``: 8 bytes each, big-endian) and its frames (``body``), ended by their chunk CRC
    (``ftlayer.records.chunk_crc``: one ``zlib.crc32`` over the chunk, which the reader checks
    instead of every frame's)."""
    count = len(sids)
    key = ((base & _MASK64) >> INDEX_BITS).to_bytes(CHUNK_KEY_BYTES, "big")
    blob = chunk_blob(key, channel, n=count, pending=count, settled=bytes(bitmap_bytes(count)), cids=cids, body=body,
                      crc=True)
    return PackedChunk(key, blob, sids)


def encode_chunks_plain(
    source_id: int, payloads: Sequence[bytes], key_hashes: Sequence[int], channels: Sequence[int], *,
    num_shards: int = 1,
    among: Sequence[int] | None = None,
) -> list[PackedChunk]:
    """:func:`encode_source_chunks` without numpy: no set-up cost, each frame's parts made by
    ``map`` over the batch (the loops in C), so a small batch costs
    about what its records cost. The same ids drawn in the same order as
    :func:`encode_chunks_arrays` (chunk bases, then one current id per record in chunk order),
    so the same draws give the same bytes (property-tested)."""
    n = len(payloads)
    if n == 0:
        return []
    if len(key_hashes) != n or len(channels) != n:
        raise _refused(n, f"{n} payloads, {len(key_hashes)} key hashes and {len(channels)} channels")
    if not 0 <= source_id <= 0xFFFF:
        raise _refused(n, "a source index or channel outside 16 bits")
    lengths = list(map(len, payloads))
    try:
        runs = _plain_runs(list(map(HEADER_SIZE.__add__, lengths)), channels)
    except TypeError as exc:  # channels that do not compare: not integers
        raise _refused(n, str(exc)) from exc
    bases = new_chunk_bases(len(runs), None, num_shards, among)
    cids = new_ids(n)  # by position in chunk order, as the array path draws them
    order = [i for run in runs for i in run]
    ordered = [payloads[i] for i in order]
    sids = [base | index for run, base in zip(runs, bases, strict=True) for index in range(len(run))]
    chans = [channels[i] for i in order]
    try:
        covered = list(map(_COVERED.pack, repeat(FRAME_VERSION), repeat(0), repeat(source_id), sids, cids,
                           [key_hashes[i] for i in order], sids, repeat(0), chans))
        parts: list[bytes] = [b""] * (4 * n)  # each frame: body_len, the covered bytes, crc, payload
        parts[0::4] = list(map(_U32.pack, [lengths[i] + BODY_FIXED_SIZE for i in order]))
        parts[1::4] = covered
        parts[2::4] = list(map(_U32.pack, map(zlib.crc32, ordered, map(zlib.crc32, covered))))
        parts[3::4] = ordered
    except (struct.error, TypeError) as exc:  # a channel outside 16 bits, a hash outside 64
        raise _refused(n, "a source index or channel outside 16 bits, or a key hash outside 64") from exc
    out = []
    start = 0
    for run, base in zip(runs, bases, strict=True):
        end = start + len(run)
        out.append(_packed(base, chans[start], struct.pack(f">{end - start}q", *cids[start:end]),
                           b"".join(parts[4 * start : 4 * end]), tuple(sids[start:end])))
        start = end
    return out


@functools.lru_cache(maxsize=64)
def _covered_cut(n: int) -> struct.Struct:
    """A struct that cuts ``n`` frame headers, back to back, into their covered bytes ``[4:44)``."""
    return struct.Struct(f"{OFFSET_VERSION}x{OFFSET_CRC - OFFSET_VERSION}s{HEADER_SIZE - OFFSET_CRC}x" * n)


@functools.lru_cache(maxsize=64)
def _header_cut(n: int) -> struct.Struct:
    """A struct that cuts ``n`` frame headers, back to back, apart."""
    return struct.Struct(f"{HEADER_SIZE}s" * n)


def encode_chunks_arrays(
    source_id: int, payloads: Sequence[bytes], key_hashes: Sequence[int], channels: Sequence[int], *,
    num_shards: int = 1,
    among: Sequence[int] | None = None,
) -> list[PackedChunk]:
    """:func:`encode_source_chunks` over numpy arrays (the module notes): the cheaper per record."""
    import numpy as np

    n = len(payloads)
    if n == 0:
        return []
    problem = ""
    try:
        plen = np.fromiter(map(len, payloads), dtype=np.int64, count=n)
        hashes = np.asarray(key_hashes, dtype=np.int64)
        chans = np.asarray(channels, dtype=np.int64)
    except (ValueError, TypeError, OverflowError) as exc:
        problem = str(exc)
    else:
        if not 0 <= source_id <= 0xFFFF or chans.min() < 0 or chans.max() > 0xFFFF:
            problem = "a source index or channel outside 16 bits"
        elif len(hashes) != n or len(chans) != n:
            problem = f"{n} payloads, {len(hashes)} key hashes and {len(chans)} channels"
    if problem:
        raise _refused(n, problem)
    sizes = plen + HEADER_SIZE
    order, runs = chunk_runs(chans, sizes)
    bases = np.asarray(new_chunk_bases(len(runs), None, num_shards, among), dtype=np.int64)
    lengths = np.asarray([end - start for start, end in runs], dtype=np.int64)
    index = np.arange(n, dtype=np.int64) - np.repeat(np.asarray([s for s, _ in runs], dtype=np.int64), lengths)
    sids = np.repeat(bases, lengths) | index  # by position in order
    cids = new_id_array(n)  # by position in order
    head = np.zeros(n, dtype=header_dtype())
    head["body_len"] = plen[order] + BODY_FIXED_SIZE
    head["version"] = FRAME_VERSION
    head["src"] = source_id
    head["sid"] = sids
    head["cid"] = cids
    head["khash"] = hashes[order]
    head["origin"] = sids
    head["channel"] = chans[order]
    ordered = [payloads[i] for i in order.tolist()]
    # each frame's CRC: its 40 covered header bytes, cut out of the batch's headers by one struct call,
    # then its payload (two C calls a frame, run by map: cheaper than crc32_rows' ~60 array steps
    # below ~1,000 frames, the sizes a persist has)
    covered = map(zlib.crc32, _covered_cut(n).unpack(head.tobytes()))
    head["crc"] = np.fromiter(map(zlib.crc32, ordered, covered), dtype=np.uint32, count=n)
    heads = head.tobytes()
    # each chunk's frames back to back: header, payload, header, payload, ... (one join per chunk); the
    # headers cut apart by one struct call
    parts: list[bytes] = [b""] * (2 * n)
    parts[0::2] = _header_cut(n).unpack(heads)
    parts[1::2] = ordered
    out = []
    chans_o = chans[order]
    for (start, end), base in zip(runs, bases.tolist(), strict=True):
        out.append(_packed(base, int(chans_o[start]), cids[start:end].astype(">i8").tobytes(),
                           b"".join(parts[2 * start : 2 * end]), tuple(sids[start:end].tolist())))
    return out
