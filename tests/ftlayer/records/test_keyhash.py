from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftlayer.errors import KeyHashError
from ftlayer.records.keyhash import key_hash, key_hash_array, key_hashes


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


_KEYS = st.one_of(st.text(), st.binary(max_size=20), st.integers(-(2**63), 2**63 - 1), st.booleans(), st.none(),
                  st.floats(allow_nan=True), st.tuples(st.text(max_size=5), st.integers(0, 9)))


@given(st.lists(st.text(), max_size=50))
def test_a_batch_of_strings_hashes_as_key_by_key(keys: list[str]) -> None:
    got = key_hashes(keys)
    assert got == [key_hash(k) for k in keys]
    assert all(type(h) is int for h in got)


@given(st.lists(_KEYS, max_size=30))
def test_a_batch_of_any_keys_hashes_as_key_by_key(keys: list[object]) -> None:
    assert key_hashes(keys) == [key_hash(k) for k in keys]
    array = key_hash_array(keys)  # what ingest hands on to the channel choice and the frames
    assert str(array.dtype) == "int64" and array.tolist() == [key_hash(k) for k in keys]


def test_a_batch_keeps_known_values_and_str_subclasses() -> None:
    class Name(str):
        pass

    assert key_hashes(["hello", Name("hello"), "hello"]) == [-4367754540140381902] * 3
    assert key_hashes([]) == []


@pytest.mark.parametrize("bad", [{1, 2}, 2**70, "\ud800"])
def test_a_batch_raises_as_key_hash_does_for_the_first_bad_key(bad: object) -> None:
    with pytest.raises((KeyHashError, UnicodeEncodeError)) as one:
        key_hash(bad)
    with pytest.raises((KeyHashError, UnicodeEncodeError)) as batch:
        key_hashes(["a", bad, "b"])
    assert (type(batch.value), str(batch.value)) == (type(one.value), str(one.value))


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
    # ingest's batch path gives Spark's values too: strings (the batch fast path), ints, tuples
    assert key_hashes([row.s for row in got]) == [row.hs for row in got]
    assert key_hashes([row.i for row in got]) == [row.hi for row in got]
    assert key_hashes([(row.s, row.i) for row in got]) == [row.hsi for row in got]
    nulls = spark.sql("SELECT xxhash64(CAST(NULL AS STRING)) AS h, xxhash64(true) AS t, xxhash64(1.5D) AS d").first()
    assert key_hash(None) == nulls.h
    assert key_hash(True) == nulls.t
    assert key_hash(1.5) == nulls.d
