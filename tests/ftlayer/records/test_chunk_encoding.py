"""Ingest's array encoding gives the same chunks as the per-record path, under the same rules."""

from __future__ import annotations

import random
import struct
import zlib
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.errors import SerializationError
from ftlayer.records.chunk_encoding import (
    PLAIN_MAX_RECORDS,
    chunk_runs,
    encode_chunks_arrays,
    encode_chunks_plain,
    encode_source_chunks,
)
from ftlayer.records.chunks import (
    CHUNK_IN_HEADER,
    CHUNK_MAX_BYTES,
    CHUNK_TARGET_RECORDS,
    PackedChunk,
    assign_sids,
    bitmap_bytes,
    chunk_key,
    index_of,
    pack_record_chunks,
)
from ftlayer.records.frames import SemiDeserializedSerializer, encode_source_frames
from ftlayer.records.ids import _GENERATOR

_SER = SemiDeserializedSerializer()


def _cids(blob: bytes) -> list[int]:
    _, n, _, _, _ = CHUNK_IN_HEADER.unpack_from(blob)
    at = CHUNK_IN_HEADER.size + bitmap_bytes(n)
    return list(struct.unpack_from(f">{n}q", blob, at))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=300), st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, 5)),
                max_size=60), st.integers(0, 0xFFFF))
def test_chunks_equal_the_per_record_path_for_the_same_ids(records: list[tuple[bytes, int, int]], src: int) -> None:
    payloads = [p for p, _, _ in records]
    hashes = [h for _, h, _ in records]
    channels = [c for _, _, c in records]
    chunks = encode_source_chunks(src, payloads, hashes, channels)
    assert sum(len(c.sids) for c in chunks) == len(records)
    # the ids each record got, by batch order: the records of a channel in batch order
    got_sids: list[int] = []
    got_cids: list[int] = []
    by_channel: dict[int, list[int]] = {}
    for i, c in enumerate(channels):
        by_channel.setdefault(c, []).append(i)
    flat = [(sid, cid) for chunk in chunks for sid, cid in zip(chunk.sids, _cids(chunk.blob), strict=True)]
    where = [i for c in sorted(by_channel) for i in by_channel[c]]
    got_sids, got_cids = [0] * len(records), [0] * len(records)
    for (sid, cid), i in zip(flat, where, strict=True):
        got_sids[i], got_cids[i] = sid, cid
    ids = [v for pair in zip(got_sids, got_cids, strict=True) for v in pair]
    frames = encode_source_frames(src, ids, hashes, payloads, channels)
    expected = {c.key: c for c in pack_record_chunks(frames, got_sids, got_cids, channels)}
    assert {c.key: c for c in chunks} == expected
    for chunk in chunks:  # every frame decodes to its record
        assert [index_of(s) for s in chunk.sids] == list(range(len(chunk.sids)))
        assert len({chunk_key(s) for s in chunk.sids}) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 900)), max_size=80), st.integers(1, 7),
       st.integers(1, 3000))
def test_chunk_runs_follow_assign_sids(items: list[tuple[int, int]], max_records: int, max_bytes: int) -> None:
    import numpy as np

    channels = [c for c, _ in items]
    sizes = [s for _, s in items]
    order, runs = chunk_runs(np.asarray(channels, dtype=np.int64), np.asarray(sizes, dtype=np.int64),
                             max_records, max_bytes)
    mine = sorted(tuple(order[a:b].tolist()) for a, b in runs)
    sids = assign_sids(channels, sizes, max_records=max_records, max_bytes=max_bytes)
    groups: dict[int, list[int]] = {}
    for i, sid in enumerate(sids):
        groups.setdefault(chunk_key(sid), []).append(i)
    assert mine == sorted(tuple(g) for g in groups.values())


def test_an_empty_batch_has_no_chunks() -> None:
    assert encode_source_chunks(0, [], [], []) == []


@pytest.mark.parametrize(("src", "channels", "hashes"), [
    (70_000, [0], [1]), (0, [-1], [1]), (0, [70_000], [1]), (0, [0], [1 << 64]), (0, [0, 1], [1]),
])
def test_values_outside_their_fields_are_refused(src: int, channels: list[int], hashes: list[int]) -> None:
    with pytest.raises(SerializationError, match="cannot encode a batch"):
        encode_source_chunks(src, [b"\x01"] * len(channels), hashes, channels)


def test_frames_carry_their_record() -> None:
    (chunk,) = encode_source_chunks(3, [b"\x01", b"\x02\x03"], [7, -8], [2, 2])
    _, n, channel, _, flen = CHUNK_IN_HEADER.unpack_from(chunk.blob)
    assert (n, channel) == (2, 2)
    body = chunk.blob[-flen:]
    assert flen == 48 + 1 + 48 + 2 + 4  # two frames, then the chunk's CRC over them
    assert body[-4:] == struct.pack(">I", zlib.crc32(body[:-4]))
    first = _SER.decode(body[: 48 + 1])
    second = _SER.decode(body[48 + 1 : -4])
    assert (first.payload, first.key_hash, first.channel, first.source_id) == (b"\x01", 7, 2, 3)
    assert (second.payload, second.key_hash, second.record_id.source_record_id) == (b"\x02\x03", -8, chunk.sids[1])
    assert first.origin_id == first.record_id.source_record_id and first.replay_count == 0


