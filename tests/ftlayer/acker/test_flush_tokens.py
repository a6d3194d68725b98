"""Flush tokens per micro-batch of a query: dedup within a batch, none across runs, clean-up (real server)."""

from __future__ import annotations

from collections.abc import Callable

from ftlayer.acker.flush_tokens import FlushToken, batch_key, delete_batch_tokens, stale_batches
from ftlayer.facade.ft_layer import FTLayer
from serialization.serializers import make_record


def test_a_token_dedups_within_its_batch_and_never_across_query_ids(layer: FTLayer) -> None:
    recs = [make_record(layer, i) for i in range(2)]
    layer.persist(recs)
    (a, ca), (b, cb) = (r.record_id for r in recs)
    old_run = FlushToken(batch_key("run-1", 0), "st2/p0/s0")
    assert layer.xor({a: ca}, token=old_run).acked == [a]
    assert not layer.xor({b: cb}, token=old_run).applied  # a retry of the same task: skipped
    new_run = FlushToken(batch_key("run-2", 0), "st2/p0/s0")  # same batch id, new checkpoint
    assert layer.xor({b: cb}, token=new_run).acked == [b]
    stats = layer.stats()
    assert stats["duplicate_flushes"] == 1 and stats["pending"] == 0


def test_chunked_flush_keeps_one_field_per_chunk_in_the_batch_hash(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(flush_batch_size=2)
    recs = [make_record(layer, i) for i in range(5)]
    layer.persist(recs)
    token = FlushToken(batch_key("q", 7), "st1/p3/s0")
    ids = {r.record_id.source_record_id: r.record_id.current_record_id for r in recs}
    assert len(layer.ack(ids, token=token).acked) == 5
    fields = layer.store.client.hkeys(layer.store.keys.token(token.batch))
    assert sorted(f.decode() for f in fields) == [f"st1/p3/s0#{i}" for i in range(3)]
    assert layer.store.client.pttl(layer.store.keys.token(token.batch)) > 0  # the TTL safety net


def test_delete_batch_tokens_removes_only_the_named_batches(layer: FTLayer) -> None:
    rec = make_record(layer, "x")
    layer.persist([rec])
    for batch in range(4):
        layer.xor({rec.record_id.source_record_id: 1 << batch}, token=FlushToken(batch_key("q", batch), "t"))
    layer.xor({rec.record_id.source_record_id: 1 << 9}, token=FlushToken(batch_key("other", 0), "t"))
    assert stale_batches(layer.store, "q", 2) == [0, 1, 2]
    assert delete_batch_tokens([layer.store], "q", [0, 1, 2]) == 3
    left = sorted(k.decode()[len(layer.store.keys.prefix):] for k in layer.store.client.scan_iter(
        match=layer.store.keys.prefix + "tok:*"))
    # the persist call's own token (tok:p:<hash>, ftlayer.acker.persistence) is not a flush token
    assert [k for k in left if not k.startswith("tok:p:")] == ["tok:other/0", "tok:q/3"]
