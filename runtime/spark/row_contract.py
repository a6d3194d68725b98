"""The row contracts: the columns of the rows the sources emit and the stages pass on, in one table.

Two contracts, each a tuple of ``(name, kind)`` columns:

- :data:`SOURCE_ROW`, what the FT source and the FT-off feed source emit, one row per source
  record: ``sid long, cid long, key_hash long, origin long, replay int, channel int, payload binary``.
- :data:`STAGE_ROW`, the rows between stages (a source's rows once the compiler adds ``src``
  and a zero ``delta``, every stage's output, the sink stage's input): ``src int, sid long, cid
  long, origin long, key_hash long, channel int, payload binary, delta long``.
- :data:`STAGE_INPUT`, the part of STAGE_ROW a stage reads (no ``key_hash``, no ``channel``): what
  a keyed exchange and a union pass on.

Every form a contract takes is generated here from that table: the Spark DDL string
(:meth:`RowContract.ddl`, for ``mapInArrow``), the Spark ``StructType`` (a data source's
``schema()``), the Arrow schema (what a source's or stage's batches carry) and the numpy dtype
of each fixed-width column (what a stage reads the columns as). A column added to the table
shows up in all four; tests/runtime/spark/test_row_contract.py checks that they agree with
one another and with Spark's and Arrow's own conversions.

The kinds are the Spark type table: :data:`KINDS` maps each kind to its Spark SQL name, Spark
type class, Arrow type and numpy dtype. ``pyspark`` and ``pyarrow`` are imported on first use.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ftlayer.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["KINDS", "SOURCE_ROW", "STAGE_INPUT", "STAGE_ROW", "Kind", "RowContract", "stage_row_additions"]


@dataclass(frozen=True)
class Kind:
    """One column type in each of its forms (names resolved in pyspark.sql.types, pyarrow, numpy)."""

    sql: str  # Spark SQL (DDL) name
    spark: str  # class in pyspark.sql.types
    arrow: str  # factory in pyarrow
    numpy: str | None  # numpy dtype name; None for a variable-width column


#: The Spark type table: every kind a contract column may have.
KINDS: dict[str, Kind] = {
    "int": Kind("int", "IntegerType", "int32", "int32"),
    "long": Kind("long", "LongType", "int64", "int64"),
    "binary": Kind("binary", "BinaryType", "binary", None),
}


@dataclass(frozen=True)
class RowContract:
    """The columns of one row form, ``(name, kind)`` in order, and every form generated from them."""

    columns: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        unknown = [k for _, k in self.columns if k not in KINDS]
        names = self.names
        if unknown or len(set(names)) != len(names):
            msg = f"a row contract needs distinct names and kinds among {sorted(KINDS)}; got {self.columns!r}"
            raise ConfigError(msg)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    def kind(self, name: str) -> Kind:
        """The kind of column ``name`` (KeyError if the contract has none)."""
        return KINDS[dict(self.columns)[name]]

    @property
    def ddl(self) -> str:
        """The Spark DDL string: ``"sid long, cid long, ..."``."""
        return ", ".join(f"{name} {KINDS[kind].sql}" for name, kind in self.columns)

    def struct_type(self) -> StructType:
        """The Spark ``StructType`` (every field nullable, as Spark parses :attr:`ddl`); a new one
        each call (a StructType is mutable: ``add``)."""
        from pyspark.sql import types

        return types.StructType([types.StructField(name, getattr(types, KINDS[kind].spark)())
                                 for name, kind in self.columns])

    @functools.cache  # noqa: B019 - a handful of frozen contracts; an Arrow schema is immutable
    def arrow_schema(self) -> Any:
        """The ``pyarrow.Schema`` (equal to Spark's own conversion of :meth:`struct_type`)."""
        import pyarrow as pa

        return pa.schema([pa.field(name, getattr(pa, KINDS[kind].arrow)()) for name, kind in self.columns])

    def numpy_dtype(self, name: str) -> Any:
        """The numpy dtype of fixed-width column ``name`` (ConfigError for a binary one)."""
        import numpy as np

        kind = self.kind(name)
        if kind.numpy is None:
            msg = f"column {name!r} ({kind.sql}) has no numpy dtype"
            raise ConfigError(msg)
        return np.dtype(kind.numpy)

    def numpy_dtypes(self) -> dict[str, Any]:
        """Every fixed-width column's numpy dtype, by name, in order."""
        return {name: self.numpy_dtype(name) for name, kind in self.columns if KINDS[kind].numpy is not None}

    def same_struct(self, schema: Any) -> bool:
        """Whether a Spark ``StructType`` has this contract's names and types, in order (nullability aside)."""
        return [(f.name, f.dataType) for f in schema.fields] == [(f.name, f.dataType) for f in self.struct_type()]


#: The rows a source emits (FT source and FT-off feed source alike).
SOURCE_ROW = RowContract((
    ("sid", "long"),  # source_record_id: the acker entry (tree) of the record
    ("cid", "long"),  # current_record_id: this record inside the tree
    ("key_hash", "long"),  # ftlayer.records.keyhash.key_hash of the key (xxhash64 seed 42)
    ("origin", "long"),  # source_record_id of the first attempt (kept on replay)
    ("replay", "int"),  # replay count: 0 for a first attempt
    ("channel", "int"),  # channel the record was appended to (= Spark partition)
    ("payload", "binary"),  # msgpack bytes
))

#: The rows between stages (runtime.spark.stages); a carrier row has a null payload.
STAGE_ROW = RowContract((
    ("src", "int"),  # index of the record's source in its topology
    ("sid", "long"),
    ("cid", "long"),  # 0 on a carrier row
    ("origin", "long"),  # rides along so sinks can deduplicate replays
    ("key_hash", "long"),  # filled by a stage before a keyed edge
    ("channel", "int"),  # pmod(key_hash, n) before a keyed edge: the exchange puts channel c in partition c
    ("payload", "binary"),  # msgpack bytes; null on a carrier row
    ("delta", "long"),  # the XOR this row carries to the sink
))


#: The STAGE_ROW columns a stage, a sink stage or a foreachBatch sink reads
#: (``runtime.spark.row_batch.decode_batch``): all but ``key_hash`` and ``channel``, which only route
#: a keyed exchange. So rows cross a keyed exchange (``partitioners.spark_exact.exact_repartition``'s
#: ``carry``) and a union with these columns alone: narrower shuffle rows, and fewer columns for the
#: JVM to write into the next stage's Arrow batches (its cost per row grows with the columns).
STAGE_INPUT = RowContract(tuple(c for c in STAGE_ROW.columns if c[0] not in ("key_hash", "channel")))


def stage_row_additions(src: int) -> dict[str, int]:
    """The STAGE_ROW columns a SOURCE_ROW row lacks, with their values for a row of source ``src``:
    its source index and a zero carried delta (the compiler's select and the fused read add them)."""
    return {"src": src, "delta": 0}  # tests/runtime/spark/test_row_contract.py: exactly the missing ones
