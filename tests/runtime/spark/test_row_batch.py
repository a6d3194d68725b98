"""Columnar stage rows: decoding, anchoring and encoding agree with the row-by-row rules.

``reference_process`` is the rule a stage applies to each input row, written
one row at a time with :func:`ftlayer.records.ids.child_id`; the handler computes the
same over a whole batch with arrays. They must give the same rows, ids and
deltas for any mix of maps, filters, flat maps, failures and carrier rows.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.errors import FailRecord
from ftlayer.records.ids import child_id
from ftlayer.records.keyhash import NO_KEY_HASH
from runtime.spark.handlers import CARRIER, FTHandler, NonFTHandler, Row
from runtime.spark.row_batch import ROW_COLUMNS, RowBatch, decode_batch, encoded_to_arrow
from serialization.payload import pack_payload, unpack_payload

SCHEMA = pa.schema([("src", pa.int32()), ("sid", pa.int64()), ("cid", pa.int64()), ("origin", pa.int64()),
                    ("key_hash", pa.int64()), ("channel", pa.int32()), ("payload", pa.binary()), ("delta", pa.int64())])


def reference_process(rows: list[Row], chain: Callable[[Any], list[Any]], op: int) -> tuple[list[Row], set[int]]:
    """The stage rule, one row at a time: (output rows, sids of failed records)."""
    out: list[Row] = []
    failed: set[int] = set()
    for src, sid, cid, origin, value, carried in rows:
        if value is CARRIER:
            out.append((src, sid, 0, origin, CARRIER, carried))
            continue
        try:
            outputs = chain(value)
        except Exception:
            failed.add(sid)
            continue
        delta = carried ^ cid
        if not outputs:
            out.append((src, sid, 0, origin, CARRIER, delta))
            continue
        children = [child_id(cid, op, i) for i in range(len(outputs))]
        for c in children:
            delta ^= c
        out.extend((src, sid, children[i], origin, o, delta if i == 0 else 0) for i, o in enumerate(outputs))
    return out, failed


def chain_for(v: int) -> list[int]:
    """Outputs depend on the value: 0 to 3 of them, or a failure."""
    kind = v % 6
    if kind == 5:
        raise FailRecord(f"bad {v}")
    if kind == 4:
        return []
    return [v * 10 + j for j in range(kind if kind < 4 else 1)] or [v]


_I64 = st.integers(-(1 << 63), (1 << 63) - 1)
_ROW = st.tuples(st.integers(0, 2), _I64, _I64, _I64, st.one_of(st.just(None), st.integers(0, 1000)), _I64)


@settings(max_examples=150, deadline=None)
@given(st.lists(_ROW, max_size=40), st.integers(1, 1 << 21))
def test_process_batch_matches_the_row_rule(raw: list[tuple[int, int, int, int, int | None, int]], op: int) -> None:
    rows: list[Row] = [(s, sid, cid, o, CARRIER if v is None else v, d) for s, sid, cid, o, v, d in raw]
    handler = FTHandler(op)
    got = list(handler.process_batch(RowBatch.from_rows(rows), chain_for).rows())
    expected, failed = reference_process(rows, chain_for, op)
    assert got == expected
    assert set(handler.xors.fails.get(0, {})) | set(handler.xors.fails.get(1, {})) | set(
        handler.xors.fails.get(2, {})) == failed


def test_a_map_batch_takes_the_fast_path_with_the_same_result() -> None:
    rnd = random.Random(3)
    rows: list[Row] = [(0, rnd.getrandbits(64) - (1 << 63), rnd.getrandbits(64) - (1 << 63), 5, i, rnd.getrandbits(60))
                       for i in range(500)]
    got = list(FTHandler(9).process_batch(RowBatch.from_rows(rows), lambda v: [v + 1]).rows())
    assert got == reference_process(rows, lambda v: [v + 1], 9)[0]


def test_ft_off_drops_failed_records_and_repeats_rows_per_output() -> None:
    rows: list[Row] = [(1, 100 + i, 200 + i, 300 + i, i, 0) for i in range(12)]
    handler = NonFTHandler(3)
    got = list(handler.process_batch(RowBatch.from_rows(rows), chain_for).rows())
    expected = [(1, 100 + i, 200 + i, 300 + i, o, 0) for i in range(12) if i % 6 != 5
                for o in ([] if i % 6 == 4 else [i * 10 + j for j in range(i % 6 if i % 6 < 4 else 1)] or [i])]
    assert got == expected
    assert handler.dropped == {1: 2}


def _arrow(rows: list[tuple[int, int, int, int, bytes | None, int]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"src": s, "sid": sid, "cid": c, "origin": o, "key_hash": 0, "channel": 0, "payload": p, "delta": d}
         for s, sid, c, o, p, d in rows], schema=SCHEMA)


def test_decode_fails_only_the_record_whose_payload_is_bad() -> None:
    rb = _arrow([(0, 1, 11, 1, pack_payload("a"), 5), (0, 2, 12, 2, b"\xc1", 6), (0, 3, 13, 3, None, 7),
                 (0, 4, 14, 4, pack_payload({"k": [1]}), 8)])
    handler = FTHandler(1)
    batch = decode_batch(rb, handler, None)
    assert list(batch.rows()) == [(0, 1, 11, 1, "a", 5), (0, 3, 0, 3, CARRIER, 7), (0, 4, 14, 4, {"k": [1]}, 8)]
    assert list(handler.xors.fails[0]) == [2]


def test_decode_without_nulls_or_bad_payloads_keeps_every_row() -> None:
    rb = _arrow([(2, -i, i, i, pack_payload(i), i) for i in range(1, 50)])
    batch = decode_batch(rb, FTHandler(1), None)
    assert list(batch.rows()) == [(2, -i, i, i, i, i) for i in range(1, 50)]


_PAYLOAD = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 80), 1 << 80), st.floats(allow_nan=False),
              st.text(max_size=20), st.binary(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=80, deadline=None)
@given(values=st.lists(_PAYLOAD, min_size=1, max_size=30), kind=st.sampled_from(["binary", "large_binary"]),
       skip=st.integers(0, 3))
def test_decode_of_a_run_gives_each_payload_s_own_value(values: list[Any], kind: str, skip: int) -> None:
    """A batch without nulls is unpacked as one run over the column's buffer: the same values as each
    payload alone, for either binary type and for a batch that starts inside its buffers (sliced)."""
    rows = [(0, i + 1, i + 1, i + 1, pack_payload(v), 0) for i, v in enumerate(values)]
    rb = _arrow(rows)
    rb = rb.set_column(rb.schema.get_field_index("payload"), "payload", rb.column("payload").cast(getattr(pa, kind)()))
    rb = rb.slice(min(skip, len(rows) - 1))
    expected = [unpack_payload(r[4]) for r in rows[min(skip, len(rows) - 1):]]
    batch = decode_batch(rb, FTHandler(1), None)
    assert batch.values == expected


def test_a_bad_payload_in_a_run_still_fails_only_its_record() -> None:
    rb = _arrow([(0, i, i, i, pack_payload(i) if i != 3 else b"\x92\x01", 0) for i in range(1, 6)])
    handler = FTHandler(1)
    batch = decode_batch(rb, handler, None)
    assert batch.values == [1, 2, 4, 5]
    assert list(handler.xors.fails[0]) == [3]


def test_ft_off_decode_refuses_a_bad_payload() -> None:
    with pytest.raises(Exception, match="unpack"):
        decode_batch(_arrow([(0, 1, 1, 1, b"\xc1", 0)]), NonFTHandler(1), None)


def test_encoded_rows_go_to_their_key_channel_and_carriers_to_their_sid_channel() -> None:
    batch = RowBatch.from_rows([(0, 7, 1, 7, (b"p", 10), 3), (0, -9, 0, 2, CARRIER, 4), (1, 5, 2, 5, (b"q", -3), 0)])
    rb = encoded_to_arrow(batch, 4)
    assert rb.schema.names == list(ROW_COLUMNS)
    cols = rb.to_pydict()
    assert cols["channel"] == [10 % 4, -9 % 4, -3 % 4]
    assert cols["key_hash"] == [10, NO_KEY_HASH, -3]
    assert cols["payload"] == [b"p", None, b"q"]
    assert cols["cid"] == [1, 0, 2] and cols["delta"] == [3, 4, 0] and cols["src"] == [0, 0, 1]


def test_an_empty_batch_stays_empty() -> None:
    empty = RowBatch.from_rows([])
    assert len(FTHandler(1).process_batch(empty, lambda v: [v])) == 0
    assert encoded_to_arrow(empty, 2).num_rows == 0
    assert np.asarray(decode_batch(_arrow([]), FTHandler(1), None).sid).size == 0
