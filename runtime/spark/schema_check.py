"""A DataFrame schema checked at ingest: a record that does not fit it is dead-lettered before Spark reads it.

Why: the typed FT source (:mod:`runtime.spark.typed_source`) fails a record whose value does not fit
the query's schema when it reads it; the record is then replayed up to ``max_replays`` times, with
backoff, and dead-lettered only after that. Its value never changes, so every replay fails the same
way: the budget and the backoff are spent on nothing, and the dead letter comes late. A source whose
records have a known schema can say so at ingest (``ftlayer.ingest(..., schema=...)``,
``SourceHandle.ingest``), and such a record is dead-lettered there at once, with the reason that
names its column, never persisted for processing.

Contract of :class:`SchemaCheck`:

- the same rules as the read: a payload is a misfit exactly when :func:`runtime.spark.payload_columns.
  decode_batch` would leave it out of a page (a non-dict for a schema of several columns, a value
  Arrow cannot convert to its column's type, a null in a non-nullable column), and the reason is the
  one the read would give. It is :func:`decode_batch` itself, run on the packed payloads of a batch,
  so the two cannot drift apart. A query that reads the source with the same schema therefore
  never fails a record for its shape; one that reads it with another schema still checks at read.
- the metadata column ``_ftlayer`` (``ftlayer.with_metadata``) is not part of the check: ingest
  gives every record its metadata.
- the values that fit, decoded, are kept: :meth:`SchemaCheck.with_columns` hands them to ingest,
  which stores them with their chunks (``ftlayer.records.chunk_columns``), and a query that reads
  with the same schema takes them from there instead of decoding the payloads again.
- cost: the read's decode, once more, per batch at ingest (its bulk path, about 1.3 µs a
  three-column record on this project's VM, when the whole batch fits; record by record when one
  does not). Sources without a schema pay nothing.
- pure: no Redis, no Spark session (a ``StructType`` in; a DDL string is parsed by
  :func:`runtime.spark.ddl.parse_schema`, without a JVM).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ftlayer.errors import ConfigError
from runtime.spark.payload_columns import arrow_schema, decode_batch, user_fields

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["SchemaCheck"]

_SAME_WORDS = "payload does not fit the schema: "  # decode_rows' own prefix for a payload that fails whole


class SchemaCheck:
    """``check(payloads)`` -> ``{index: reason}`` of the payloads that do not fit ``schema`` (module notes).

    An :class:`~runtime.driver.ingest.Ingestor` given one as ``check`` dead-letters those records with
    ``"ingest: does not fit the schema: <reason>"`` and persists the others.
    """

    def __init__(self, schema: StructType, *, keep_columns: bool = True) -> None:
        self.schema = user_fields(schema)
        self.keep_columns = keep_columns
        if not self.schema.fields:
            msg = f"a schema checked at ingest needs at least one column besides _ftlayer; got {schema.simpleString()}"
            raise ConfigError(msg)
        seen: set[str] = set()
        for name in self.schema.names:  # a record's keys name one column each (Spark's own parser allows twins)
            if name in seen:
                msg = (f"the schema {self.schema.simpleString()} names the column {name!r} twice: "
                       "a record's key fills one column")
                raise ConfigError(msg)
            seen.add(name)
        try:  # what the read hands Spark: a schema Arrow cannot hold is refused now, not at the first batch
            arrow_schema(self.schema)
        except Exception as exc:
            msg = f"the schema {self.schema.simpleString()} has no Arrow form: {type(exc).__name__}: {exc}"
            raise ConfigError(msg) from exc

    def __call__(self, payloads: Sequence[bytes]) -> dict[int, str]:
        return self.with_columns(payloads)[0]

    def with_columns(self, payloads: Sequence[bytes]) -> tuple[dict[int, str], Any]:
        """``(misfits, columns)``: the misfits as ``__call__`` gives them, and the values that fit as
        the read decodes them (a ``pyarrow.RecordBatch`` of the schema's columns, in order), which
        ingest keeps in their chunks (``ftlayer.records.chunk_columns``); columns None for no payloads,
        or if the check was made with ``keep_columns=False`` (a Topology source: its stages take Python
        values, so columns would only cost Redis memory)."""
        import numpy as np
        import pyarrow as pa

        if not payloads:
            return {}, None
        # a page as the FT source reads it, with each payload's position in the batch as its "sid"; the
        # payload column made from one join and the lengths' sums (no Arrow conversion per payload)
        n = len(payloads)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, payloads), dtype=np.int64, count=n), out=offsets[1:])
        column = pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets),
                                                              pa.py_buffer(b"".join(payloads))])
        raw = pa.RecordBatch.from_arrays([pa.array(np.arange(n, dtype=np.int64)), column], names=["sid", "payload"])
        columns, _, bad = decode_batch(raw, self.schema, "")
        return ({index: reason.removeprefix(_SAME_WORDS) for index, reason in bad.items()},
                columns if self.keep_columns else None)

    def __repr__(self) -> str:
        return f"SchemaCheck({self.schema.simpleString()})"
