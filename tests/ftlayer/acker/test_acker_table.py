"""AckerTable against a real server: exact XOR, first-zero-only, late deltas, tokens."""

from __future__ import annotations

from ftlayer.acker.acker_table import combine_deltas
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.ids import child_id, new_ids
from serialization.serializers import make_record
from tests.ftlayer.conftest import commit_all


def test_fixed_sequence_of_xors_acks_exactly_on_the_last_one(layer: FTLayer) -> None:
    rec = make_record(layer, {"n": 1}, key="u1")
    layer.persist([rec])
    sid, root = rec.record_id
    a, b = child_id(root, 1, 0), child_id(root, 1, 1)
    c = child_id(a, 2, 0)
    steps = [root ^ a ^ b, a ^ c, b, c]
    # operator 1 anchors root, emits a and b, acks root; operator 2 consumes a, emits c;
    # the sink acks b and c.
    for i, step in enumerate(steps):
        result = layer.xor({sid: step})
        if i < len(steps) - 1:
            assert result.acked == [] and layer.acker.value(sid) is not None
        else:
            assert result.acked == [sid]
    assert layer.acker.value(sid) is None
    assert layer.stats()["acked"] == 1


def test_values_are_exact_64_bit(layer: FTLayer) -> None:
    rec = make_record(layer, "x")
    layer.persist([rec])
    sid = rec.record_id.source_record_id
    for delta in (-1, 2**63 - 1, -(2**63), 0x0123456789ABCDEF, 1):
        before = layer.acker.value(sid)
        assert before is not None
        if before ^ delta == 0:
            continue
        layer.xor({sid: delta})
        assert layer.acker.value(sid) == before ^ delta


def test_late_delta_for_acked_or_unknown_id_is_ignored(layer: FTLayer) -> None:
    rec = make_record(layer, "x")
    layer.persist([rec])
    sid, root = rec.record_id
    assert layer.ack({sid: root}).acked == [sid]
    late = layer.xor({sid: root, new_ids(1)[0]: 5})
    assert late.acked == [] and late.late == 2
    assert layer.acker.value(sid) is None
    assert layer.pending_count() == 0


def test_duplicate_token_is_skipped(layer: FTLayer) -> None:
    recs = [make_record(layer, i) for i in range(3)]
    layer.persist(recs)
    a = child_id(recs[0].record_id.current_record_id, 1, 0)
    delta = {recs[0].record_id.source_record_id: recs[0].record_id.current_record_id ^ a}
    first = layer.xor(delta, token="q1/b7/op1/p0")
    again = layer.xor(delta, token="q1/b7/op1/p0")
    assert first.applied and not again.applied
    assert layer.acker.value(recs[0].record_id.source_record_id) == a
    assert layer.stats()["duplicate_flushes"] == 1


def test_combine_deltas_cancels_and_drops_zero() -> None:
    assert combine_deltas([(1, 5), (1, 5), (2, 3), (2, 4)]) == {2: 7}


def test_chunked_flush_applies_everything_once(make_layer) -> None:  # type: ignore[no-untyped-def]
    layer = make_layer(flush_batch_size=7)
    recs = [make_record(layer, i) for i in range(50)]
    assert layer.persist(recs) == 50
    acks = {r.record_id.source_record_id: r.record_id.current_record_id for r in recs}
    result = layer.ack(acks, token="t")
    assert sorted(result.acked) == sorted(acks)
    assert not layer.ack(acks, token="t").applied
    assert layer.pending_count() == 0
    commit_all(layer)
    assert layer.leftovers() == []
