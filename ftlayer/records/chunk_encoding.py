"""Ingest's hot path: a batch of new source records to persist-ready chunks, over arrays.

:func:`encode_source_chunks` gives, for a batch of packed values, exactly the
chunks that drawing the ids with :func:`ftlayer.records.chunks.assign_sids`, encoding
each frame with :func:`ftlayer.records.frames.encode_source_frames` and packing them
with :func:`ftlayer.records.chunks.pack_record_chunks` would give for the same ids
(property-tested against that path). The difference is cost: the frame
headers of the whole batch are one numpy structured array, and so are their ids
(:func:`ftlayer.records.ids.new_id_array`, no Python int per id); the CRC-32 of the 40 covered header bytes is
computed for every frame at once (:func:`ftlayer.records.crc_arrays.crc32_rows`), and only its
continuation over the payload is a call per record (``zlib.crc32``, in C, run by ``map``); the
headers are cut apart by one ``struct`` call and each chunk's frames are joined once. On the
driver this takes the encoding of a small record from about 1.2 µs (a CRC call on a
memoryview slice per frame) to about 0.7.

Chunk rules (as ``assign_sids``): the records of one channel, in batch order,
fill chunks of at most ``CHUNK_TARGET_RECORDS`` records and ``CHUNK_MAX_BYTES``
bytes of frames (a larger frame alone); every chunk gets a fresh random id
(:func:`ftlayer.records.chunks.new_chunk_bases`, spread over the shards in turn) and
its records the indexes 0, 1, ... in batch order.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Any

from ftlayer.errors import SerializationError
from ftlayer.records.chunks import (
    CHUNK_IN_HEADER,
    CHUNK_KEY_BYTES,
    CHUNK_MAX_BYTES,
    CHUNK_TARGET_RECORDS,
    INDEX_BITS,
    PackedChunk,
    bitmap_bytes,
    new_chunk_bases,
)
from ftlayer.records.crc_arrays import crc32_rows
from ftlayer.records.frames import (
    BODY_FIXED_SIZE,
    FRAME_VERSION,
    HEADER_SIZE,
    OFFSET_CRC,
    OFFSET_VERSION,
    header_dtype,
)
from ftlayer.records.ids import new_id_array

__all__ = ["encode_source_chunks"]

_MASK64 = (1 << 64) - 1


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
    """
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
        msg = f"cannot encode a batch of {n} source records as frames: {problem}"
        raise SerializationError(msg)
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
    # each frame's CRC: the 40 covered header bytes of every frame at once, then its payload (a C call each)
    covered = crc32_rows(head.view(np.uint8).reshape(n, HEADER_SIZE)[:, OFFSET_VERSION:OFFSET_CRC]).tolist()
    head["crc"] = np.fromiter(map(zlib.crc32, ordered, covered), dtype=np.uint32, count=n)
    heads = head.tobytes()
    # each chunk's frames back to back: header, payload, header, payload, ... (one join per chunk); the
    # headers cut apart by one struct call
    parts: list[bytes] = [b""] * (2 * n)
    parts[0::2] = struct.Struct(f"{HEADER_SIZE}s" * n).unpack(heads)
    parts[1::2] = ordered
    out = []
    chans_o = chans[order]
    for (start, end), base in zip(runs, bases.tolist(), strict=True):
        count = end - start
        key = ((base & _MASK64) >> INDEX_BITS).to_bytes(CHUNK_KEY_BYTES, "big")
        body = b"".join(parts[2 * start : 2 * end])
        blob = b"".join((CHUNK_IN_HEADER.pack(key, count, int(chans_o[start]), count, len(body)),
                         bytes(bitmap_bytes(count)), cids[start:end].astype(">i8").tobytes(), body))
        out.append(PackedChunk(key, blob, tuple(sids[start:end].tolist())))
    return out
