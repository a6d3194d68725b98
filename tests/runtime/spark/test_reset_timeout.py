"""``ftlayer.reset_timeout()`` in a Topology operator, run by the real task handler (no JVM needed:
the handler is what a Python worker runs), against a real server with an injected clock."""

from __future__ import annotations

from typing import Any

import pytest

import ftlayer
from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from runtime.spark.handlers import handler_for
from runtime.spark.row_batch import RowBatch
from serialization.serializers import make_record
from tests.ftlayer.conftest import FakeClock, hand_out


def test_an_operator_that_resets_its_records_timeout_keeps_it_from_failing(
    ft_config: FTConfig, redis_client: Any,
) -> None:
    clock = FakeClock()
    layer = FTLayer(ft_config, "topo", "slowop", num_channels=1, clock=clock).open()
    recs = []
    for i in range(3):
        rec = make_record(layer, {"i": i}, key=f"k{i}")
        layer.persist([rec])  # one chunk each
        recs.append(rec)
    hand_out(layer)
    for _ in range(layer.config.num_buckets - 1):
        layer.on_timeout()
    handler = handler_for(True, 7)
    handler.layers = lambda: {0: layer}

    def slow_op(value: Any) -> list[Any]:
        if value["i"] == 1:
            ftlayer.reset_timeout()  # a long call ahead: restart this record's timeout
        return [value]

    rows = [(0, r.record_id.source_record_id, r.record_id.current_record_id, r.record_id.source_record_id,
             {"i": i}, 0) for i, r in enumerate(recs)]
    out = handler.process_batch(RowBatch.from_rows(rows), slow_op)
    assert len(out) == 3
    expired = set(layer.on_timeout().expired)
    assert expired == {recs[0].record_id.source_record_id, recs[2].record_id.source_record_id}


def test_reset_timeout_outside_an_operator_says_where_it_belongs() -> None:
    with pytest.raises(FTLayerError, match="from inside an operator function"):
        ftlayer.reset_timeout()


def test_reset_timeout_with_ft_off_does_nothing() -> None:
    handler = handler_for(False, 1)
    seen: list[Any] = []

    def op(value: Any) -> list[Any]:
        ftlayer.reset_timeout()
        seen.append(value)
        return [value]

    handler.process_batch(RowBatch.from_rows([(0, 1, 2, 1, {"i": 0}, 0)]), op)
    assert seen == [{"i": 0}]
