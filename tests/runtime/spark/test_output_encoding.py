"""A stage's outputs encoded for the whole batch: the same rows as record by record, and an output
that cannot be encoded still fails (FT on) or drops/raises (FT off) its own record only."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.errors import FailRecord
from ftlayer.records.keyhash import NO_KEY_HASH, key_hash
from runtime.spark.handlers import FTHandler, NonFTHandler, Row
from runtime.spark.output_encoding import OutputEncoder
from runtime.spark.row_batch import RowBatch
from runtime.spark.stages import Op, make_chain
from serialization.payload import pack_payload

_KEY = st.one_of(st.text(max_size=8), st.integers(-(1 << 63), (1 << 63) - 1), st.none(), st.booleans(),
                 st.tuples(st.text(max_size=3), st.integers(0, 9)))
_VALUE = st.dictionaries(st.sampled_from(["k", "a", "b"]), st.one_of(_KEY, st.floats(allow_nan=False)), min_size=1)


@settings(max_examples=100, deadline=None)
@given(st.lists(_VALUE, max_size=40), st.booleans())
def test_many_is_one_by_one(values: list[dict[str, Any]], keyed: bool) -> None:
    encoder = OutputEncoder((lambda v: v.get("k")) if keyed else None)
    assert encoder.many(values) == [encoder.one(v) for v in values]
    if values:
        assert encoder.one(values[0]) == (pack_payload(values[0]),
                                          key_hash(values[0].get("k")) if keyed else NO_KEY_HASH)


def _rows(values: list[Any]) -> list[Row]:
    return [(0, 100 + i, 1000 + i, 100 + i, v, 0) for i, v in enumerate(values)]


def _key(v: dict[str, Any]) -> Any:
    if v["i"] == 3:
        raise KeyError("no key for 3")
    return v["u"]


def test_a_record_whose_output_cannot_be_encoded_fails_alone() -> None:
    values = [{"i": i, "u": f"u{i}", "x": (object() if i == 5 else i)} for i in range(8)]
    chain = make_chain((Op("flat_map", lambda v: [v, v] if v["i"] % 2 else [v], 1),))
    batched = FTHandler(7).process_batch(RowBatch.from_rows(_rows(values)), chain, OutputEncoder(_key))
    handler = FTHandler(7)
    batch = handler.process_batch(RowBatch.from_rows(_rows(values)), chain, OutputEncoder(_key))
    assert sorted(handler.xors.fails[0]) == [103, 105]  # the key selector's record, msgpack's record
    kept = [v for v in values if v["i"] not in (3, 5)]
    expected = [(pack_payload(v), key_hash(v["u"])) for v in kept for _ in range(2 if v["i"] % 2 else 1)]
    assert batch.values == expected
    assert list(batched.rows()) == list(batch.rows())


def test_the_same_rows_and_deltas_as_encoding_each_record_in_its_chain() -> None:
    values = [{"i": i, "u": f"u{i % 4}"} for i in range(50)]
    chain = make_chain((Op("flat_map", lambda v: [v] * (v["i"] % 3), 1), Op("filter", lambda v: v["i"] != 7, 2)))
    encoder = OutputEncoder(lambda v: v["u"])
    got = FTHandler(4).process_batch(RowBatch.from_rows(_rows(values)), chain, encoder)
    per_record = FTHandler(4).process_batch(RowBatch.from_rows(_rows(values)),
                                            lambda v: [encoder.one(o) for o in chain(v)])
    assert list(got.rows()) == list(per_record.rows())


def test_ft_off_drops_a_record_whose_key_selector_raises_failrecord_and_raises_other_errors() -> None:
    def key(v: dict[str, Any]) -> Any:
        if v["i"] == 2:
            raise FailRecord("skip 2")
        return v["u"]

    values = [{"i": i, "u": f"u{i}"} for i in range(5)]
    handler = NonFTHandler(1)
    batch = handler.process_batch(RowBatch.from_rows(_rows(values)), make_chain((Op("map", lambda v: v, 1),)),
                                  OutputEncoder(key))
    assert [v[0] for v in batch.values] == [pack_payload(v) for v in values if v["i"] != 2]
    assert handler.dropped == {0: 1}
    with pytest.raises(Exception, match="object"):
        NonFTHandler(1).process_batch(RowBatch.from_rows(_rows([{"i": 0, "u": "a", "x": object()}])),
                                      make_chain((Op("map", lambda v: v, 1),)), OutputEncoder(None))