def test_frames_that_fill_a_chunk_exactly_share_it() -> None:
    import numpy as np

    order, runs = chunk_runs(np.zeros(3, dtype=np.int64), np.asarray([500, 500, 1], dtype=np.int64), 10, 1000)
    assert [order[a:b].tolist() for a, b in runs] == [[0, 1], [2]]  # as assign_sids: used + size > max_bytes
    assert len({chunk_key(s) for s in assign_sids([0, 0, 0], [500, 500, 1], max_records=10, max_bytes=1000)}) == 2


def _seeded(seed: int, encode: Any, *args: Any, **kwargs: Any) -> list[PackedChunk]:
    """``encode(*args, **kwargs)`` with the id generator and the shard pick's ``os.urandom`` seeded by ``seed``."""
    draws = random.Random(seed)
    with _GENERATOR._lock:
        _GENERATOR._rng.seed(seed)
    with mock.patch("ftlayer.records.chunks.os.urandom", draws.randbytes):
        out: list[PackedChunk] = encode(*args, **kwargs)
        return out


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=400), st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, 5)),
                max_size=80), st.integers(0, 0xFFFF), st.integers(1, 4), st.integers(0, 1 << 30))
def test_the_plain_path_gives_the_array_paths_bytes(records: list[tuple[bytes, int, int]], src: int,
                                                      num_shards: int, seed: int) -> None:
    payloads = [p for p, _, _ in records]
    hashes = [h for _, h, _ in records]
    channels = [c for _, _, c in records]
    plain = _seeded(seed, encode_chunks_plain, src, payloads, hashes, channels, num_shards=num_shards)
    arrays = _seeded(seed, encode_chunks_arrays, src, payloads, hashes, channels, num_shards=num_shards)
    assert plain == arrays
    assert [c.blob for c in plain] == [c.blob for c in arrays]  # the same chunks in the same order


def test_the_plain_path_splits_chunks_as_the_array_path() -> None:
    """Chunks past CHUNK_TARGET_RECORDS records or CHUNK_MAX_BYTES bytes, and a frame larger than a chunk."""
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.choice((3, 40, 900))) for _ in range(4000)] + [bytes(CHUNK_MAX_BYTES + 5)]
    payloads += [rng.randbytes(300_000) for _ in range(8)]
    channels = [rng.randrange(3) for _ in payloads]
    hashes = [rng.getrandbits(63) for _ in payloads]
    plain = _seeded(11, encode_chunks_plain, 9, payloads, hashes, channels, num_shards=3, among=[0, 2])
    arrays = _seeded(11, encode_chunks_arrays, 9, payloads, hashes, channels, num_shards=3, among=[0, 2])
    assert len(plain) >= 9 and plain == arrays
    assert max(len(c.sids) for c in plain) == CHUNK_TARGET_RECORDS


@pytest.mark.parametrize(("src", "channels", "hashes"), [
    (70_000, [0], [1]), (0, [-1], [1]), (0, [70_000], [1]), (0, [0], [1 << 64]), (0, [0], [-(1 << 63) - 1]),
    (0, [0, 1], [1]), (0, [0.5], [1]),
])
def test_the_plain_path_refuses_values_outside_their_fields(src: int, channels: list[Any], hashes: list[int]) -> None:
    with pytest.raises(SerializationError, match="cannot encode a batch"):
        encode_chunks_plain(src, [b"\x01"] * len(channels), hashes, channels)


def test_a_batch_takes_the_plain_path_up_to_its_bound() -> None:
    payloads = [b"\x01"] * (PLAIN_MAX_RECORDS + 1)
    with mock.patch("ftlayer.records.chunk_encoding.encode_chunks_arrays", side_effect=AssertionError("arrays")):
        assert len(encode_source_chunks(0, payloads[:-1], [0] * PLAIN_MAX_RECORDS, [0] * PLAIN_MAX_RECORDS)) == 1
        with pytest.raises(AssertionError, match="arrays"):
            encode_source_chunks(0, payloads, [0] * len(payloads), [0] * len(payloads))


_QUARTER = CHUNK_MAX_BYTES // 4 - 48  # a payload whose frame is a quarter of a chunk's bytes


@pytest.mark.parametrize(("sizes", "chunks"), [
    ([1] * CHUNK_TARGET_RECORDS, 1), ([1] * (CHUNK_TARGET_RECORDS + 1), 2),  # one record past a chunk's count
    ([_QUARTER] * 4, 1), ([_QUARTER] * 3 + [_QUARTER + 1], 2),  # one byte past a chunk's size
])
def test_the_plain_path_cuts_at_a_chunks_bounds_exactly(sizes: list[int], chunks: int) -> None:
    payloads = [bytes(size) for size in sizes]
    n = len(payloads)
    plain = _seeded(3, encode_chunks_plain, 0, payloads, [0] * n, [1] * n)
    arrays = _seeded(3, encode_chunks_arrays, 0, payloads, [0] * n, [1] * n)
    assert plain == arrays
    assert len(plain) == chunks
