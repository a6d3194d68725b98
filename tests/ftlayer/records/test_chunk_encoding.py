"""Ingest's array encoding gives the same chunks as the per-record path, under the same rules."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.errors import SerializationError
from ftlayer.records.chunk_encoding import chunk_runs, encode_source_chunks
from ftlayer.records.chunks import CHUNK_IN_HEADER, assign_sids, bitmap_bytes, chunk_key, index_of, pack_record_chunks
from ftlayer.records.frames import SemiDeserializedSerializer, encode_source_frames

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
    first = _SER.decode(body[: 48 + 1])
    second = _SER.decode(body[48 + 1 :])
    assert (first.payload, first.key_hash, first.channel, first.source_id) == (b"\x01", 7, 2, 3)
    assert (second.payload, second.key_hash, second.record_id.source_record_id) == (b"\x02\x03", -8, chunk.sids[1])
    assert first.origin_id == first.record_id.source_record_id and first.replay_count == 0


def test_frames_that_fill_a_chunk_exactly_share_it() -> None:
    import numpy as np

    order, runs = chunk_runs(np.zeros(3, dtype=np.int64), np.asarray([500, 500, 1], dtype=np.int64), 10, 1000)
    assert [order[a:b].tolist() for a, b in runs] == [[0, 1], [2]]  # as assign_sids: used + size > max_bytes
    assert len({chunk_key(s) for s in assign_sids([0, 0, 0], [500, 500, 1], max_records=10, max_bytes=1000)}) == 2
