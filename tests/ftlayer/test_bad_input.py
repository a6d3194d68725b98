"""The public API refuses bad input whole: documented FTLayerError subclasses, nothing applied."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ftlayer.errors import FTLayerError, InvalidArgumentError, InvalidIdError
from ftlayer.facade.ft_layer import FTLayer
from serialization.serializers import make_record


@pytest.mark.parametrize(
    "deltas",
    [
        {"1": 5},  # id of the wrong type
        {1: 1.5},  # delta of the wrong type
        {1: None},
        {1: 2**64},  # outside signed 64 bits
        {-(2**63) - 1: 3},
        [(1, "x")],  # pairs form
        [(1, 2, 3)],
        5,  # neither a mapping nor pairs
    ],
)
def test_wrong_typed_ids_or_deltas_raise_invalid_id_error(layer: FTLayer, deltas: Any) -> None:
    rec = make_record(layer, "v")
    layer.persist([rec])
    sid = rec.record_id.source_record_id
    with pytest.raises(InvalidIdError) as info:
        layer.xor(deltas, token="t1")
    assert isinstance(info.value, FTLayerError)
    assert "nothing was applied" in str(info.value) or "deltas must be" in str(info.value)
    assert layer.acker.value(sid) == rec.record_id.current_record_id
    # the token was not spent: the corrected flush still applies
    assert layer.ack({sid: rec.record_id.current_record_id}, token="t1").acked == [sid]


def test_wrong_typed_fail_ids_and_reasons_raise(layer: FTLayer) -> None:
    rec = make_record(layer, "v")
    layer.persist([rec])
    sid = rec.record_id.source_record_id
    with pytest.raises(InvalidIdError):
        layer.fail(["not-an-id"])
    with pytest.raises(InvalidIdError):
        layer.fail(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="reason"):
        layer.xor({}, fails={sid: 42})  # type: ignore[dict-item]
    with pytest.raises(InvalidIdError):
        layer.acker.value("x")  # type: ignore[arg-type]
    assert layer.pending_count() == 1 and layer.stats()["failed_explicit"] == 0


def test_a_chunked_flush_with_a_bad_delta_in_a_later_chunk_applies_nothing(
    make_layer: Callable[..., FTLayer],
) -> None:
    layer = make_layer(flush_batch_size=2)
    recs = [make_record(layer, i) for i in range(5)]
    layer.persist(recs)
    acks: dict[int, Any] = {r.record_id.source_record_id: r.record_id.current_record_id for r in recs}
    last = max(acks)  # chunks are sorted by id: the largest id is in the last chunk
    acks[last] = "bad"
    with pytest.raises(InvalidIdError, match=str(last)):
        layer.ack(acks, token="flush-1")
    assert layer.pending_count() == 5
    assert layer.stats()["acked"] == 0
    for r in recs:
        assert layer.acker.value(r.record_id.source_record_id) == r.record_id.current_record_id


def test_persist_refuses_a_non_record_or_a_record_with_a_bad_id_before_writing(layer: FTLayer) -> None:
    good = make_record(layer, "ok", channel=0)
    with pytest.raises(InvalidArgumentError, match="record 1"):
        layer.persist([good, "not a record"])  # type: ignore[list-item]
    assert layer.pending_count() == 0
