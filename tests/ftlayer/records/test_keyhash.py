from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftlayer.errors import KeyHashError
from ftlayer.records.keyhash import key_hash


def test_known_vector() -> None:
    # Spark SQL: SELECT xxhash64('hello') = -4367754540140381902
    assert key_hash("hello") == -4367754540140381902


def test_null_hashes_to_the_seed() -> None:
    assert key_hash(None) == 42


@given(st.text())
def test_str_and_utf8_bytes_hash_alike(s: str) -> None:
    assert key_hash(s) == key_hash(s.encode("utf-8"))


def test_refuses_unhashable_types() -> None:
    with pytest.raises(KeyHashError, match="set"):
        key_hash({1, 2})
    with pytest.raises(KeyHashError, match="64 bits"):
        key_hash(2**70)


def _keys() -> list[str]:
    rng = random.Random(7)
    alphabet = "abcxyzABC019 _-é€日本語😀\u0000"
    keys = ["", " ", "a", "user-1", "日本", "😀", "\u0000", "x" * 1000]
    keys += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    return keys


@pytest.mark.spark
def test_matches_spark_xxhash64_for_strings_binary_ints_and_tuples(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import types as T

    keys = _keys()
    rng = random.Random(11)
    ints = [0, 1, -1, 2**63 - 1, -(2**63)] + [rng.randint(-(2**63), 2**63 - 1) for _ in range(500)]
    schema = T.StructType(
        [
            T.StructField("s", T.StringType()),
            T.StructField("b", T.BinaryType()),
            T.StructField("i", T.LongType()),
        ]
    )
    rows = [(k, k.encode("utf-8"), ints[n % len(ints)]) for n, k in enumerate(keys)]
    df = spark.createDataFrame(rows, schema)
    got = df.selectExpr(
        "s", "i", "xxhash64(s) AS hs", "xxhash64(b) AS hb", "xxhash64(i) AS hi", "xxhash64(s, i) AS hsi"
    ).collect()
    assert len(got) == len(keys)
    for row in got:
        assert key_hash(row.s) == row.hs, row.s
        assert key_hash(row.s.encode("utf-8")) == row.hb, row.s
        assert key_hash(row.i) == row.hi, row.i
        assert key_hash((row.s, row.i)) == row.hsi, (row.s, row.i)
    nulls = spark.sql("SELECT xxhash64(CAST(NULL AS STRING)) AS h, xxhash64(true) AS t, xxhash64(1.5D) AS d").first()
    assert key_hash(None) == nulls.h
    assert key_hash(True) == nulls.t
    assert key_hash(1.5) == nulls.d
