"""Payloads to typed columns: values that fit become rows, a value that does not fit fails its record only."""

from __future__ import annotations

import datetime as dt

from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from ftlayer.records.frames import encode_source_frames
from runtime.spark.arrow_codec import frames_to_record_batch
from runtime.spark.payload_columns import METADATA_COLUMN, decode_batch, metadata_type
from serialization.payload import pack_payload

SCHEMA = StructType([StructField("i", LongType()), StructField("user", StringType()),
                     StructField("ts", TimestampType()), StructField(METADATA_COLUMN, metadata_type())])


def _raw(values: list[object]) -> object:
    n = len(values)
    frames = encode_source_frames(0, list(range(1, 2 * n + 1)), [7] * n, [pack_payload(v) for v in values], [0] * n)
    return frames_to_record_batch(frames)


def test_rows_decode_and_misfits_are_reported_by_sid() -> None:
    raw = _raw([{"i": 1, "user": "a", "ts": 1_700_000_000},
                {"i": "x", "user": "b"},  # does not fit column i
                "just a string",  # not a dict for a three-column schema
                {"i": 4, "ts": "2026-01-02T03:04:05", "extra": 1}])
    batch, emitted, bad = decode_batch(raw, SCHEMA, "topo/src")
    sids = raw.column("sid").to_pylist()  # type: ignore[attr-defined]
    assert emitted == [sids[0], sids[3]]
    assert set(bad) == {sids[1], sids[2]}
    assert "column 'i'" in bad[sids[1]]
    rows = batch.to_pylist()
    assert [r["i"] for r in rows] == [1, 4]
    assert rows[1]["user"] is None
    assert rows[1]["ts"] == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert rows[0][METADATA_COLUMN]["source"] == "topo/src"
    assert rows[0][METADATA_COLUMN]["key_hash"] == 7
