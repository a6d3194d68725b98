"""Batch acks on a real server: settle a micro-batch's records without XOR deltas."""

from __future__ import annotations

from ftlayer.acker.batch_acks import CHUNKS_PER_ELEMENT, BatchAcks, batch_tag, batch_tags
from ftlayer.facade.ft_layer import FTLayer
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
