"""Payloads to typed columns: the msgpack value of each source record as a row of a user schema.

Contract of :func:`decode_batch` (used by the typed FT source's ``read()``):

- a payload that unpacks to a dict gives one row: field ``f`` of the schema
  takes ``value[f]`` (missing keys are null; extra keys are ignored); any
  other value fills a one-field schema's single column;
- a value that does not fit (a non-dict for a schema of several fields, a
  value Arrow cannot convert to the column's type without loss, a null in a
  non-nullable field, a payload that does not unpack) makes that record *bad*:
  it is left out of the batch and reported with a reason naming the column, so
  the caller can fail that record alone (replayed, then dead-lettered);
- a timestamp column's value may be a ``datetime``, epoch seconds (int or float) or an
  ISO 8601 string; a date column's a ``date`` or an ISO string. Naive datetimes are UTC.
  Inside an array, map or struct, Arrow converts them itself: a ``datetime`` or an int
  (microseconds), and an ISO string does not fit;
- a float with a fraction does not fit an integer type, at any depth
  (:mod:`runtime.spark.lossy_ints`: pyarrow would take ``2.5`` as ``2``); a whole one
  (``2.0``) does.
- the metadata column :data:`METADATA_COLUMN` (if the schema has it) is
  ``struct<sid, origin, replay, key_hash, source, lineage>`` of the record; ``lineage``
  is the record's lineage id (``ftlayer.records.lineage``: the same on every replay).

Cost: a page whose payloads all unpack to dicts whose values all fit (the common case) takes
the **bulk path**: its payloads, back to back in the page's Arrow binary column, are wrapped in
one msgpack array header and decoded in one call: first by msgspec into one Struct per record
(``serialization.payload_columns_fast``: used only where it provably gives msgpack's values, i.e. no
key outside the schema, no list or dict value, no ext -1 timestamp), else by one ``unpackb`` (the
same ext hooks and options as ``serialization.payload.unpack_payload``); each column is gathered by one map
(plus the conversion of a timestamp or date column) and converted by one ``pa.array``: about
1.3 µs per three-column record against 5.2 on the row path (``tests/runtime/spark/
test_payload_columns.py`` checks both give the same batch). Any page the bulk path cannot take
whole (a payload that is not a dict, a value that does not convert, a null in a non-nullable
column, a payload that does not unpack) goes through the **row path**, which unpacks record by
record and re-checks a refused column row by row, so each misfit is named and only it is left out.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from itertools import repeat
from typing import Any

from pyspark.sql.types import (
    DataType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from ftlayer.errors import SerializationError
from ftlayer.records.lineage import LINEAGE_CHARS, lineage_hex
from runtime.spark.arrow_codec import payload_run
from runtime.spark.lossy_ints import fractions
from runtime.spark.stored_columns import stored_columns
from serialization.payload import unpack_payload, unpack_run
from serialization.payload_columns_fast import unpack_run_columns

__all__ = ["METADATA_COLUMN", "METADATA_DDL", "arrow_schema", "decode_batch", "decode_rows", "metadata_type",
           "user_fields"]

METADATA_COLUMN = "_ftlayer"
METADATA_DDL = "sid long, origin long, replay int, key_hash long, source string, lineage string"


def metadata_type() -> StructType:
    """The type of the ``_ftlayer`` column."""
    # built by hand: StructType.fromDDL needs a SparkSession, and the source runner has none
    return StructType([
        StructField("sid", LongType()), StructField("origin", LongType()), StructField("replay", IntegerType()),
        StructField("key_hash", LongType()), StructField("source", StringType()),
        StructField("lineage", StringType()),
    ])


def user_fields(schema: StructType) -> StructType:
    """``schema`` without the metadata column."""
    return StructType([f for f in schema.fields if f.name != METADATA_COLUMN])


def lineage_column(raw: Any) -> Any:
    """The lineage ids (``ftlayer.records.lineage``) of a raw FT source page as an Arrow string column,
    built from one hex buffer (no per-row Python)."""
    import numpy as np
    import pyarrow as pa

    n = raw.num_rows
    data = lineage_hex(raw.column("origin").to_numpy(), raw.column("cid").to_numpy())
    offsets = np.arange(0, LINEAGE_CHARS * (n + 1), LINEAGE_CHARS, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def _to_datetime(v: Any) -> Any:
    if isinstance(v, bool):
        return v  # refused by Arrow, as it should be
    if isinstance(v, (int, float)):
        return _dt.datetime.fromtimestamp(v, _dt.timezone.utc)
    if isinstance(v, str):
        parsed = _dt.datetime.fromisoformat(v)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=_dt.timezone.utc)
    return v


def _to_date(v: Any) -> Any:
    return _dt.date.fromisoformat(v) if isinstance(v, str) else v


def _converter(dt: DataType) -> Callable[[Any], Any] | None:
    if isinstance(dt, (TimestampType, TimestampNTZType)):
        return _to_datetime
    if isinstance(dt, DateType):
        return _to_date
    return None


def arrow_schema(schema: StructType) -> Any:
    """The Arrow schema Spark checks a Python data source's batches against (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")



