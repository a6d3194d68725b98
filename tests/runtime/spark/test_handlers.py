"""In-band deltas: what stages carry on their rows adds up, at the sink, to each tree's root id.

Pure handler logic (no Spark, no Redis): rows go through chained
``FTHandler.process`` calls the way they go through fused stages and exchanges,
the sink acks what it receives, and the XOR the sink would flush per source
record must equal the record's root current id (its initial ack value), so
the record completes exactly when every row reached the sink.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.spark.handlers import CARRIER, FTHandler, Row
from runtime.spark.row_batch import Fanout, RowBatch
from runtime.spark.stages import Op, make_chain


def _sink(rows: list[Row]) -> dict[int, int]:
    handler = FTHandler(99)  # what a sink does: carriers now, record rows acked after the write
    handler.ack([(src, sid, cid ^ delta) for src, sid, cid, _, _, delta in handler.receive(rows)])
    return {sid: v for sid, v in handler.xors.deltas.get(0, {}).items() if v}


def _roots(n: int, seed: int) -> list[Row]:
    rnd = random.Random(seed)
    out: list[Row] = []
    for i in range(n):
        sid, cid = rnd.getrandbits(63) + 1, rnd.getrandbits(63) + 1
        sid, cid = (-sid if i % 2 else sid), (-cid if i % 3 else cid)  # ids are signed
        out.append((0, sid, cid, sid, i, 0))
    return out


def _stage(rows: list[Row], op_id: int, kind: str, rnd: random.Random) -> list[Row]:
    if kind == "filter":
        chain = make_chain((Op("filter", lambda v: v % 3 != 0, op_id),))
    elif kind == "flat_map":
        chain = make_chain((Op("flat_map", lambda v: [v] * (v % 3), op_id),))
    else:
        chain = make_chain((Op("map", lambda v: v + 1, op_id),))
    out = list(FTHandler(op_id).process_batch(RowBatch.from_rows(rows), chain).rows())
    rnd.shuffle(out)  # an exchange reorders rows and cuts batches differently
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["map", "filter", "flat_map"]), min_size=1, max_size=4), st.integers(0, 10_000))
def test_carried_deltas_add_up_to_the_root_at_the_sink(kinds: list[str], seed: int) -> None:
    rnd = random.Random(seed)
    roots = _roots(30, seed)
    rows = roots
    for op_id, kind in enumerate(kinds, start=1):
        rows = _stage(rows, op_id, kind, rnd)
    flushed = _sink(rows)
    assert flushed == {sid: cid for _, sid, cid, _, _, _ in roots}


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_a_lost_row_leaves_its_record_pending(seed: int) -> None:
    rnd = random.Random(seed)
    roots = _roots(20, seed)
    rows = _stage(_stage(roots, 1, "flat_map", rnd), 2, "map", rnd)
    lost = rows.pop(rnd.randrange(len(rows))) if rows else None
    flushed = _sink(rows)
    expected = {sid: cid for _, sid, cid, _, _, _ in roots}
    if lost is not None:
        assert flushed.get(lost[1]) != expected[lost[1]]  # never completes early
        del expected[lost[1]]
        flushed.pop(lost[1], None)
    assert flushed == expected


def test_fanout_copies_apply_the_carried_delta_once() -> None:
    import pyarrow as pa

    from runtime.spark.row_batch import decode_batch
    from serialization.payload import pack_payload

    roots = _roots(10, 7)
    stage1 = _stage(roots, 1, "filter", random.Random(1))
    batch = pa.RecordBatch.from_pylist(
        [{"src": s, "sid": sid, "cid": c, "origin": o, "key_hash": 0, "channel": 0,
          "payload": None if v is CARRIER else pack_payload(v), "delta": d}
         for s, sid, c, o, v, d in stage1],
        schema=pa.schema([("src", pa.int32()), ("sid", pa.int64()), ("cid", pa.int64()), ("origin", pa.int64()),
                          ("key_hash", pa.int64()), ("channel", pa.int32()), ("payload", pa.binary()),
                          ("delta", pa.int64())]),
    )
    both: list[Row] = []
    for index in range(2):  # the two consumers of a diamond read the same upstream rows
        handler: Any = FTHandler(10 + index)
        rows = list(decode_batch(batch, handler, Fanout(1 << 20, index, 2)).rows())
        chain = make_chain((Op("map", lambda v: v, 10 + index),))
        both += list(handler.process_batch(RowBatch.from_rows(rows), chain).rows())
    assert _sink(both) == {sid: cid for _, sid, cid, _, _, _ in roots}
