"""Agreement with real Spark: fields routing, Murmur3 landing values, exact repartitioning."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ftlayer.errors import PartitioningError
from ftlayer.records.keyhash import key_hash
from partitioners import FieldsPartitioner, exact_repartition, landing_values
from partitioners.spark_exact import MAX_LANDING_CHANNELS, murmur3_hash_int

# Taken from Spark 4.3: SELECT hash(v) for an int v -- Murmur3_x86_32.hashInt(v, 42)
SPARK_HASH_INT = {
    0: 933211791,
    1: -559580957,
    -1: -1604776387,
    42: 29417773,
    2147483647: 133916647,
    -2147483648: 723455942,
}

LANDING_NS = [*range(1, 17), 64, 200]


def _random_keys(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E), (0xA0, 0x2FF), (0x400, 0x4FF), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF)]
    keys = ["", " ", "a", "\u00e9", "e\u0301", "\U0001f600", "\x00", "null", "\u0000\u0000"]
    while len(keys) < count:
        lo, hi = rng.choice(ranges)
        keys.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(0, 12))))
    return keys


# --- pure -------------------------------------------------------------------------------


def test_murmur3_known_spark_values() -> None:
    assert {v: murmur3_hash_int(v) for v in SPARK_HASH_INT} == SPARK_HASH_INT


@pytest.mark.parametrize("n", [1, 2, 5, 64, 200, 1000])
def test_landing_values_land_on_their_channel(n: int) -> None:
    table = landing_values(n)
    assert len(table) == n
    assert all(murmur3_hash_int(v) % n == c for c, v in enumerate(table))
    assert all(0 <= v < 2**31 for v in table)
    table[0] = -5  # the caller's copy; the cache is untouched
    assert landing_values(n)[0] != -5


def test_landing_values_limits() -> None:
    with pytest.raises(PartitioningError, match="landing_values: num_channels"):
        landing_values(0)
    with pytest.raises(PartitioningError, match="supported maximum"):
        landing_values(MAX_LANDING_CHANNELS + 1)
    with pytest.raises(PartitioningError, match="32-bit"):
        murmur3_hash_int(2**31)


# --- real Spark ---------------------------------------------------------------------------


@pytest.mark.spark
def test_fields_routing_matches_spark_pmod_xxhash64(spark: Any) -> None:
    ns = [1, 2, 3, 4, 7, 16, 200, 1009]
    keys = _random_keys(3000, seed=1234)
    df = spark.createDataFrame([(k,) for k in keys], "k string")
    rows = df.selectExpr("k", *[f"pmod(xxhash64(k), {n}) AS c{n}" for n in ns]).collect()
    assert len(rows) == len(keys)
    parts = {n: FieldsPartitioner(n) for n in ns}
    mismatches = [
        (row["k"], n, row[f"c{n}"])
        for row in rows
        for n in ns
        if parts[n].select(key_hash=key_hash(row["k"])) != [row[f"c{n}"]]
    ]
    assert not mismatches, mismatches[:5]


@pytest.mark.spark
def test_fields_routing_matches_spark_for_bigint_and_binary_keys(spark: Any) -> None:
    rng = random.Random(99)
    data = [
        (rng.randint(-(2**63), 2**63 - 1), rng.randbytes(rng.randint(0, 20))) for _ in range(500)
    ]
    data += [(0, b""), (-1, b"\x00"), (2**63 - 1, b"\xff" * 33), (-(2**63), b"a")]
    df = spark.createDataFrame(data, "i bigint, b binary")
    rows = df.selectExpr("i", "b", "pmod(xxhash64(i), 13) AS ci", "pmod(xxhash64(b), 13) AS cb")
    p = FieldsPartitioner(13)
    for row in rows.collect():
        assert p.select(key_hash=key_hash(row["i"])) == [row["ci"]]
        assert p.select(key_hash=key_hash(bytes(row["b"]))) == [row["cb"]]


@pytest.mark.spark
def test_murmur3_matches_spark_hash_of_int(spark: Any) -> None:
    rng = random.Random(7)
    values = [*SPARK_HASH_INT, *(rng.randint(-(2**31), 2**31 - 1) for _ in range(500))]
    df = spark.createDataFrame([(v,) for v in values], "v int")
    for row in df.selectExpr("v", "hash(v) AS h").collect():
        assert murmur3_hash_int(row["v"]) == row["h"], row


@pytest.mark.spark
def test_landing_values_match_spark_pmod_hash(spark: Any) -> None:
    data = [(n, c, v) for n in LANDING_NS for c, v in enumerate(landing_values(n))]
    df = spark.createDataFrame(data, "n int, c int, v int")
    rows = df.selectExpr("n", "c", "pmod(hash(v), n) AS got").collect()
    assert len(rows) == len(data)
    assert [(r["n"], r["c"]) for r in rows if r["got"] != r["c"]] == []


@pytest.mark.spark
@pytest.mark.parametrize("n", [1, 7, 64])
def test_exact_repartition_puts_channel_c_in_partition_c(spark: Any, n: int) -> None:
    from pyspark.sql import functions as F

    rng = random.Random(n)
    data = [(i, rng.randrange(n)) for i in range(40 * n)]
    df = spark.createDataFrame(data, "id bigint, channel bigint")
    out = exact_repartition(df, "channel", n)
    assert out.columns == ["id", "channel"]
    assert _shuffled_columns(out) == ["id", "channel", "__ftlayer_landing"]
    rows = out.withColumn("pid", F.spark_partition_id()).collect()
    assert sorted((r["id"], r["channel"]) for r in rows) == data
    assert [(r["id"], r["channel"], r["pid"]) for r in rows if r["pid"] != r["channel"]] == []
    assert out.rdd.getNumPartitions() == n


def _shuffled_columns(df: Any) -> list[str]:
    """The columns of the rows ``df``'s repartition shuffles (its optimized plan's
    RepartitionByExpression's input)."""
    node = df._jdf.queryExecution().optimizedPlan()
    while node.nodeName() != "RepartitionByExpression":
        node = node.children().apply(0)
    output = node.child().output()
    return [output.apply(i).name() for i in range(output.size())]


@pytest.mark.spark
def test_exact_repartition_carries_only_the_columns_asked_for(spark: Any) -> None:
    """``carry``: the shuffle's rows hold those columns alone (the channel too is dropped before it),
    and every row still lands in its channel's partition."""
    from pyspark.sql import functions as F

    n = 7
    data = [(i, i % n, i * 10) for i in range(80)]
    df = spark.createDataFrame(data, "id bigint, channel int, extra bigint")
    out = exact_repartition(df, "channel", n, carry=["extra", "id"])
    assert out.columns == ["extra", "id"]
    assert _shuffled_columns(out) == ["extra", "id", "__ftlayer_landing"]
    rows = out.withColumn("pid", F.spark_partition_id()).collect()
    assert sorted((r["id"], r["extra"], r["pid"]) for r in rows) == [(i, e, c) for i, c, e in data]


@pytest.mark.spark
def test_exact_repartition_rejects_out_of_range_channel(spark: Any) -> None:
    df = spark.createDataFrame([(0, 1), (1, 5)], "id int, ch int")
    with pytest.raises(Exception, match=r"column 'ch' has channel 5, outside \[0, 4\)"):
        exact_repartition(df, "ch", 4).collect()
    with pytest.raises(PartitioningError, match="already has a column"):
        exact_repartition(df.withColumn("__ftlayer_landing", df.id), "ch", 4)
