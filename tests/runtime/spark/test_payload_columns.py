"""Payloads to typed columns: values that fit become rows, a value that does not fit fails its record only."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from ftlayer.records.frames import encode_source_frames
from runtime.spark import payload_columns
from runtime.spark.arrow_codec import frames_to_record_batch
from runtime.spark.payload_columns import METADATA_COLUMN, decode_batch, decode_rows, metadata_type
from serialization.payload import pack_payload

SCHEMA = StructType([StructField("i", LongType()), StructField("user", StringType()),
                     StructField("ts", TimestampType()), StructField(METADATA_COLUMN, metadata_type())])
# a non-nullable column and no metadata column
NARROW = StructType([StructField("i", LongType(), nullable=False), StructField("user", StringType())])


def _raw(values: list[object]) -> object:
    return _raw_payloads([pack_payload(v) for v in values])


def _raw_payloads(payloads: list[bytes]) -> object:
    n = len(payloads)
    frames = encode_source_frames(0, list(range(1, 2 * n + 1)), [7] * n, payloads, [0] * n)
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


def test_a_page_that_fits_takes_the_bulk_path(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _raw([{"i": 1, "user": "a", "ts": 1_700_000_000}, {"i": 2, "ts": "2026-01-02T03:04:05"},
                {"i": 3, "user": "c", "ts": dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc), "x": [1]}])
    expected = decode_rows(raw, SCHEMA, "topo/src")

    def refuse(*_: object) -> None:
        raise AssertionError("the row path ran for a page that fits")

    monkeypatch.setattr(payload_columns, "decode_rows", refuse)
    assert _same(decode_batch(raw, SCHEMA, "topo/src"), expected)


def test_a_plain_page_is_read_by_msgspec(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _raw([{"i": 1, "user": "a", "ts": 1_700_000_000}, {"i": 2, "ts": "2026-01-02T03:04:05"},
                {"i": 3, "user": "c", "ts": dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)}, {}])
    expected = decode_rows(raw, SCHEMA, "topo/src")

    def refuse(*_: object) -> None:
        raise AssertionError("the msgpack path ran for a page of plain dicts")

    monkeypatch.setattr(payload_columns, "decode_rows", refuse)
    monkeypatch.setattr(payload_columns, "unpack_run", refuse)
    assert _same(decode_batch(raw, SCHEMA, "topo/src"), expected)


def test_a_page_with_a_misfit_takes_the_row_path(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _raw([{"i": 1, "user": "a"}, {"i": "x"}])
    calls: list[int] = []
    rows = payload_columns.decode_rows

    def counted(*args: object) -> object:
        calls.append(1)
        return rows(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(payload_columns, "decode_rows", counted)
    _, _, bad = decode_batch(raw, SCHEMA, "topo/src")
    assert calls == [1] and len(bad) == 1


def _same(a: tuple[Any, list[int], dict[int, str]], b: tuple[Any, list[int], dict[int, str]]) -> bool:
    return bool(a[0].equals(b[0])) and a[1] == b[1] and a[2] == b[2]


_cells = st.one_of(st.none(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=5),
                   st.booleans(), st.binary(max_size=3))
_ts = st.one_of(st.none(), st.integers(0, 4_000_000_000), st.floats(0, 4e9),
                st.sampled_from(["2026-01-02T03:04:05", "2026-01-02T03:04:05+02:00", "not a time"]),
                st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2100, 1, 1),
                             timezones=st.just(dt.timezone.utc)))
_values = st.one_of(
    st.fixed_dictionaries({"i": st.integers(-(2**63), 2**63 - 1), "user": st.one_of(st.none(), st.text(max_size=8)),
                           "ts": _ts}),
    st.fixed_dictionaries({}, optional={"i": _cells, "user": _cells, "ts": _ts, "extra": _cells}),
    _cells,
)


@settings(max_examples=120, deadline=None)
@given(st.lists(_values, max_size=12), st.sampled_from([SCHEMA, NARROW]))
@example([{}], NARROW)  # a null in a non-nullable column
@example([{"i": 1}, {"i": 2**64}], SCHEMA)  # a value out of the column's range
@example([{"i": 1}, "s"], SCHEMA)  # a payload that is not a dict
@example([], SCHEMA)
def test_bulk_and_row_paths_give_the_same_page(values: list[Any], schema: StructType) -> None:
    raw = _raw(values)
    assert _same(decode_batch(raw, schema, "topo/src"), decode_rows(raw, schema, "topo/src"))


_any_cells = st.one_of(
    _cells, st.decimals(allow_nan=False, places=2), st.uuids(), st.dates(), st.timedeltas(),
    st.tuples(st.integers()), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(),
                                                                                  max_size=1))
_any_ts = st.one_of(_ts, st.datetimes(), st.dates(), st.text(max_size=3))
_payloads = st.one_of(
    st.fixed_dictionaries({}, optional={"i": _any_cells, "user": _any_cells, "ts": _any_ts, "extra": _any_cells}
                          ).map(pack_payload),
    _any_cells.map(pack_payload),
    # other producers' msgpack: the standard timestamp (ext -1, ns), an array map key, a repeated key
    st.builds(lambda s, ns: msgpack.packb({"i": 1, "ts": msgpack.Timestamp(s, ns)}),
              st.integers(0, 2**33), st.integers(0, 999_999_999)),
    st.just(b"\x81\xa4user\x81\x91\x01\x02"),
    st.just(b"\x82\xa1i\x01\xa1i\x02"),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_payloads, max_size=10), st.sampled_from([SCHEMA, NARROW]))
@example([msgpack.packb({"i": 1, "ts": msgpack.Timestamp(0, 999)})], SCHEMA)  # msgspec would round it up
@example([pack_payload({"i": 1, "user": (1, 2)})], SCHEMA)
def test_bulk_and_row_paths_agree_on_any_payload(payloads: list[bytes], schema: StructType) -> None:
    raw = _raw_payloads(payloads)
    assert _same(decode_batch(raw, schema, "topo/src"), decode_rows(raw, schema, "topo/src"))
