"""The row contracts: one table per row form; the DDL, StructType, Arrow schema and numpy dtypes
generated from it agree with one another, with Spark's and Arrow's own conversions, and with what
the sources and stages actually emit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from ftlayer.errors import ConfigError
from runtime.spark.row_contract import KINDS, SOURCE_ROW, STAGE_INPUT, STAGE_ROW, RowContract, stage_row_additions

# the four forms, read back as (name, kind) pairs, each through its own library
_SQL_KIND = {k.sql: name for name, k in KINDS.items()}
_SPARK_KIND = {k.spark: name for name, k in KINDS.items()}


def _from_ddl(ddl: str) -> list[tuple[str, str]]:
    out = []
    for part in ddl.split(","):
        name, sql = part.split()
        out.append((name, _SQL_KIND[sql]))
    return out


def _from_struct(contract: RowContract) -> list[tuple[str, str]]:
    return [(f.name, _SPARK_KIND[type(f.dataType).__name__]) for f in contract.struct_type().fields]


def _from_arrow(contract: RowContract) -> list[tuple[str, str]]:
    arrow_kind = {str(getattr(pa, k.arrow)()): name for name, k in KINDS.items()}
    return [(f.name, arrow_kind[str(f.type)]) for f in contract.arrow_schema()]


def _check_agree(contract: RowContract) -> None:
    table = list(contract.columns)
    assert _from_ddl(contract.ddl) == table
    assert _from_struct(contract) == table
    assert _from_arrow(contract) == table
    # Spark's own Arrow conversion of the StructType is the generated Arrow schema
    assert to_arrow_schema(contract.struct_type(), timezone="UTC").equals(contract.arrow_schema())
    # each fixed-width column's numpy dtype is its Arrow type's; binary has none
    dtypes = contract.numpy_dtypes()
    assert list(dtypes) == [n for n, k in table if k != "binary"]
    for f in contract.arrow_schema():
        if f.name in dtypes:
            assert dtypes[f.name] == np.dtype(f.type.to_pandas_dtype()), f.name
        else:
            with pytest.raises(ConfigError, match=f.name):
                contract.numpy_dtype(f.name)


@pytest.mark.parametrize("contract", [SOURCE_ROW, STAGE_ROW, STAGE_INPUT], ids=["source", "stage", "input"])
def test_each_generated_form_agrees_with_the_table(contract: RowContract) -> None:
    _check_agree(contract)


def test_the_contracts_are_the_rows_of_the_design() -> None:
    assert SOURCE_ROW.ddl == "sid long, cid long, key_hash long, origin long, replay int, channel int, payload binary"
    assert STAGE_ROW.ddl == ("src int, sid long, cid long, origin long, key_hash long, channel int, payload binary, "
                             "delta long")


def test_a_column_added_to_the_table_shows_up_in_all_four_forms() -> None:
    wider = RowContract((*STAGE_ROW.columns, ("extra", "int")))
    _check_agree(wider)
    assert wider.ddl.endswith(", extra int")
    assert wider.struct_type().fields[-1].name == "extra"
    assert wider.arrow_schema().field("extra").type == pa.int32()
    assert wider.numpy_dtypes()["extra"] == np.int32
    assert STAGE_ROW.names == wider.names[:-1]


def test_a_bad_table_is_refused() -> None:
    with pytest.raises(ConfigError, match="distinct names"):
        RowContract((("a", "int"), ("a", "long")))
    with pytest.raises(ConfigError, match="kinds"):
        RowContract((("a", "float"),))


def test_same_struct_compares_names_and_types_in_order() -> None:
    from pyspark.sql.types import IntegerType, StructField, StructType

    assert SOURCE_ROW.same_struct(SOURCE_ROW.struct_type())
    assert not SOURCE_ROW.same_struct(STAGE_ROW.struct_type())
    flipped = StructType(list(reversed(SOURCE_ROW.struct_type().fields)))
    assert not SOURCE_ROW.same_struct(flipped)
    retyped = StructType([StructField(f.name, IntegerType()) for f in SOURCE_ROW.struct_type().fields])
    assert not SOURCE_ROW.same_struct(retyped)


def test_what_the_sources_and_stages_emit_is_the_contract() -> None:
    """The FT source's frames, the feed source's chunks, a stage's output and the fused stage's
    input batches all carry the contract's Arrow schema."""
    from ftlayer.records.frames import encode_source_frames
    from runtime.spark.arrow_codec import frames_to_record_batch
    from runtime.spark.feed_source import chunk_batch
    from runtime.spark.row_batch import CARRIER, RowBatch, encoded_to_arrow

    frames = encode_source_frames(2, [11, 12, 21, 22], [5, -6], [b"\x01", b"\x02"], [0, 1])
    assert frames_to_record_batch(frames).schema.equals(SOURCE_ROW.arrow_schema())
    sids, hashes = np.array([1, 2], np.int64), np.array([3, 4], np.int64)
    offsets, data = np.array([0, 1, 2], np.int32), b"\x01\x02"
    feed = chunk_batch((1, 2, sids.tobytes(), hashes.tobytes(), offsets.tobytes(), data), 0, 0, 2)
    assert feed.schema.equals(SOURCE_ROW.arrow_schema())
    rows = RowBatch.from_rows([(1, 2, 3, 4, (b"\x01", 9), 5), (1, 6, 0, 6, CARRIER, 7)])
    out = encoded_to_arrow(rows, 4)
    assert out.schema.equals(STAGE_ROW.arrow_schema())
    for name, dtype in STAGE_ROW.numpy_dtypes().items():
        assert out.column(name).to_numpy().dtype == dtype, name