def decode_batch(raw: Any, schema: StructType, source: str, sections: Any = None
                 ) -> tuple[Any, list[int], dict[int, str]]:
    """Decode one FT source page (``pyarrow.RecordBatch`` of the raw source schema).

    Returns ``(batch, emitted sids, bad {sid: reason})``: ``batch`` has the
    columns of ``schema`` (in order) for the records that fit, ``emitted`` their
    source record ids in row order. The page's stored columns if its chunks have them for this
    schema (``sections``: ``PendingSpans.columns``, :mod:`runtime.spark.stored_columns`), else the
    bulk path if the whole page fits, else the row path (:func:`decode_rows`): the same result
    every way.
    """
    fields = user_fields(schema)
    arrow = arrow_schema(schema)
    names = [f.name for f in fields.fields]
    types = [arrow.field(n).type for n in names]
    columns = stored_columns(sections, arrow_schema(fields)) if sections else None
    if columns is None:
        columns = _bulk_columns(raw, fields, types, [_converter(f.dataType) for f in fields.fields])
    if columns is None:
        return decode_rows(raw, schema, source)
    batch = _assemble(raw, schema, arrow, dict(zip(names, columns, strict=True)), keep=None, source=source)
    return batch, raw.column("sid").to_pylist(), {}


def decode_rows(raw: Any, schema: StructType, source: str) -> tuple[Any, list[int], dict[int, str]]:
    """:func:`decode_batch` by the row path: each payload unpacked on its own, a refused column
    re-checked row by row, so that each record that does not fit is named and left out."""
    import pyarrow as pa

    fields = user_fields(schema)
    names = [f.name for f in fields.fields]
    arrow = arrow_schema(schema)
    types = [arrow.field(n).type for n in names]
    convs = [_converter(f.dataType) for f in fields.fields]
    sids: list[int] = raw.column("sid").to_pylist()
    bad: dict[int, str] = {}
    rows: list[list[Any] | None] = []
    for sid, payload in zip(sids, raw.column("payload").to_pylist(), strict=True):
        try:
            value = unpack_payload(payload)
        except Exception as exc:  # a payload that does not unpack: this record only
            bad[sid] = f"payload does not fit the schema: {type(exc).__name__}: {exc}"
            rows.append(None)
            continue
        row = [value.get(n) for n in names] if isinstance(value, dict) else [value]
        if len(row) != len(names):  # zip(strict=True) below would say so less clearly
            bad[sid] = f"payload is a {type(value).__name__}, not a dict of the {len(names)} columns"
            rows.append(None)
            continue
        for j, (field, conv) in enumerate(zip(fields.fields, convs, strict=True)):
            if conv is not None and row[j] is not None:
                try:  # a timestamp or date given as a number or a string
                    row[j] = conv(row[j])
                except Exception as exc:  # this record only, named by its column
                    bad[sid] = _misfit(field, f"{type(exc).__name__}: {exc}")
                    break
        rows.append(None if sid in bad else row)
    columns: list[Any] = []
    for j, (field, typ) in enumerate(zip(fields.fields, types, strict=True)):
        values = [None if r is None else r[j] for r in rows]
        try:
            col = pa.array(values, type=typ)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            col = None
            for i, v in enumerate(values):  # isolate the rows whose value does not fit this column
                try:
                    pa.array([v], type=typ)
                except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                    bad.setdefault(sids[i], _misfit(field, f"{type(exc).__name__}: {exc}"))
                    rows[i] = None
            values = [None if r is None else r[j] for r in rows]
            col = pa.array(values, type=typ)
        for i in fractions(values, typ):
            bad.setdefault(sids[i], _misfit(field, f"{values[i]!r} holds a float with a fraction, which an integer "
                                                   "type keeps only with loss"))
            rows[i] = None
        if not field.nullable:
            for i, v in enumerate(values):
                if v is None and rows[i] is not None:
                    bad[sids[i]] = f"column {field.name!r} is not nullable and the value is missing"
                    rows[i] = None
        columns.append(col)
    keep = [i for i, r in enumerate(rows) if r is not None]
    batch = _assemble(raw, schema, arrow, dict(zip(names, columns, strict=True)), keep=keep, source=source)
    return batch, [sids[i] for i in keep], bad


