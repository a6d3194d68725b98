"""Batch acks on a real server: settle a micro-batch's records without XOR deltas."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.acker.batch_acks import (
    CHUNKS_PER_ELEMENT,
    DENSE_IDS_PER_CHUNK,
    BatchAcks,
    batch_tag,
    batch_tags,
    chunk_bitmaps,
)
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.chunks import chunk_key, index_of, sid_at
from serialization.serializers import make_record


def _persisted(layer: FTLayer, n: int) -> list[int]:
    recs = [make_record(layer, i, key=f"k{i}") for i in range(n)]
    layer.persist(recs)
    return [r.record_id.source_record_id for r in recs]


def test_ack_completes_listed_records_and_skips_failed_ones(layer: FTLayer) -> None:
    sids = _persisted(layer, 10_000)
    acks = BatchAcks(layer.store)
    tag = batch_tag({"ch0": "5-0", "ch1": "6-0"})
    acks.record(tag, sids[:6000], ("q1", 7))
    acks.record(tag, sids[:6000], ("q1", 7))  # a retried task files its ids again
    acks.record(tag, sids[6000:9000], ("q1", 7))
    assert layer.fail(sids[:10], "row function raised") == 10  # failed by a row function first
    assert acks.settle(tag, "ack") == 9000 - 10
    stats = layer.stats()
    assert stats["acked"] == 8990
    assert stats["failed_explicit"] == 10
    assert layer.pending_count() == 1000  # not listed: still pending
    assert not layer.store.client.exists(layer.store.keys.batch_reads(tag))
    assert acks.settle(tag, "ack") == 0  # idempotent
    assert batch_tags(layer.store.client, layer.config.namespace, "q1", 7) == [("topo/src", tag)]
    assert batch_tags(layer.store.client, layer.config.namespace, "q1", 8) == []
    # the bucket counts follow: only the 1000 unlisted records remain filed
    counts = {k: int(v) for k, v in layer.store.client.hgetall(layer.store.keys.bcnt).items()}
    assert sum(counts.values()) == 1000


def test_fail_moves_listed_records_to_replay(layer: FTLayer) -> None:
    sids = _persisted(layer, 3 * CHUNKS_PER_ELEMENT + 5)
    acks = BatchAcks(layer.store)
    acks.record("t2", sids)
    assert acks.settle("t2", "fail", "write failed: boom") == len(sids)
    assert layer.pending_count() == 0
    assert layer.store.client.hlen(layer.store.keys.failed) == len(sids)
    assert layer.stats()["acked"] == 0
    assert acks.settle("t2", "ack") == 0  # the failed batch acks nothing later


def test_batch_tag_is_the_same_for_the_same_end_offset_and_differs_otherwise() -> None:
    a = batch_tag({"ch0": "10-0", "ch1": "12-3"})
    assert a == batch_tag({"ch1": "12-3", "ch0": "10-0"})  # key order does not matter
    assert a != batch_tag({"ch0": "10-0", "ch1": "12-4"})
    assert len(a) == 16 and int(a, 16) >= 0


def _bitmaps_model(sids: list[int]) -> list[bytes]:
    """chunk_bitmaps as its contract says it, one id at a time."""
    groups: dict[bytes, bytearray] = {}
    for sid in sids:
        key, i = chunk_key(sid), index_of(sid)
        bits = groups.setdefault(key, bytearray())
        if len(bits) < (i >> 3) + 1:
            bits.extend(bytes((i >> 3) + 1 - len(bits)))
        bits[i >> 3] |= 1 << (i & 7)
    return [key + struct.pack(">H", len(bits)) + bytes(bits) for key, bits in groups.items()]


_chunk_ids = st.sampled_from([sid_at(k.to_bytes(6, "big"), 0) for k in (1, 2**47 + 5, 2**48 - 1, 77)])


@settings(max_examples=150)
@given(st.lists(st.tuples(_chunk_ids, st.integers(0, 1023)), max_size=60))
def test_chunk_bitmaps_list_each_chunk_once_in_first_seen_order(pairs: list[tuple[int, int]]) -> None:
    sids = [base | i for base, i in pairs]  # few ids a chunk: mostly the loop over the ids
    assert chunk_bitmaps(sids) == _bitmaps_model(sids)


@settings(max_examples=60)
@given(st.lists(st.tuples(_chunk_ids, st.integers(0, 1023)), min_size=4 * DENSE_IDS_PER_CHUNK, max_size=600))
def test_chunk_bitmaps_of_dense_chunks_match_too(pairs: list[tuple[int, int]]) -> None:
    sids = [base | i for base, i in pairs]  # at least DENSE_IDS_PER_CHUNK a chunk: the array path
    assert chunk_bitmaps(sids) == _bitmaps_model(sids)


def test_chunk_bitmaps_of_a_read() -> None:
    a, b = sid_at(b"\x80\x00\x00\x00\x00\x01", 0), sid_at(b"\x00\x00\x00\x00\x00\x02", 0)  # a is negative
    got = chunk_bitmaps([a | 9, b | 0, a | 0, a | 9, b | 15])
    assert got == [b"\x80\x00\x00\x00\x00\x01" + b"\x00\x02" + bytes([0b1, 0b10]),
                   b"\x00\x00\x00\x00\x00\x02" + b"\x00\x02" + bytes([0b1, 0b10000000])]
    assert chunk_bitmaps([]) == []