def test_fused_rows_are_stage_rows() -> None:
    from ftlayer.records.frames import encode_source_frames
    from runtime.spark.arrow_codec import frames_to_record_batch
    from runtime.spark.fused_read import FusedStage

    stage: Any = None  # _rows needs only the source index
    rb = frames_to_record_batch(encode_source_frames(0, [1, 2], [3], [b"\x90"], [0]))
    rows = FusedStage(5, stage)._rows(rb)
    assert rows.schema.equals(STAGE_ROW.arrow_schema())
    assert rows.column("src").to_pylist() == [5] and rows.column("delta").to_pylist() == [0]


def test_a_source_row_becomes_a_stage_row_by_the_additions_alone() -> None:
    added = stage_row_additions(3)
    assert set(added) == set(STAGE_ROW.names) - set(SOURCE_ROW.names)
    assert set(SOURCE_ROW.names) - set(STAGE_ROW.names) == {"replay"}  # dropped by the select
    assert all(SOURCE_ROW.kind(n) == STAGE_ROW.kind(n) for n in set(SOURCE_ROW.names) & set(STAGE_ROW.names))
    assert added == {"src": 3, "delta": 0}


def test_stage_input_is_exactly_what_a_stage_reads() -> None:
    """A keyed exchange and a union pass on STAGE_INPUT's columns alone: decoding them gives what
    decoding the whole STAGE_ROW batch gives, and each of them is needed."""
    from runtime.spark.handlers import NonFTHandler
    from runtime.spark.row_batch import CARRIER, RowBatch, decode_batch, encoded_to_arrow

    assert STAGE_INPUT.columns == tuple(c for c in STAGE_ROW.columns if c[0] not in ("key_hash", "channel"))
    full = encoded_to_arrow(RowBatch.from_rows([(1, 2, 3, 4, (b"\x01", 9), 5), (1, 6, 0, 6, CARRIER, 7)]), 4)
    narrow = full.select(list(STAGE_INPUT.names))
    got, want = decode_batch(narrow, NonFTHandler(0), None), decode_batch(full, NonFTHandler(0), None)
    assert list(got.rows()) == list(want.rows()) == [(1, 2, 3, 4, 1, 5), (1, 6, 0, 6, CARRIER, 7)]
    for name in STAGE_INPUT.names:
        with pytest.raises(KeyError):
            decode_batch(narrow.drop_columns([name]), NonFTHandler(0), None)
