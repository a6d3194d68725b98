"""Exact Spark partition control: a row with channel ``c`` lands in Spark partition ``c``.

Where the runtime moves records between Spark partitions, channel ``c`` must be
Spark partition ``c`` (a forward replay, for instance, relies on it). Spark's
``df.repartition(n, col)`` puts a row in partition
``pmod(murmur3(col), n)``, where ``murmur3`` is Spark SQL's ``hash()``
(Murmur3_x86_32, seed 42; for an IntegerType value ``hashInt(v, 42)``). That
is not ``c`` for ``col = c``, so we repartition on a *landing key* instead:

1. :func:`landing_values` gives, for a given ``n``, a table ``landing[c]`` of
   small non-negative ints with ``pmod(hash(landing[c]), n) == c``, found by
   trying ``v = 0, 1, 2, ...`` with a pure-Python :func:`murmur3_hash_int`
   that matches Spark bit for bit (about ``n * ln n`` tries, cached per ``n``).
2. :func:`exact_repartition` adds the column
   ``element_at(array(landing...), channel + 1)`` as an IntegerType and calls
   ``repartition(n, that column)``, then drops it. Spark's own hash sends every
   row of channel ``c`` to partition ``c``. The explicit ``n`` makes this a
   REPARTITION_BY_NUM shuffle, which adaptive query execution neither
   coalesces nor splits. Only operators after it that do not shuffle keep the
   placement, so apply it right before the per-partition processing.

The RDD alternative, ``rdd.map(lambda r: (r.channel, r)).partitionBy(n,
partitionFunc=lambda c: c)``, is exact as well (PySpark computes
``partitionFunc(key) % n`` in Python), but it pickles every row through Python
workers and back, leaves Arrow/Tungsten, is not available on a streaming
DataFrame outside ``foreachBatch`` and not at all under Spark Connect. The
runtime therefore uses the DataFrame form.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from ftlayer.acker.channels import validate_num_channels
from ftlayer.errors import PartitioningError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SPARK_HASH_SEED = 42
MAX_LANDING_CHANNELS = 1 << 16
"""Largest ``n`` :func:`landing_values` builds a table for (the table is an array literal)."""

LANDING_COLUMN = "__ftlayer_landing"

_M32 = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def murmur3_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``Murmur3_x86_32.hashInt(value, seed)``: Spark SQL ``hash(v)`` of an int column.

    Returns a signed 32-bit int. ``value`` must fit in a signed 32-bit int
    (Spark's IntegerType), else :class:`PartitioningError`.
    """
    if not -(1 << 31) <= value < (1 << 31):
        msg = f"murmur3_hash_int: {value} does not fit in a 32-bit int (Spark IntegerType)"
        raise PartitioningError(msg)
    k1 = (value & _M32) * _C1 & _M32
    k1 = _rotl32(k1, 15) * _C2 & _M32
    h1 = (seed & _M32) ^ k1
    h1 = (_rotl32(h1, 13) * 5 + 0xE6546B64) & _M32
    h1 ^= 4  # length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _M32
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


@lru_cache(maxsize=64)
def _landing_table(n: int) -> tuple[int, ...]:
    table: list[int | None] = [None] * n
    missing = n
    v = 0
    while missing:
        c = murmur3_hash_int(v) % n
        if table[c] is None:
            table[c] = v
            missing -= 1
        v += 1
    return tuple(x for x in table if x is not None)


def landing_values(n: int) -> list[int]:
    """``landing[c]`` for ``c in range(n)``: the smallest ``v >= 0`` with ``pmod(hash(v), n) == c``.

    ``hash`` is Spark SQL's ``hash()`` of ``v`` as an IntegerType, so
    ``repartition(n, lit(landing[c]))`` puts a row in Spark partition ``c``.
    Pure and cached per ``n``; ``1 <= n <= MAX_LANDING_CHANNELS``, else
    :class:`PartitioningError`.
    """
    n = validate_num_channels(n, "landing_values")
    if n > MAX_LANDING_CHANNELS:
        msg = f"landing_values: n={n} exceeds the supported maximum of {MAX_LANDING_CHANNELS}"
        raise PartitioningError(msg)
    return list(_landing_table(n))


def exact_repartition(df: DataFrame, channel_col: str, n: int, carry: Sequence[str] | None = None) -> DataFrame:
    """Repartition ``df`` into ``n`` partitions; a row with channel ``c`` lands in partition ``c``.

    ``channel_col`` is an integer column with values in ``[0, n)``. A null or
    out-of-range channel fails the Spark job with an error naming the value
    (raised on the executor, so it surfaces as a Spark exception). The result
    has the columns of ``df``, or only ``carry`` (in that order) when given: the
    others are dropped *before* the shuffle, so its rows do not carry them (the
    channel itself need not be among them). ``df`` must not have a column named
    :data:`LANDING_COLUMN`. Works on batch and streaming DataFrames.
    """
    from pyspark.sql import functions as F

    table = landing_values(n)
    if LANDING_COLUMN in df.columns:
        msg = f"exact_repartition: the DataFrame already has a column {LANDING_COLUMN!r}"
        raise PartitioningError(msg)
    channel = F.col(channel_col)
    landing = F.element_at(
        F.array(*[F.lit(v) for v in table]).cast("array<int>"), (channel + 1).cast("int")
    )
    bad = F.raise_error(
        F.concat(
            F.lit(f"exact_repartition: column {channel_col!r} has channel "),
            F.coalesce(channel.cast("string"), F.lit("NULL")),
            F.lit(f", outside [0, {n})"),
        )
    )
    in_range = channel.isNotNull() & (channel >= 0) & (channel < n)
    kept = list(df.columns if carry is None else carry)
    return (
        df.select(*kept, F.when(in_range, landing).otherwise(bad).alias(LANDING_COLUMN))
        .repartition(n, LANDING_COLUMN)
        .drop(LANDING_COLUMN)
    )