def _bulk_columns(raw: Any, fields: StructType, types: list[Any], convs: list[Callable[[Any], Any] | None]
                  ) -> list[Any] | None:
    """The page's user columns by the bulk path (module docstring), or None if any record needs the row path."""
    import pyarrow as pa

    n = raw.num_rows
    data = payload_run(raw.column("payload"))
    if data is None:
        return None
    names = [f.name for f in fields.fields]
    gathered = unpack_run_columns(data, n, names)  # msgspec, where it gives msgpack's values exactly
    if gathered is None:
        try:
            values = unpack_run(data, n)
        except SerializationError:  # the row path finds and names the record
            return None
        if n and set(map(type, values)) != {dict}:
            return None
        # every value is a dict (checked above): no bytecode per row
        gathered = [list(map(dict.get, values, repeat(name))) for name in names]
    out: list[Any] = []
    for field, typ, conv, values in zip(fields.fields, types, convs, gathered, strict=True):
        got = values
        try:
            if conv is not None:
                got = [x if x is None else conv(x) for x in got]
            column = pa.array(got, type=typ)
        except (pa.ArrowException, TypeError, ValueError, OverflowError, OSError):  # the row path names it
            return None
        # a null in a non-nullable column, or a float with a fraction pyarrow took as an int (2.5 as 2):
        # the row path names the record
        if (column.null_count and not field.nullable) or fractions(got, typ):
            return None
        out.append(column)
    return out


def _misfit(field: StructField, what: str) -> str:
    """A misfit's reason, named by its column."""
    return f"column {field.name!r} ({field.dataType.simpleString()}): {what}"


def _assemble(raw: Any, schema: StructType, arrow: Any, by_name: dict[str, Any], *, keep: list[int] | None,
              source: str) -> Any:
    """The output batch: rows ``keep`` (None: all) of the user columns, and the metadata column where
    ``schema`` has it."""
    import pyarrow as pa

    idx = None if keep is None else pa.array(keep, type=pa.int64())
    out_cols: list[Any] = []
    for f in schema.fields:
        if f.name == METADATA_COLUMN:
            column = pa.StructArray.from_arrays(
                [raw.column("sid"), raw.column("origin"), raw.column("replay"), raw.column("key_hash"),
                 pa.repeat(pa.scalar(source, pa.string()), raw.num_rows), lineage_column(raw)],
                fields=list(arrow.field(METADATA_COLUMN).type),
            )
        else:
            column = by_name[f.name]
        out_cols.append(column if idx is None else column.take(idx))
    return pa.RecordBatch.from_arrays(out_cols, schema=arrow)
