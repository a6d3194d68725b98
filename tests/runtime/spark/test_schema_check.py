"""A schema checked at ingest: the records the read would leave out, by position, with the read's reason."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from ftlayer.errors import ConfigError
from ftlayer.records.frames import encode_source_frames
from runtime.spark.arrow_codec import frames_to_record_batch
from runtime.spark.ddl import parse_schema
from runtime.spark.payload_columns import METADATA_COLUMN, decode_batch, metadata_type
from runtime.spark.schema_check import SchemaCheck
from serialization.payload import pack_payload

SCHEMA = StructType([StructField("i", LongType(), nullable=False), StructField("user", StringType()),
                     StructField("ts", TimestampType())])


def test_records_that_fit_pass_and_each_misfit_is_named_by_position() -> None:
    values: list[Any] = [
        {"i": 1, "user": "a", "ts": 1_700_000_000},
        {"i": "x", "user": "b"},  # a string in a bigint column
        "just a string",  # not a dict, for a schema of three columns
        {"user": "c"},  # no i: a null in a non-nullable column
        {"i": 4, "ts": "2026-01-02T03:04:05", "extra": [1, 2]},  # fits: extra keys are ignored
        {"i": 5, "ts": "not a time"},  # a timestamp that does not parse
    ]
    bad = SchemaCheck(SCHEMA)([pack_payload(v) for v in values])
    assert sorted(bad) == [1, 2, 3, 5]
    assert bad[1].startswith("column 'i' (bigint)"), bad[1]
    assert bad[2] == "payload is a str, not a dict of the 3 columns"
    assert bad[3] == "column 'i' is not nullable and the value is missing"
    assert "ValueError" in bad[5] and "not a time" in bad[5], bad[5]
    assert bad[5].startswith("column 'ts' (timestamp): "), bad[5]  # named by its column


@pytest.mark.parametrize("stamp", ["not a date", float("nan"), 10**13])
def test_a_timestamp_that_does_not_convert_is_named_by_its_column(stamp: Any) -> None:
    bad = SchemaCheck(parse_schema("i bigint, t timestamp"))([pack_payload({"i": 1, "t": stamp})])
    assert list(bad) == [0] and bad[0].startswith("column 't' (timestamp): "), bad


def test_a_float_with_a_fraction_does_not_fit_an_integer_column_at_any_depth() -> None:
    """pyarrow converts 2.5 into an integer column as 2 without an error: the check and the read refuse it."""
    check = SchemaCheck(parse_schema("i bigint, xs array<int>, s struct<n: smallint>, m map<string, bigint>"))
    values: list[Any] = [
        {"i": 2.5}, {"i": 1, "xs": [1, 2.5]}, {"i": 1, "s": {"n": 0.5}}, {"i": 1, "m": {"k": 1.25}},
        {"i": 2.0, "xs": [3.0], "s": {"n": 4.0}, "m": {"k": 5.0}},  # whole floats convert exactly: they fit
        {"i": 7, "xs": [1], "s": {"n": 1}, "m": {"k": 1}},
    ]
    bad, columns = check.with_columns([pack_payload(v) for v in values])
    assert sorted(bad) == [0, 1, 2, 3], bad
    assert bad[0].startswith("column 'i' (bigint): 2.5 holds a float with a fraction"), bad[0]
    assert bad[1].startswith("column 'xs' (array<int>)") and bad[3].startswith("column 'm' (map<string,bigint>)")
    assert columns.column("i").to_pylist() == [2, 7]
    # the read of the same frames leaves the same records out, with the same reasons
    payloads = [pack_payload(v) for v in values]
    raw = frames_to_record_batch(encode_source_frames(0, list(range(1, 13)), [7] * 6, payloads, [0] * 6))
    read_sids = raw.column("sid").to_pylist()
    _, kept, read_bad = decode_batch(raw, check.schema, "t/s")
    assert kept == read_sids[4:]
    assert {read_sids.index(sid): reason for sid, reason in read_bad.items()} == bad


def test_a_schema_that_names_a_column_twice_is_refused_when_the_check_is_made() -> None:
    with pytest.raises(ConfigError, match="names the column 'a' twice"):
        SchemaCheck(parse_schema("a int, a string"))


def test_a_batch_that_fits_gives_nothing() -> None:
    check = SchemaCheck(SCHEMA)
    assert check([pack_payload({"i": i, "user": f"u{i}", "ts": i}) for i in range(500)]) == {}
    assert check([]) == {}


def test_the_metadata_column_is_not_checked() -> None:
    with_meta = StructType([*SCHEMA.fields, StructField(METADATA_COLUMN, metadata_type(), nullable=False)])
    assert SchemaCheck(with_meta)([pack_payload({"i": 1})]) == {}


def test_a_schema_of_metadata_only_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least one column besides _ftlayer"):
        SchemaCheck(StructType([StructField(METADATA_COLUMN, metadata_type())]))


_VALUES = st.one_of(
    st.fixed_dictionaries({"i": st.integers(-(2**63), 2**63 - 1)},
                          optional={"user": st.one_of(st.text(max_size=5), st.integers()),
                                    "ts": st.integers(0, 2**31)}),
    st.fixed_dictionaries({"user": st.text(max_size=3)}),
    st.dictionaries(st.sampled_from(["i", "user", "x"]), st.one_of(st.none(), st.integers(), st.text(max_size=3),
                                                                  st.floats(allow_nan=False))),
    st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=2),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_VALUES, min_size=1, max_size=12))
def test_the_check_refuses_exactly_what_the_read_leaves_out(values: list[Any]) -> None:
    """The same payloads as frames of a page the FT source reads: the read's misfits (by sid) are the
    check's (by position), with the same reasons."""
    payloads = [pack_payload(v) for v in values]
    n = len(payloads)
    raw = frames_to_record_batch(encode_source_frames(0, list(range(1, 2 * n + 1)), [7] * n, payloads, [0] * n))
    read_sids = raw.column("sid").to_pylist()
    _, _, read_bad = decode_batch(raw, SCHEMA, "topo/src")
    check_bad = SchemaCheck(SCHEMA)(payloads)
    assert {read_sids.index(sid) for sid in read_bad} == set(check_bad)
    for sid, reason in read_bad.items():
        assert reason.endswith(check_bad[read_sids.index(sid)])


def test_the_values_that_fit_come_back_as_the_columns_ingest_keeps() -> None:
    check = SchemaCheck(parse_schema("i long, user string"))
    payloads = [pack_payload({"i": 1, "user": "a"}), pack_payload({"i": "x", "user": "b"}),
                pack_payload({"i": 3, "user": None})]
    bad, columns = check.with_columns(payloads)
    assert list(bad) == [1]
    assert columns.to_pylist() == [{"i": 1, "user": "a"}, {"i": 3, "user": None}]
    # a Topology source keeps none: its stages take Python values (runtime.topology)
    assert SchemaCheck(parse_schema("i long, user string"), keep_columns=False).with_columns(payloads)[1] is None


def test_a_topology_source_with_a_schema_keeps_no_columns() -> None:
    from ftlayer.config import FTConfig
    from runtime.topology import Topology

    topo = Topology("t", FTConfig())
    topo.source("clicks", [], schema="i long")
    (source,) = topo._graph.sources
    assert source.check is not None and source.check.keep_columns is False
